"""What each step of a pipeline run did and when: the record every step keeps, whatever runs it
(`step.json`: when it started, for how long, with how many threads or GPUs), and its state as its
executor says it (`Executor.status`, what `vlbert pipeline status` shows: the executor's account of
what it launched, then each step's folder), so that a Slurm run's page reads as a local run's.

A step's state in the run: `done` (it ran in this run and finished), `up to date` (done in an
earlier run, skipped in this one), `failed`, `not run` (it reads a step that failed, its job ended
before it ran, or nothing started it), `unfinished` (started, neither done nor failed: running, or
stopped). A step is in this run when the executor's state file names it (it launched the step, or
decided not to run it).

Where the pipeline file is not at hand (the report step writing its page while the run goes on), the
steps are those the step folders' records and the state file name, each with the kind, parameters
and inputs its record holds. A record that cannot be read, or a time in it that is no time, is named
on the step's row instead of failing the page.
"""

from __future__ import annotations

import math
import reprlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipelines import STEP_FILE
from pipelines.execution import FILES, LOG_FILE, RecordUnreadable, Step, read_stamp
from pipelines.executors import executor_of
from pipelines.executors.base import State, StepStatus, read_run
from pipelines.runner import Pipeline

DONE, UP_TO_DATE, FAILED, NOT_RUN, UNFINISHED = "done", "up to date", "failed", "not run", "unfinished"
# The executor's states of a step that did not run in this run, whatever its folder holds
UNRUN = (State.NOT_RUN, State.CANCELLED)
# The executor's states whose detail says why the step is not done (a running step's is its progress)
EXPLAINED = (*UNRUN, State.FAILED, State.OUTDATED, State.QUEUED)


@dataclass
class StepRun:
    name: str
    folder: Path
    kind: str  # "" when the step never wrote its record
    state: str
    start: float | None = None  # seconds since the epoch
    end: float | None = None
    threads: int | None = None
    gpus: str = ""  # the devices it saw (CUDA_VISIBLE_DEVICES), "" for none
    processes: int = 1
    executor: str = ""
    reason: str = ""  # why it failed or was not run, or what of its record cannot be read

    @property
    def log(self) -> Path:
        return self.folder / LOG_FILE

    @property
    def record(self) -> Path:
        return self.folder / STEP_FILE

    @property
    def seconds(self) -> float | None:
        return None if self.start is None or self.end is None else self.end - self.start

    def resources(self) -> str:
        """"2 threads", "4 processes × 3 threads, GPU 0,1", ...: what the step ran with."""
        threads = f"{self.threads} thread{'s' if self.threads != 1 else ''}" if self.threads else ""
        parts = [f"{self.processes} processes × {threads}" if self.processes > 1 else threads]
        if self.gpus:
            parts.append(f"GPU {self.gpus}")
        return ", ".join(part for part in parts if part)


def step_runs(root: Path, pipeline=None, now: float | None = None) -> list[StepRun]:
    """Every step of the run in `root`: those of `pipeline` (runner.Pipeline, where its file is at hand)
    in its order, else those its records and state file name (see the module's docstring), in the order
    they started. An unfinished step's bar ends when it last wrote its log or progress, else at `now`."""
    this_run = set(read_run(root).steps)
    steps = pipeline.steps if pipeline is not None else _recorded_steps(root, this_run)
    records = {step.name: _record(step.folder) for step in steps}
    decidable, undecided = _decidable(steps, records)
    statuses = {row.step: row for row in executor_of(root).status(Pipeline(root, root, decidable))}
    now = time.time() if now is None else now
    return [_step_run(step, records[step.name][0], statuses.get(step.name), undecided.get(step.name, ""),
                      step.name in this_run, now) for step in steps]


def _step_run(step: Step, record: dict[str, Any], status: StepStatus | None, undecided: str, in_this_run: bool,
              now: float) -> StepRun:
    run = StepRun(step.name, step.folder, str(record.get("kind") or step.kind), NOT_RUN, reason=undecided)
    if status is None:  # nothing is decided from a record that cannot be read
        return run
    start, end, bad_time = _times(record)
    run.state = _state(status, in_this_run, start is not None)
    run.reason = "; ".join(part for part in (status.detail if status.state in EXPLAINED else "", bad_time) if part)
    if run.state == NOT_RUN or start is None:
        return run
    run.start, run.executor = start, str(record.get("executor", ""))
    run.threads = record.get("threads") if isinstance(record.get("threads"), int) else None
    run.gpus = str(record.get("devices") or "")
    run.processes = record.get("processes") if isinstance(record.get("processes"), int) else 1
    if run.state in (DONE, UP_TO_DATE):
        run.end = end
    elif run.state == FAILED:
        run.end = _modified(run.log) or start
    else:
        run.end = _last_sign_of_life(step.folder) or now
    return run


def _state(status: StepStatus, in_this_run: bool, started: bool) -> str:
    """The timeline's state of a step whose executor says `status`. One done for other parameters or
    inputs than the pipeline's now (a copied run folder's steps name other paths) did not run in this
    run: its result is an earlier run's, as the reason says."""
    if status.state is State.DONE:
        return DONE if in_this_run else UP_TO_DATE
    if status.state is State.OUTDATED:
        return UP_TO_DATE
    if status.state is State.FAILED:
        return FAILED
    return UNFINISHED if started and status.state not in UNRUN else NOT_RUN


def _times(record: dict[str, Any]) -> tuple[float | None, float | None, str]:
    """The record's start and end (None where it has none, or none the clock can show), and what of
    them cannot be shown, for the step's row."""
    if "started_at" not in record:
        return None, None, ""
    start = _moment(record["started_at"])
    if start is None:
        return None, None, f"{STEP_FILE}: started_at {reprlib.repr(record['started_at'])} is no time"
    seconds = _number(record.get("seconds", 0.0))
    end = _moment(start + seconds) if seconds is not None and seconds >= 0 else None
    if end is None:
        return start, None, f"{STEP_FILE}: seconds {reprlib.repr(record.get('seconds'))} is no time it took"
    return start, end, ""


def _moment(value: Any) -> float | None:
    """`value` as seconds since the epoch that the clock can show (time.localtime takes them), else None."""
    number = _number(value)
    if number is None:
        return None
    try:
        time.localtime(number)
    except (OverflowError, OSError, ValueError):
        return None
    return number


def _number(value: Any) -> float | None:
    """`value` as a finite float where it is a JSON number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return number if math.isfinite(number) else None


def _record(folder: Path) -> tuple[dict[str, Any], str]:
    """The step's record ({} where it has none) and, where it exists but cannot be read, why: the page
    names it on the step's row instead of failing."""
    try:
        return read_stamp(folder) or {}, ""
    except RecordUnreadable as exc:
        return {}, str(exc)


def _recorded_steps(root: Path, this_run: set[str]) -> list[Step]:
    """The steps whose folders under `root` hold a record, in the order they started, each as its record
    has it (the steps it reads: those of its inputs that are no files), then the steps the state file
    names without a record."""
    records = {path: _record(path)[0] for path in root.iterdir() if (path / STEP_FILE).is_file()}
    found = sorted(records, key=lambda path: (_moment(records[path].get("started_at")) or 0.0, path.name))
    steps = [_step_of(path, records[path]) for path in found]
    return steps + [Step(name, "", root / name, {}, {}) for name in sorted(this_run - {path.name for path in found})]


def _step_of(folder: Path, record: dict[str, Any]) -> Step:
    params = record.get("params") if isinstance(record.get("params"), dict) else {}
    inputs = record.get("inputs") if isinstance(record.get("inputs"), dict) else {}
    files = record.get(FILES) if isinstance(record.get(FILES), dict) else {}
    return Step(folder.name, str(record.get("kind", "")), folder, params,
                {name: folder.parent / name for name in inputs if name not in files})


def _decidable(steps: list[Step], records: dict[str, tuple[dict[str, Any], str]]
               ) -> tuple[list[Step], dict[str, str]]:
    """The steps whose state can be told, each reading only those of them before it (the executor's
    status of a step follows those it reads; one that no step before it is, read before it started or
    never recorded, has none), and why each other cannot: its record cannot be read, or it reads such
    a step."""
    decidable: list[Step] = []
    undecided: dict[str, str] = {}
    for step in steps:
        blocked = next((name for name in step.reads if name in undecided), None)
        if records[step.name][1] or blocked is not None:
            undecided[step.name] = records[step.name][1] or f"it reads {blocked}, whose state cannot be told"
            continue
        told = {each.name for each in decidable}
        decidable.append(replace(step, reads={name: folder for name, folder in step.reads.items() if name in told}))
    return decidable, undecided


def _last_sign_of_life(folder: Path) -> float | None:
    """When an unfinished step last wrote its log or its progress: its bar ends there, not at the
    time the page is written (which may be days after a run was stopped)."""
    times = [moment for path in (folder / LOG_FILE, *folder.glob(".progress*.json")) if (moment := _modified(path))]
    return max(times, default=None)


def _modified(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
