"""The `extract` step: a FeatureStore of a folder of images (`extract.job.run_extraction`), in one
process or in `shards` processes whose closing check finds every image stored or failed."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extract.extraction_config import ExtractionConfig, JobError
from pipelines.steps.base import (Foreknown, Layout, Log, StepKind, device_problems, field_names, missing_paths,
                                  parse, takes_gpu)
from train.engine.errors import RunConfigError
from vlbert.utils.errors import UserError
from vlbert.utils.typed_config import at_least


@dataclass(frozen=True)
class ExtractStep(ExtractionConfig):
    """An extract step's keys: the extraction's settings (its store is the step's folder), and the processes
    that share it out."""

    # processes (array jobs under Slurm), each extracting `shard=(i, shards)` into the store
    shards: int = dataclasses.field(default=1, metadata=at_least(1))

    def __post_init__(self) -> None:
        if self.shards > 1 and self.shard is not None:
            raise RunConfigError("shard and shards: give one (shards runs every shard, each in a process of its own)")
        try:
            super().__post_init__()
        except JobError as exc:  # the pipeline's error: it names the step
            raise RunConfigError(str(exc)) from None

    def extraction(self, shard: tuple[int, int] | None = None) -> ExtractionConfig:
        """The job of this step's process: of shard `shard` of `shards`, or the step's whole."""
        settings = {spec.name: getattr(self, spec.name) for spec in dataclasses.fields(ExtractionConfig)}
        return ExtractionConfig(**{**settings, **({"shard": shard} if shard is not None else {})})


def _extract_step(params: dict[str, Any]) -> ExtractStep:
    """The step's parameters, typed and in range (as `vlbert extract` checks them)."""
    return parse(ExtractStep, params)


def _extract_layout(params: dict[str, Any]) -> Layout:
    shards = params.get("shards", 1)
    return Layout(shards=shards if isinstance(shards, int) else 1, gpu=takes_gpu(params.get("device", "cpu")))


def extract(params: dict[str, Any], folder: Path, resume: bool, log: Log, shard: tuple[int, int] | None = None) -> None:
    """A FeatureStore of every image under `images` (resumes by itself); with `shard`, that shard's."""
    from extract.job import run_extraction

    log(run_extraction(_extract_step(params).extraction(shard), folder).report())


def _close_extract(params: dict[str, Any], folder: Path, log: Log) -> None:
    """After every shard: each image of the job is in the store or among its failures."""
    from extract.job import ExtractionIncomplete, images_not_in_store

    step = _extract_step(params)
    missing = images_not_in_store(step.images, folder, step.boxes, step.image_list)
    if missing:
        raise ExtractionIncomplete(f"{folder}: {len(missing)} image(s) (or tar shards) of the job are neither stored "
                                   f"nor failures (e.g. {missing[0]!r}): a shard stopped early; run the step again to "
                                   "finish them")
    log(f"{folder}: every shard complete")


def _verify_extract(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    """Paths, device and precision, and the detector: a preset or a YAML file of ours (whose feature
    size the store will have, whose res5 runs in the res5 layout, and whose precision the speed paths
    apply to), or another backend's config file (`d2:CONFIG.yaml`)."""
    from extract.backends import BACKENDS
    from extract.config import ConfigError
    from extract.modeling.res5_layouts import Res5LayoutError, res5_layout
    from extract.modeling.speed_paths import SpeedPathError, speed_paths
    from extract.presets import load_config
    from extract.shards import find_shards, names_shards

    step = _extract_step(params)
    images = step.images
    problems = missing_paths([(name, getattr(step, name)) for name in ("weights", "boxes", "image_list")], known)
    if not (known.checkable(images) and names_shards(images)):
        problems = missing_paths([("images", images)], known) + problems
    else:
        try:
            find_shards(images)  # a pattern of tar shards that matches none
        except UserError as exc:
            problems.insert(0, str(exc))
    if not problems:
        problems += _shard_problems(step, known)
    problems += device_problems(step.device, [step.precision], known)
    detector = step.detector
    prefix = next(backend.prefix for backend in BACKENDS if detector.startswith(backend.prefix))
    if prefix:
        return problems + missing_paths([("detector", detector[len(prefix):])], known)
    try:
        speed_paths(step.speed_paths, step.precision)
    except SpeedPathError as exc:
        problems.append(str(exc))
    if known.checkable(detector):
        try:
            cfg = load_config(detector, step.overrides)
            known.feature_sizes[folder] = cfg.feature_dim
            res5_layout(step.res5_layout, cfg)
        except (ConfigError, Res5LayoutError) as exc:
            problems.append(str(exc))  # it names the detector
    return problems


def _shard_problems(step: ExtractStep, known: Foreknown) -> list[str]:
    """More shards than the job has images to share out, where they can be counted at load (the images
    are no earlier step's output; a boxes file's entries are not counted): more would only start
    processes with nothing to do. Counting stops past `shards`, so it takes no longer than that."""
    from extract.images import count_images
    from extract.shards import find_shards, names_shards

    images, listed, shards = step.images, step.image_list, step.shards
    if shards == 1 or not known.checkable(images) or step.boxes is not None:
        return []
    if names_shards(images):  # each process reads whole tar shards
        count, what = len(find_shards(images)[1]), f"tar shards of {images}"
    elif listed is not None:
        if not known.checkable(listed):
            return []
        count, what = _count_lines(Path(listed), shards), f"images the list {listed} names"
    elif Path(images).is_dir():
        count, what = count_images(images, shards), f"images under {images}"
    else:
        return []
    # None at all: the job says so when it starts
    return [f"shards {shards}: more than the {count} {what}: at most {count}"] if 0 < count < shards else []


def _count_lines(path: Path, most: int) -> int:
    """The lines of text file `path` that are not blank, counted up to `most` + 1."""
    with path.open("rb") as file:
        return sum(1 for _ in itertools.islice((line for line in file if line.strip()), most + 1))


KIND = StepKind(extract, _extract_step, field_names(ExtractStep), _verify_extract, layout=_extract_layout,
                close=_close_extract)
