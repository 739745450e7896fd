"""The kinds of pipeline step, a registry of `StepKind` records.

A kind's `run(params, folder, resume, log)` does the step into its own folder; its `check(params)`
validates the parameters when the pipeline loads, before any step runs: it reads no file and needs
no earlier step's output, and raises RunConfigError naming the key at fault. Both go through one
parsing function per kind (built on the train config's field checker: known names, required ones,
types, `1e-5` read as the number it spells), so what was checked is what runs.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import inspect
import json
import operator
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from train.data.sources.refer import DATASETS as REFER_DATASETS
from train.engine.config import RunConfig, RunConfigError, checked_fields

Log = Callable[[str], None]

# Stands for the step's folder where parameters are checked without running the step.
CHECKED_OUT = "(the step's folder)"


@dataclass(frozen=True)
class StepKind:
    run: Callable[[dict[str, Any], Path, bool, Log], None]
    check: Callable[[dict[str, Any]], object]  # its value is unused: it raises RunConfigError or nothing


def did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _parse(cls: type, params: dict[str, Any]) -> Any:
    """`params` as an instance of dataclass `cls`, checked field by field."""
    return cls(**checked_fields(cls, params))


# ---- world ---------------------------------------------------------------------------------------

@dataclass
class WorldParams:
    images: int = 1000
    seed: int = 0


def world(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """The synthetic demo world: images, train/val annotations, corpus.txt."""
    from pipelines.world import generate_world

    chosen = _parse(WorldParams, params)
    generate_world(folder, chosen.images, chosen.seed)


# ---- extract -------------------------------------------------------------------------------------

# How a pipeline file (YAML) spells the types of run_extraction's parameters.
_YAML_TYPES: dict[Any, type] = {Path: str, collections.abc.Mapping: dict, tuple: list}


def _yaml_type(hint: Any) -> Any:
    """`hint` with every member spelled as YAML gives it: `str | Path | None` → `str | None`."""
    union = typing.get_origin(hint) in (types.UnionType, typing.Union)
    members = [typing.get_origin(arg) or arg for arg in (typing.get_args(hint) if union else (hint,))]
    return functools.reduce(operator.or_, dict.fromkeys(_YAML_TYPES.get(m, m) for m in members))


@functools.cache
def _extraction_params() -> type:
    """A dataclass of run_extraction's parameters but `out` (the step's folder), so that a new
    option of the job is a step option without a change here."""
    from extract.job import run_extraction

    hints = typing.get_type_hints(run_extraction)
    fields = [(p.name, _yaml_type(hints[p.name]))
              + (() if p.default is inspect.Parameter.empty else (dataclasses.field(default=p.default),))
              for p in inspect.signature(run_extraction).parameters.values() if p.name != "out"]
    return dataclasses.make_dataclass("ExtractParams", fields)


def _extraction_options(params: dict[str, Any]) -> dict[str, Any]:
    return dataclasses.asdict(_parse(_extraction_params(), params))


def extract(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A FeatureStore of every image under `images` (resumes by itself)."""
    from extract.job import run_extraction

    log(run_extraction(out=folder, **_extraction_options(params)).report())


# ---- vocabulary ----------------------------------------------------------------------------------

@dataclass
class VocabularyParams:
    world: str


def vocabulary(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A word-level vocabulary of every text of a world (for worlds without a BERT checkpoint)."""
    from train.data.vocabulary import write_world_vocabulary

    write_world_vocabulary(_parse(VocabularyParams, params).world, folder)


# ---- train ---------------------------------------------------------------------------------------

SEED_FOLDER = "seed-{}"  # a seeded run's folder inside its step's folder


def seed_folder(folder: Path, seed: int) -> Path:
    return folder / SEED_FOLDER.format(seed)


def _seeds(params: dict[str, Any]) -> list[int] | None:
    """A train step's `seeds`: distinct non-negative integers, each the `seed` of one run."""
    seeds = params.get("seeds")
    if seeds is None:
        return None
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                           for s in seeds):
        raise RunConfigError(f"seeds: expected a list of non-negative integers, found {seeds!r}")
    if len(set(seeds)) < len(seeds):
        raise RunConfigError(f"seeds: {seeds!r} repeats a seed")
    if "seed" in params:
        raise RunConfigError("seed and seeds: give one (seeds trains one run per seed)")
    return seeds


def _run_config(params: dict[str, Any], out: str, seed: int | None = None) -> RunConfig:
    """RunConfig fields, `detector`: a label (frozen, tuned) that reports show, and `seeds`, checked
    here; `seed` replaces the config's."""
    if "out" in params:
        raise RunConfigError("out: a step writes into its own folder under the pipeline's `out`; remove it")
    label = params.get("detector", "")
    if not isinstance(label, str):
        raise RunConfigError(f"detector: expected a label such as frozen or tuned, found {label!r}")
    _seeds(params)
    fields = {k: v for k, v in params.items() if k not in ("detector", "seeds")}
    return RunConfig.from_dict({**fields, "out": out, **({} if seed is None else {"seed": seed})})


def train(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A training run (train.engine.RunConfig fields); with `seeds`, one run per seed, each in
    `seed-<s>/` of the step's folder."""
    from train.engine.trainer import Trainer

    seeds = _seeds(params)
    runs = [(folder, None)] if seeds is None else [(seed_folder(folder, seed), seed) for seed in seeds]
    for out, seed in runs:
        if seed is not None:
            log(f"seed {seed}")
        Trainer(_run_config(params, str(out), seed), log=log).fit(resume=resume)


# ---- prepare -------------------------------------------------------------------------------------

@dataclass
class PrepareParams:
    """`vlbert data prepare`'s arguments; a prepare step's other keys are the source's options."""

    source: str
    root: str
    images: str | None = None
    max_missing: float | None = None


def _preparation(params: dict[str, Any]) -> tuple[PrepareParams, dict[str, Any]]:
    """The checked arguments and the source's options (names checked against the source's; values are
    the source's to check)."""
    from train.data.sources import SOURCES

    names = {spec.name for spec in dataclasses.fields(PrepareParams)}
    chosen = _parse(PrepareParams, {k: v for k, v in params.items() if k in names})
    if chosen.source not in SOURCES:
        raise RunConfigError(f"source: {chosen.source!r} is not a known source{did_you_mean(chosen.source, SOURCES)}"
                             f"; known: {', '.join(sorted(SOURCES))}")
    options = {k: v for k, v in params.items() if k not in names}
    known = [*names, *SOURCES[chosen.source].options]
    unknown = [name for name in options if name not in known]
    if unknown:
        raise RunConfigError(f"{unknown[0]}: not an option of source {chosen.source}{did_you_mean(unknown[0], known)}; "
                             f"it takes {', '.join(known)}")
    return chosen, options


def prepare(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A published dataset prepared into the project's annotation files (starts again when resumed)."""
    from train.data.prepare import prepare_dataset
    from train.data.sources import SOURCES

    chosen, options = _preparation(params)
    prepare_dataset(SOURCES[chosen.source], chosen.root, folder, chosen.images, chosen.max_missing, log, **options)


# ---- evaluate ------------------------------------------------------------------------------------

@dataclass
class EvaluateParams:
    """`vlbert evaluate BENCHMARK`'s arguments; which of them a benchmark needs is in BENCHMARKS."""

    benchmark: str
    predictions: list[str]  # vcr: the Q→A and QA→R runs' files, merged by annot_id
    annotations: str | None = None  # vqa2: the annotations JSON; vcr: val.jsonl
    questions: str | None = None  # vqa2
    data: str | None = None  # refcoco*: the refer toolkit's DATA folder
    split: str | None = None  # refcoco*


@dataclass(frozen=True)
class Benchmark:
    needs: tuple[str, ...]
    score: Callable[[EvaluateParams, Path], dict[str, Any]]  # also writes what it merged into the folder


def _score_vqa2(params: EvaluateParams, folder: Path) -> dict[str, Any]:
    from train.evaluation.vqa2 import evaluate_vqa2

    return evaluate_vqa2(params.questions, params.annotations, params.predictions[0])


def _score_vcr(params: EvaluateParams, folder: Path) -> dict[str, Any]:
    from train.evaluation.vcr import evaluate_vcr, merge_vcr_predictions, write_vcr_csv

    write_vcr_csv(folder / "predictions.csv", merge_vcr_predictions(params.predictions))
    return evaluate_vcr(params.annotations, folder / "predictions.csv")


def _score_refer(dataset: str) -> Callable[[EvaluateParams, Path], dict[str, Any]]:
    def score(params: EvaluateParams, folder: Path) -> dict[str, Any]:
        from train.evaluation.refer import evaluate_refer

        return evaluate_refer(params.data, dataset, params.split, params.predictions[0])
    return score


BENCHMARKS: dict[str, Benchmark] = {
    "vqa2": Benchmark(("questions", "annotations"), _score_vqa2),
    "vcr": Benchmark(("annotations",), _score_vcr),
    **{name: Benchmark(("data", "split"), _score_refer(name)) for name in REFER_DATASETS},
}


def _evaluation(params: dict[str, Any]) -> EvaluateParams:
    chosen = _parse(EvaluateParams, params)
    benchmark = BENCHMARKS.get(chosen.benchmark)
    if benchmark is None:
        raise RunConfigError(f"benchmark: {chosen.benchmark!r} is not one of {', '.join(BENCHMARKS)}"
                             f"{did_you_mean(chosen.benchmark, BENCHMARKS)}")
    missing = [name for name in benchmark.needs if getattr(chosen, name) is None]
    if missing or not chosen.predictions:
        raise RunConfigError(f"benchmark {chosen.benchmark}: needs {', '.join(missing or ['predictions'])}")
    return chosen


def evaluate(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """Predictions scored as `vlbert evaluate` scores them, into scores.json."""
    chosen = _evaluation(params)
    scores = BENCHMARKS[chosen.benchmark].score(chosen, folder)
    (folder / "scores.json").write_text(json.dumps(scores, indent=1))
    log(f"{chosen.benchmark}: {json.dumps(scores)}")


# ---- report --------------------------------------------------------------------------------------

@dataclass
class ReportParams:
    runs: list[str]
    compare: list[list[str]] = dataclasses.field(default_factory=list)  # pairs [A, B]: B − A
    baseline: str | None = None  # every other run against it

    def pairs(self) -> list[tuple[str, str]]:
        against = [(self.baseline, run) for run in self.runs if run != self.baseline] if self.baseline else []
        return list(dict.fromkeys([*(tuple(pair) for pair in self.compare), *against]))


def report_params(params: dict[str, Any]) -> ReportParams:
    """The report's parameters; the runs that `compare` and `baseline` name must be among `runs`."""
    chosen = _parse(ReportParams, params)
    for index, pair in enumerate(chosen.compare):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(run, str) for run in pair)):
            raise RunConfigError(f"compare[{index}]: expected a pair [RUN_A, RUN_B] of run folders, found {pair!r}")
    named = [(f"compare[{i}][{j}]", run) for i, pair in enumerate(chosen.compare) for j, run in enumerate(pair)]
    for where, run in named + ([("baseline", chosen.baseline)] if chosen.baseline else []):
        if run not in chosen.runs:
            raise RunConfigError(f"{where}: {run} is not one of `runs`")
    return chosen


def report(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """report.json, report.md and the loss curves of `runs`, with paired comparisons (`compare`, `baseline`)."""
    from pipelines.report import write_report

    chosen = report_params(params)
    for path in write_report(chosen.runs, folder, chosen.pairs()):
        log(f"wrote {path.resolve()}")


KINDS: dict[str, StepKind] = {
    "world": StepKind(world, functools.partial(_parse, WorldParams)),
    "prepare": StepKind(prepare, _preparation),
    "extract": StepKind(extract, _extraction_options),
    "vocabulary": StepKind(vocabulary, functools.partial(_parse, VocabularyParams)),
    "train": StepKind(train, functools.partial(_run_config, out=CHECKED_OUT)),
    "evaluate": StepKind(evaluate, _evaluation),
    "report": StepKind(report, report_params),
}
