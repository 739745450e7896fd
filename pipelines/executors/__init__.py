"""Executors: what runs a loaded pipeline's steps. One module each, registered in `EXECUTORS`:

- `local` (local.py): this machine, every step whose inputs are done at once, within its cores and GPUs;
- `slurm` (slurm.py): a Slurm cluster through submitit, each step a job after the jobs it reads.

An executor module offers `run(pipeline, log, **options)`, `status(pipeline)` (a `StepStatus` per step)
and `cancel(pipeline, log)`; another engine (Ray, Kubernetes jobs) is one more module and one more
entry here. Every executor runs a step the same way, in a process that `vlbert pipeline step SPEC`
starts (pipelines/execution.py), and records what it launched in the pipeline's state file, which
`status` and `cancel` read, from any process.
"""

from __future__ import annotations

import fcntl
import importlib
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from extract.atomic import write_atomically
from pipelines.execution import STATE_FOLDER, Step, state
from vlbert.errors import FAILED, UserError

EXECUTORS = {"local": "pipelines.executors.local", "slurm": "pipelines.executors.slurm"}
STATE_FILE = "state.json"


class StepsFailed(UserError):
    """Steps that failed (and those left out because they read one); the message names each with its log."""

    exit_status = FAILED


def executor_named(name: str) -> ModuleType:
    if name not in EXECUTORS:
        raise UserError(f"executor {name!r}: expected one of {', '.join(EXECUTORS)}")
    return importlib.import_module(EXECUTORS[name])


@dataclass(frozen=True)
class StepStatus:
    """One row of `vlbert pipeline status`."""

    step: str
    state: str  # done, running, queued, failed, stopped, waiting, not started
    job: str = ""  # the Slurm job id, or the local process id
    log: str = ""
    detail: str = ""  # progress, or why it failed or waits


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
    """{"executor": name, "steps": {step: {...what its executor recorded...}}, ...}; {} before any run."""
    try:
        recorded = json.loads(state_file(out).read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def settled(step: Step) -> StepStatus | None:
    """The status that a step's own folder decides: done when up to date; None otherwise."""
    return StepStatus(step.name, "done", log=str(step.log_file)) if state(step) == "done" else None


def last_error(log: Path) -> str:
    """The one-line error a step's process ended with (its `Error: ...` line), else its last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("Error:")]
    return (errors or lines or [""])[-1]
