"""What each step of a pipeline run did and when, read from its folder: the record the step keeps
(`step.json`: when it started, for how long, with how many threads or GPUs, whether it is done) and
the executor's state file (when the run began; which steps failed, or were not run because a step
they read failed, and why). Nothing here asks an executor or a scheduler: a run folder copied to
another machine reads the same.

A step's state in the run: `done` (it ran in this run and finished), `up to date` (done in an
earlier run, skipped in this one), `failed`, `not run` (it reads a step that failed, or nothing
started it), `unfinished` (started, neither done nor failed: running, or stopped).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import STEP_FILE
from pipelines.execution import LOG_FILE, RecordUnreadable, read_stamp
from pipelines.executors.base import read_state

DONE, UP_TO_DATE, FAILED, NOT_RUN, UNFINISHED = "done", "up to date", "failed", "not run", "unfinished"


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
    reason: str = ""  # why it failed or was not run

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


def step_runs(root: Path, steps: list[tuple[str, Path, str]] | None = None, now: float | None = None) -> list[StepRun]:
    """Every step of the run in `root`: `steps` ((name, folder, kind) in the pipeline's order) where the
    pipeline file is at hand, else the folders under `root` holding a step record, in the order they
    started, then the steps the state file names without one. An unfinished step's bar ends when it
    last wrote its log or progress, else at `now`."""
    state = read_state(root)
    recorded = state.get("steps", {}) if isinstance(state.get("steps"), dict) else {}
    if steps is None:
        found = sorted((path for path in root.iterdir() if (path / STEP_FILE).is_file()),
                       key=lambda path: (_record(path)[0].get("started_at") or 0.0, path.name))
        steps = [(path.name, path, "") for path in found]
        steps += [(name, root / name, "") for name in recorded if not (root / name / STEP_FILE).is_file()]
    began = (state.get("scheduler") or {}).get("started")
    return [_step_run(name, folder, kind, recorded.get(name) or {}, began, time.time() if now is None else now)
            for name, folder, kind in steps]


def _step_run(name: str, folder: Path, kind: str, entry: dict[str, Any], began: float | None, now: float) -> StepRun:
    record, unreadable = _record(folder)
    run = StepRun(name, folder, record.get("kind") or kind, NOT_RUN, reason=unreadable or str(entry.get("error", "")))
    start = record.get("started_at")
    if not isinstance(start, (int, float)) or entry.get("state") == NOT_RUN and not record.get("done"):
        return run
    run.start, run.executor = float(start), str(record.get("executor", ""))
    run.threads = record.get("threads") if isinstance(record.get("threads"), int) else None
    run.gpus = record.get("devices") or ""
    run.processes = record.get("processes") if isinstance(record.get("processes"), int) else 1
    if record.get("done"):
        run.end = run.start + float(record.get("seconds", 0.0))
        run.state = UP_TO_DATE if began is not None and run.start < began else DONE
    elif entry.get("state") == FAILED:
        run.state, run.end = FAILED, entry.get("ended") or _modified(run.log) or run.start
    else:
        run.state, run.end = UNFINISHED, _last_sign_of_life(folder) or now
    return run


def _record(folder: Path) -> tuple[dict[str, Any], str]:
    """The step's record ({} where it has none) and, where it exists but cannot be read, why: the page
    names it on the step's row instead of failing."""
    try:
        return read_stamp(folder) or {}, ""
    except RecordUnreadable as exc:
        return {}, str(exc)


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
