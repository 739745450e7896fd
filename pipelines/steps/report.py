"""The `report` step: report.json, report.md and the loss curves of training runs, with paired
comparisons."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.steps.base import Foreknown, Log, StepKind, field_names, missing_paths, parse
from train.engine.errors import RunConfigError
from vlbert.typed_config import EXISTING_PATHS


@dataclass
class ReportParams:
    runs: list[str] = dataclasses.field(metadata=EXISTING_PATHS)  # run folders: one alone is a list of one
    compare: list[list[str]] = dataclasses.field(default_factory=list)  # pairs [A, B]: B − A
    baseline: str | None = None  # every other run against it

    def pairs(self) -> list[tuple[str, str]]:
        against = [(self.baseline, run) for run in self.runs if run != self.baseline] if self.baseline else []
        return list(dict.fromkeys([*(tuple(pair) for pair in self.compare), *against]))


def report_params(params: dict[str, Any]) -> ReportParams:
    """The report's parameters; the runs that `compare` and `baseline` name must be among `runs`."""
    chosen = parse(ReportParams, params)
    for index, pair in enumerate(chosen.compare):
        if len(pair) != 2:  # the loader checked that it is a list of strings
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


def _verify_report(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    return missing_paths([(f"runs[{i}]", run) for i, run in enumerate(report_params(params).runs)], known)


KIND = StepKind(report, report_params, field_names(ReportParams), _verify_report, light=True)
