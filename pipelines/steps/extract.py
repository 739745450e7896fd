"""The `extract` step: a FeatureStore of a folder of images (`extract.job.run_extraction`), in one
process or in `shards` processes whose closing check finds every image stored or failed."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import itertools
import operator
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.steps.base import (Foreknown, Layout, Log, StepKind, device_problems, field_names, missing_paths,
                                  parse, takes_gpu)
from train.engine.errors import RunConfigError
from vlbert.utils.errors import UserError
from vlbert.utils.typed_config import at_least


# How a pipeline file (YAML) spells the types of run_extraction's parameters.
_YAML_TYPES: dict[Any, type] = {Path: str, collections.abc.Mapping: dict, tuple: list}


def _yaml_type(hint: Any) -> Any:
    """`hint` with every member spelled as YAML gives it: `str | Path | None` → `str | None`."""
    union = typing.get_origin(hint) in (types.UnionType, typing.Union)
    members = [typing.get_origin(arg) or arg for arg in (typing.get_args(hint) if union else (hint,))]
    return functools.reduce(operator.or_, dict.fromkeys(_YAML_TYPES.get(m, m) for m in members))


@dataclass
class ExtractExtras:
    """An extract step's keys beyond run_extraction's parameters."""

    # processes (array jobs under Slurm), each extracting `shard=(i, shards)` into the store
    shards: int = dataclasses.field(default=1, metadata=at_least(1))


EXTRACT_EXTRAS = tuple(spec.name for spec in dataclasses.fields(ExtractExtras))


@functools.cache
def _extraction_params() -> type:
    """A dataclass of run_extraction's parameters but `out` (the step's folder), and ExtractExtras, so
    that a new option of the job is a step option without a change here."""
    from extract.job import run_extraction

    hints = typing.get_type_hints(run_extraction)
    fields = [(p.name, _yaml_type(hints[p.name]))
              + (() if p.default is inspect.Parameter.empty else (dataclasses.field(default=p.default),))
              for p in inspect.signature(run_extraction).parameters.values() if p.name != "out"]
    fields += [(spec.name, spec.type, dataclasses.field(default=spec.default, metadata=spec.metadata))
               for spec in dataclasses.fields(ExtractExtras)]
    return dataclasses.make_dataclass("ExtractParams", fields)


def _extraction_options(params: dict[str, Any]) -> dict[str, Any]:
    """run_extraction's arguments (without ExtractExtras), typed and in range (as run_extraction checks them)."""
    from extract.job import JobError, check_arguments

    chosen = dataclasses.asdict(parse(_extraction_params(), params))
    if chosen["shards"] > 1 and chosen["shard"] is not None:
        raise RunConfigError("shard and shards: give one (shards runs every shard, each in a process of its own)")
    options = {name: value for name, value in chosen.items() if name not in EXTRACT_EXTRAS}
    try:
        check_arguments(options)
    except JobError as exc:
        raise RunConfigError(str(exc)) from None
    return options


def _extract_layout(params: dict[str, Any]) -> Layout:
    shards = params.get("shards", 1)
    return Layout(shards=shards if isinstance(shards, int) else 1, gpu=takes_gpu(params.get("device", "cpu")))


def extract(params: dict[str, Any], folder: Path, resume: bool, log: Log, shard: tuple[int, int] | None = None) -> None:
    """A FeatureStore of every image under `images` (resumes by itself); with `shard`, that shard's."""
    from extract.job import run_extraction

    options = _extraction_options(params)
    if shard is not None:
        options["shard"] = shard
    log(run_extraction(out=folder, **options).report())


def _close_extract(params: dict[str, Any], folder: Path, log: Log) -> None:
    """After every shard: each image of the job is in the store or among its failures."""
    from extract.job import ExtractionIncomplete, images_not_in_store

    options = _extraction_options(params)
    missing = images_not_in_store(options["images"], folder, options["boxes"], options["image_list"])
    if missing:
        raise ExtractionIncomplete(f"{folder}: {len(missing)} image(s) (or tar shards) of the job are neither stored "
                                   f"nor failures (e.g. {missing[0]!r}): a shard stopped early; run the step again to "
                                   "finish them")
    log(f"{folder}: every shard complete")


def _verify_extract(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    """Paths, device and precision, and the detector: a preset or a YAML file of ours (whose feature
    size the store will have, and whose res5 runs in the res5 layout), or another backend's config file
    (`d2:CONFIG.yaml`)."""
    from extract.backends import BACKENDS
    from extract.config import ConfigError
    from extract.modeling.res5_layouts import Res5LayoutError, res5_layout
    from extract.presets import load_config
    from extract.shards import find_shards, names_shards

    options = _extraction_options(params)
    images = options["images"]
    problems = missing_paths([(name, options[name]) for name in ("weights", "boxes", "image_list")], known)
    if not (known.checkable(images) and names_shards(images)):
        problems = missing_paths([("images", images)], known) + problems
    else:
        try:
            find_shards(images)  # a pattern of tar shards that matches none
        except UserError as exc:
            problems.insert(0, str(exc))
    if not problems:
        problems += _shard_problems(options, _extract_layout(params).shards, known)
    problems += device_problems(options["device"], [options["precision"]], known)
    detector = options["detector"]
    prefix = next(backend.prefix for backend in BACKENDS if detector.startswith(backend.prefix))
    if prefix:
        return problems + missing_paths([("detector", detector[len(prefix):])], known)
    if known.checkable(detector):
        try:
            cfg = load_config(detector, options["overrides"])
            known.feature_sizes[folder] = cfg.feature_dim
            res5_layout(options["res5_layout"], cfg)
        except (ConfigError, Res5LayoutError) as exc:
            problems.append(str(exc))  # it names the detector
    return problems


def _shard_problems(options: dict[str, Any], shards: int, known: Foreknown) -> list[str]:
    """More shards than the job has images to share out, where they can be counted at load (the images
    are no earlier step's output; a boxes file's entries are not counted): more would only start
    processes with nothing to do. Counting stops past `shards`, so it takes no longer than that."""
    from extract.images import count_images
    from extract.shards import find_shards, names_shards

    images, listed = options["images"], options["image_list"]
    if shards == 1 or not known.checkable(images) or options["boxes"] is not None:
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


KIND = StepKind(extract, _extraction_options, lambda params: field_names(_extraction_params())(params),
                _verify_extract, layout=_extract_layout, close=_close_extract)
