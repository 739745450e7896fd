"""The kinds of pipeline step: each takes its resolved parameters and its own output folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

Log = Callable[[str], None]


def world(params: dict, folder: Path, resume: bool, log: Log) -> None:
    """The synthetic demo world: images, train/val annotations, corpus.txt."""
    from pipelines.world import generate_world

    generate_world(folder, int(params.get("images", 1000)), int(params.get("seed", 0)))


def extract(params: dict, folder: Path, resume: bool, log: Log) -> None:
    """A FeatureStore of every image under `images` (resumes by itself)."""
    from extract.job import run_extraction

    options = {k: v for k, v in params.items() if k not in ("images", "detector")}
    summary = run_extraction(params["images"], folder, params.get("detector", "butd-vg"), **options)
    log(summary.report())


def vocabulary(params: dict, folder: Path, resume: bool, log: Log) -> None:
    """A word-level vocabulary of every text of a world (for worlds without a BERT checkpoint)."""
    from train.data.vocabulary import write_world_vocabulary

    write_world_vocabulary(params["world"], folder)


def train(params: dict, folder: Path, resume: bool, log: Log) -> None:
    """A training run (train.engine.RunConfig fields); `detector: frozen|tuned` labels it in reports."""
    from train.engine.config import RunConfig
    from train.engine.trainer import Trainer

    values = {k: v for k, v in params.items() if k != "detector"}
    Trainer(RunConfig.from_dict({**values, "out": str(folder)}), log=log).fit(resume=resume)


def report(params: dict, folder: Path, resume: bool, log: Log) -> None:
    from pipelines.report import write_report

    for path in write_report(params["runs"], folder):
        log(f"wrote {path.resolve()}")


KINDS: dict[str, Callable[..., Any]] = {
    "world": world, "extract": extract, "vocabulary": vocabulary, "train": train, "report": report,
}
