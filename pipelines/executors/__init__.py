"""Executors: what runs a loaded pipeline's steps. One module each, registered in `EXECUTORS`:

- `local` (local.py): this machine, every step whose inputs are done at once, within its cores and GPUs;
- `slurm` (slurm.py): a Slurm cluster through submitit, each step a job after the jobs it reads.

An executor module offers `EXECUTOR`, an instance of base.Executor (run, status, cancel, its settings
section, its run options as a dataclass, the attempt its step's processes belong to); the environment
it gives them is built in environment.py. Another engine (Ray, Kubernetes jobs) is one more module and
one more entry here, and nothing else names it (tests/pipelines/test_executor_toy.py adds one so).
Every executor runs a step the same way, in a process that `vlbert pipeline step SPEC` starts
(pipelines/execution.py), and records what it launched in the pipeline's state file, which `status`
and `cancel` read, from any process.

This module imports nothing, so that the command line lists the executors without loading them.
"""

from __future__ import annotations

import importlib
from pathlib import Path

EXECUTORS = {"local": "pipelines.executors.local", "slurm": "pipelines.executors.slurm"}
DEFAULT = "local"


def executor_named(name: str):
    """The registered executor `name` (a base.Executor); UserError for another name."""
    if name not in EXECUTORS:
        from vlbert.utils.errors import UserError

        raise UserError(f"executor {name!r}: expected one of {', '.join(EXECUTORS)}")
    return importlib.import_module(EXECUTORS[name]).EXECUTOR


def sections() -> list[str]:
    """The settings sections of every executor (a pipeline file's top-level keys, `--set SECTION.KEY`)."""
    return [executor.section for executor in map(executor_named, EXECUTORS) if executor.section is not None]


def executor_of(out: Path):
    """The executor that last ran the pipeline in `out` (its state file says), else the default one."""
    from pipelines.executors.base import read_run

    return executor_named(read_run(out).executor or DEFAULT)
