"""The `prepare` step: a benchmark's published files prepared into the project's annotation schema
(`vlbert data prepare`); its keys beyond source, root, images and max_missing are the source's options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.steps.base import Foreknown, Log, StepKind, missing_paths, parse, registered
from train.engine.errors import RunConfigError


@dataclass
class PrepareParams:
    """`vlbert data prepare`'s arguments; a prepare step's other keys are its source's options."""

    source: str
    root: str
    images: str | None = None
    max_missing: float | None = None


def _preparation(params: dict[str, Any]) -> tuple[PrepareParams, dict[str, Any]]:
    """The checked arguments and the source's options given, checked as train/data/sources declares them."""
    from train.data.sources import SOURCES

    declared = SOURCES[registered(params, "source", SOURCES)].options
    fields = [(option.name, (str if option.type is Path else option.type) | None, dataclasses.field(default=None))
              for option in declared]
    chosen = parse(dataclasses.make_dataclass("SourceParams", fields, bases=(PrepareParams,)), params)
    options = {option.name: getattr(chosen, option.name) for option in declared
               if getattr(chosen, option.name) is not None}
    for option in declared:
        if option.minimum is not None and options.get(option.name, option.minimum) < option.minimum:
            raise RunConfigError(f"{option.name}: expected at least {option.minimum}, found {options[option.name]}")
    return chosen, options


def _prepare_fields(params: dict[str, Any]) -> list[str]:
    from train.data.sources import SOURCES

    source = SOURCES.get(params["source"]) if isinstance(params.get("source"), str) else None
    declared = source.options if source else ()
    return [spec.name for spec in dataclasses.fields(PrepareParams)] + [option.name for option in declared]


def _verify_prepare(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    chosen, _ = _preparation(params)
    return missing_paths([("root", chosen.root), ("images", chosen.images)], known)


def prepare(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A published dataset prepared into the project's annotation files (starts again when resumed)."""
    from train.data.prepare import prepare_dataset
    from train.data.sources import SOURCES

    chosen, options = _preparation(params)
    prepare_dataset(SOURCES[chosen.source], chosen.root, folder, chosen.images, chosen.max_missing, log, **options)


KIND = StepKind(prepare, _preparation, _prepare_fields, _verify_prepare, light=True)
