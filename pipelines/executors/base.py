"""What every executor is and shares: the `Executor` interface, one status vocabulary (`State`), the
run lock, and the state file in which an executor records what it launched for `status` and `cancel`.

An executor runs (or submits) a loaded pipeline's steps, says what it knows of each step's launch
(`launches`: live, ended undone, or never launched), cancels a run, takes its settings from its
section of the pipeline file (`section`) and gives each step's processes an environment from which
`attempt` tells which launch they belong to. Whatever the executor, a step's status is decided the
same way (`Executor.status`): the executor's account of the launches is taken first, then each step's
folder decides (done; done for other parameters, `outdated`), so that a launch that ends in between
is found done; the record is read again before a step is called failed.

The process that runs or submits a pipeline holds the run lock (`<out>/.pipeline/run.lock`) for its
whole life: the kernel releases it however that process ends (kill -9 included), so a run whose
record was never closed is known to be over, and a second run of the same folder is refused.
"""

from __future__ import annotations

import fcntl
import json
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TextIO

from pipelines.execution import STATE_FOLDER, Step, decide, read_stamp
from pipelines.executors.records import LaunchRecord, RunRecord
from vlbert.utils.atomic import write_atomically
from vlbert.utils.errors import FAILED, UserError, error_line, exit_status
from vlbert.utils.locks import is_held, lock_holder, take_lock
from vlbert.utils.progress import progress_summary
from vlbert.utils.records import read_record
from vlbert.utils.typed_config import checked_fields

Log = Callable[[str], None]
STATE_FILE = "state.json"
RUN_LOCK = "run.lock"


class State(StrEnum):
    """A step's state, as `vlbert pipeline status` names it."""

    DONE = "done"  # its folder holds its result for these parameters and inputs
    RUNNING = "running"
    QUEUED = "queued"
    FAILED = "failed"  # its launch ended without finishing it
    CANCELLED = "cancelled"  # its job ended before it ran
    STOPPED = "stopped"  # interrupted; it resumes on a rerun
    NOT_RUN = "not run"  # a step it reads ended undone
    OUTDATED = "outdated"  # done, for other parameters or inputs than these: a run redoes it
    WAITING = "waiting"  # the run goes on, but has not launched it yet
    NOT_STARTED = "not started"


# The states in which a step will not be done by its launch, as a step that reads it says so
UNDONE = {State.FAILED: "failed", State.CANCELLED: "was cancelled", State.NOT_RUN: "did not run"}
LIVE = (State.RUNNING, State.QUEUED)


class StepFailed(Exception):
    """A step that raised while running; `cause` is its error (also `__cause__`)."""

    def __init__(self, pipeline: Path, step: str, cause: Exception) -> None:
        super().__init__(f"pipeline {pipeline}, step {step!r}: {error_line(cause)}")
        self.pipeline, self.step, self.cause = pipeline, step, cause

    @property
    def exit_status(self) -> int | None:
        """A failed step ends the command as its error would have (None: a bug)."""
        return exit_status(self.cause)


class StepsFailed(UserError):
    """Steps that failed (and those left out because they read one); the message names each with its log."""

    exit_status = FAILED


class CannotRun(UserError):
    """A pipeline that the executor chosen cannot run as given; each line names a problem."""


class RunGoingOn(UserError):
    """Another process runs (or submits) this pipeline's output folder."""


class StateUnreadable(UserError):
    """An executor's state file that exists but cannot be read."""

    exit_status = FAILED


@dataclass(frozen=True)
class StepStatus:
    """One row of `vlbert pipeline status`."""

    step: str
    state: State
    job: str = ""  # the Slurm job ids, or the local process ids
    log: str = ""
    detail: str = ""  # progress, or why it failed, waits or is outdated


@dataclass(frozen=True)
class Launch:
    """What an executor knows of a step's last launch: live (RUNNING, QUEUED), ended undone (FAILED,
    STOPPED, CANCELLED) or nothing (`state` None). `attempts`: what the `attempt` recorded in the
    step's step.json starts with when this launch wrote it."""

    state: State | None = None
    job: str = ""
    detail: str = ""
    attempts: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoOptions:
    """The run options of an executor that takes none."""


class Executor(ABC):
    """One way of running a pipeline's steps; each is one module and one entry of EXECUTORS."""

    name: str
    # Its settings: the pipeline file's top-level mapping of this name, a step's own mapping of this
    # name, and `--set SECTION.KEY=VALUE`; None: it takes none from the file.
    section: str | None = None
    # Its run's options: a frozen dataclass, every field with its default and a `help` line in its
    # metadata; given to `run_pipeline` as keywords, to `vlbert pipeline run` as flags or as
    # `--set NAME.OPTION=VALUE` (NAME: the executor's).
    options: type = NoOptions

    @abstractmethod
    def problems(self, pipeline, options) -> list[str]:
        """What keeps it from running the pipeline as given with `options` (an instance of `self.options`):
        more processes than it can start, unknown settings; found before anything runs."""

    @abstractmethod
    def run(self, pipeline, log: Log, options, status_stream: TextIO | None = None) -> None:
        """Runs or submits every step not up to date (a line per running step on `status_stream`, a
        terminal, while it waits); raises StepsFailed (or a step's error) at the end."""

    @abstractmethod
    def launches(self, pipeline) -> tuple[dict[str, Launch], bool]:
        """Each launched step's `Launch`, by step name, and whether the run goes on."""

    @abstractmethod
    def cancel(self, pipeline, log: Log) -> None:
        """Stops the run: what is queued or running stops, and resumes on a rerun."""

    @abstractmethod
    def attempt(self) -> str | None:
        """In a step's process: what identifies the launch it belongs to, from the environment this
        executor gave it (its job environment); None outside one."""

    # Whether its `run` returns only once every step has ended: `wait` then asks nothing more of it.
    waits = True
    # For a run option of another executor that it has no use for: what does that work here, said when
    # the option is refused.
    instead: dict[str, str] = {}

    def options_from(self, given: Mapping[str, Any]) -> Any:
        """Its options (an instance of `self.options`) from the values `given` by name, each checked against
        its field's type; `wait` is dropped where it waits anyway, and an option it does not have is refused
        when given (not None or False), with what does its work here."""
        own = option_names(self)
        refused = [name for name, value in given.items() if name not in own and value is not None
                   and value is not False and not (name == "wait" and self.waits)]
        if refused:
            raise CannotRun("; ".join(f"{name}: not an option of the {self.name} executor"
                                      + (f" ({self.instead[name]})" if name in self.instead else "")
                                      for name in refused))
        values = {name: value for name, value in given.items() if name in own}
        return self.options(**checked_fields(self.options, values, error=CannotRun))

    def status(self, pipeline) -> list[StepStatus]:
        """Every step's status, in the pipeline's order."""
        launches, going_on = self.launches(pipeline)  # before the folders: a launch ending meanwhile is then done
        rows: dict[str, StepStatus] = {}
        for step in pipeline.steps:
            rows[step.name] = _status(step, launches.get(step.name, Launch()), rows, going_on)
        return list(rows.values())


def option_names(executor: Executor) -> dict[str, str]:
    """The executor's run options, each name with its help line."""
    return {option.name: option.metadata.get("help", "") for option in fields(executor.options)}


def _status(step: Step, launch: Launch, rows: dict[str, StepStatus], going_on: bool) -> StepStatus:
    log = str(step.log_file)
    record = read_stamp(step.folder)
    if decide(step, record) == "done":
        return StepStatus(step.name, State.DONE, launch.job, log)
    if launch.state is State.RUNNING:
        progress = progress_summary(sorted(step.folder.glob(".progress*.json")))
        return StepStatus(step.name, State.RUNNING, launch.job, log, "; ".join(filter(None, (launch.detail, progress))))
    if launch.state is State.QUEUED:
        return StepStatus(step.name, State.QUEUED, launch.job, log, launch.detail)
    unrun = next((name for name in step.reads if rows[name].state in UNDONE), None)
    if unrun is not None:
        return StepStatus(step.name, State.NOT_RUN, launch.job,
                          detail=f"it reads {unrun}, which {UNDONE[rows[unrun].state]}")
    if launch.state is not None:  # its launch ended, the step undone, by the executor's account
        record = read_stamp(step.folder)  # again: what a process that just ended wrote
        if decide(step, record) == "done":
            return StepStatus(step.name, State.DONE, launch.job, log)
        if not _done_by(record, launch):
            return StepStatus(step.name, launch.state, launch.job, "" if launch.state is State.CANCELLED else log,
                              launch.detail)
    if record and record.get("done"):
        return StepStatus(step.name, State.OUTDATED, launch.job, log,
                          "done for other parameters or inputs than these: a run redoes it")
    return StepStatus(step.name, State.WAITING if going_on else State.NOT_STARTED)


def _done_by(record: dict | None, launch: Launch) -> bool:
    """Whether `launch` finished the step whose record this is (for whatever parameters it had)."""
    attempt = str((record or {}).get("attempt", ""))
    return bool(record and record.get("done") and launch.attempts and attempt.startswith(launch.attempts))


# ---- the run lock --------------------------------------------------------------------------------

def run_lock_file(out: Path) -> Path:
    return out / STATE_FOLDER / RUN_LOCK


@contextmanager
def running(out: Path) -> Iterator[None]:
    """The run lock of `out` held for the block; RunGoingOn when another process holds it."""
    path = run_lock_file(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = take_lock(path)
    if lock is None:
        raise RunGoingOn(f"{out}: another run of this pipeline is going on ({lock_holder(path)}); "
                         "`vlbert pipeline status` shows it, `cancel` stops it")
    try:
        yield
    finally:
        lock.close()


def run_going_on(out: Path) -> bool:
    """Whether a live process holds the run lock of `out`."""
    return is_held(run_lock_file(out))


# ---- the state file: what an executor launched, for `status` and `cancel` ----------------------------

def state_file(out: Path) -> Path:
    return out / STATE_FOLDER / STATE_FILE


@contextmanager
def updating_state(out: Path) -> Iterator[dict[str, Any]]:
    """The state file's contents to change in place, under a lock, written back whole."""
    path = state_file(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f"{STATE_FILE}.lock").open("a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        recorded = read_state(out)
        yield recorded
        write_atomically(path, json.dumps(recorded, indent=1))


def read_state(out: Path) -> dict[str, Any]:
    """{"executor": name, "steps": {step: {...what its executor recorded...}}, ...}; {} before any run.
    A state file that cannot be read is a StateUnreadable naming it."""
    return read_record(state_file(out), "the record of what ran", StateUnreadable) or {}


def read_run(out: Path) -> RunRecord:
    """The state file of `out` as records (records.py); one that is no record is StateUnreadable naming it."""
    recorded = read_state(out)  # outside the try: a StateUnreadable is a ValueError too
    try:
        return RunRecord.from_json(recorded)
    except ValueError as exc:
        raise damaged_state(out, str(exc)) from None


def launched_steps(out: Path, executor: str) -> dict[str, LaunchRecord]:
    """What `executor` recorded of each step it launched in `out`; {} when another executor ran it last."""
    return read_run(out).launched(executor)


def record_run(out: Path, change: Callable[[RunRecord], RunRecord]) -> None:
    """The state file of `out` changed by `change`, under its lock: what every executor records goes
    through it (a run's start writes a new RunRecord whole)."""
    with updating_state(out) as recorded:
        try:
            run = RunRecord.from_json(recorded)
        except ValueError as exc:
            raise damaged_state(out, str(exc)) from None
        recorded.clear()
        recorded.update(change(run).to_json())


def record_launch(out: Path, step: str, change: Callable[[LaunchRecord | None], LaunchRecord]) -> None:
    """The launch record of `step` in the state file of `out` changed by `change` (given None where there
    is none yet)."""
    record_run(out, lambda run: replace(run, steps={**run.steps, step: change(run.steps.get(step))}))


def damaged_state(out: Path, problem: str, consequence: str = "") -> StateUnreadable:
    return StateUnreadable(f"{state_file(out)}: damaged ({problem}){consequence}")


def last_error(log: Path, start: int = 0) -> str:
    """The one-line error a step's process ended with (its `Error: ...` line), else its last line; in what
    the log holds from byte `start` on (what one launch wrote)."""
    try:
        with log.open("rb") as file:
            file.seek(start)
            lines = [line.strip() for line in file.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("Error:")]
    return (errors or lines or [""])[-1]
