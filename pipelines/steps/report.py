"""The `report` step: report.json, report.md and the loss curves of training runs, with paired
comparisons, and report.html, the page of the whole pipeline run (pipelines/report/page.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.steps.base import Foreknown, Log, StepKind, field_names, missing_paths, parse
from train.engine.errors import RunConfigError
from vlbert.utils.typed_config import EXISTING_PATHS


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
    """report.json, report.md and the loss curves of `runs`, with paired comparisons (`compare`, `baseline`),
    and report.html of the pipeline run the step's folder is in."""
    from pipelines.report.page import HTML_FILE, write_html_report
    from pipelines.report.summary import write_report

    chosen = report_params(params)
    for path in write_report(chosen.runs, folder, chosen.pairs()):
        log(f"wrote {path.resolve()}")
    # The page of the whole run, as far as it got: `vlbert pipeline report` rebuilds it later.
    write_html_report(folder.parent, folder / HTML_FILE, runs=chosen.runs, pairs=chosen.pairs(), writer=folder.name)
    log(f"wrote {(folder / HTML_FILE).resolve()}")


def rebuild_page(pipeline) -> tuple[Path, list[str]]:
    """report.html of a loaded pipeline's run, in its report step's folder (the output folder itself
    when it has none, showing every train step); what is missing from it, one line each."""
    from pipelines.report.page import HTML_FILE, write_html_report
    from pipelines.runner import declare_out

    declare_out(pipeline)  # apart from the run's inputs, and no picture written through a symlink out of it
    step = next((step for step in pipeline.steps if step.kind == "report"), None)
    page = (step.folder if step is not None else pipeline.out) / HTML_FILE
    if step is None:
        return page, write_html_report(pipeline.out, page, pipeline)
    chosen = report_params(step.params)
    return page, write_html_report(pipeline.out, page, pipeline, chosen.runs, chosen.pairs())


def _verify_report(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    return missing_paths([(f"runs[{i}]", run) for i, run in enumerate(report_params(params).runs)], known)


KIND = StepKind(report, report_params, field_names(ReportParams), _verify_report, light=True)
