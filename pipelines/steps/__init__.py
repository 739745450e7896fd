"""The kinds of pipeline step: one module each (world, prepare, extract, vocabulary, train, evaluate, analyze,
report), whose `KIND` record (`StepKind`, pipelines/steps/base.py) `KINDS` gives by name. A kind's
module is imported when its kind is first asked for, so a step's process loads only its own kind (a
world or report step no torch). A new kind is one module and one entry here."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from pipelines.steps.base import CHECKED_OUT, Foreknown, Layout, StepKind

MODULES = {"world": "world", "prepare": "prepare", "extract": "extract", "vocabulary": "vocabulary",
           "train": "train", "evaluate": "evaluate", "analyze": "analyze", "report": "report"}


class Kinds(Mapping[str, StepKind]):
    """The kinds by name, each module imported on first use."""

    def __getitem__(self, name: str) -> StepKind:
        return importlib.import_module(f"{__name__}.{MODULES[name]}").KIND

    def __iter__(self) -> Iterator[str]:
        return iter(MODULES)

    def __len__(self) -> int:
        return len(MODULES)


KINDS = Kinds()

__all__ = ["CHECKED_OUT", "KINDS", "Foreknown", "Layout", "StepKind"]
