"""The state file's records, typed: what a run's executor recorded (`RunRecord`), its local scheduler
(`SchedulerRecord`) and each step's launch (`LaunchRecord`), whatever executor launched it.

These are a view of the file, not its format: `to_json` writes the keys that the executors always wrote
and `from_json` reads them back, so a state file written before these types still reads (status, cancel,
resume). A key a record does not hold is left out of its JSON, as it always was. What a damaged file holds
(a pid that is no number, a job id that is an option) is kept as read: the executor that reads it names
what is wrong in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

# The JSON keys of the state file itself; a record's keys are its fields' names
EXECUTOR, SCHEDULER, STEPS = "executor", "scheduler", "steps"


def _json(record) -> dict[str, Any]:
    """A record's fields that hold something, by name: what is not recorded is left out."""
    return {each.name: getattr(record, each.name) for each in fields(record)
            if getattr(record, each.name) not in (None, {}, [])}


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a record")
    return value


@dataclass(frozen=True)
class LaunchRecord:
    """What an executor recorded of a step's launch (every field optional): the local scheduler's
    state, processes, times and attempt (its error where it failed or did not run), Slurm's job ids."""

    state: str | None = None  # "running", "done", "failed", "stopped", "not run"
    processes: Any = field(default_factory=dict)  # {pid's digits: its identity, or None}: local
    jobs: Any = field(default_factory=list)  # the job ids that complete the step, the last one ends it: Slurm
    started: float | None = None  # seconds since the epoch
    attempt: str | None = None  # what the launch's processes share (their `attempt`)
    ended: float | None = None
    error: str | None = None  # why it failed or did not run

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, entry: Any, step: str) -> LaunchRecord:
        """The record of `step` as the state file holds it; ValueError naming the step when it is not one."""
        known = {each.name for each in fields(cls)}
        return cls(**{key: value for key, value in _mapping(entry, f"step {step!r}: its launch").items()
                      if key in known})

    def with_process(self, pid: int, identity: str | None) -> LaunchRecord:
        return replace(self, processes={**self.processes, str(pid): identity})


@dataclass(frozen=True)
class SchedulerRecord:
    """The local scheduler of a run: its pid, what tells that process from a later one of the same pid
    (processes.process_identity), its host, when it started and (once it did) ended. As read, each may
    be anything: the executor checks it before it signals anything."""

    pid: Any
    identity: Any
    host: Any
    started: Any = None
    ended: Any = None

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> SchedulerRecord:
        return cls(**{each.name: entry.get(each.name) for each in fields(cls)})


@dataclass(frozen=True)
class RunRecord:
    """The state file: the executor that ran the pipeline last, its scheduler (a local run's; a value
    that is no record is kept as read), and each step's launch by name."""

    executor: str | None = None
    scheduler: SchedulerRecord | Any = None
    steps: dict[str, LaunchRecord] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        scheduler = self.scheduler.to_json() if isinstance(self.scheduler, SchedulerRecord) else self.scheduler
        recorded = {EXECUTOR: self.executor, SCHEDULER: scheduler,
                    STEPS: {name: launch.to_json() for name, launch in self.steps.items()}}
        return {key: value for key, value in recorded.items() if value is not None}

    @classmethod
    def from_json(cls, recorded: dict[str, Any]) -> RunRecord:
        """The state file's contents ({} before any run) as records; ValueError naming what is not a record."""
        scheduler = recorded.get(SCHEDULER)
        return cls(recorded.get(EXECUTOR),
                   SchedulerRecord.from_json(scheduler) if isinstance(scheduler, dict) else scheduler,
                   {name: LaunchRecord.from_json(entry, name)
                    for name, entry in _mapping(recorded.get(STEPS) or {}, "its steps").items()})

    def launched(self, executor: str) -> dict[str, LaunchRecord]:
        """The launch of each step, where `executor` ran the pipeline last; {} where another did."""
        return self.steps if self.executor == executor else {}
