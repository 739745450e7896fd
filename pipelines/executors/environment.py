"""A step's environment, as the executors give it to the processes of a step they start: what every
executor sets, and what each adds. The variables of the project's own are named in
vlbert/utils/step_environment.py, where the code that reads them finds them."""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.execution import Step
from pipelines.executors.forked import SAFE_PATH
from vlbert.utils.step_environment import ATTEMPT, CORES, PROGRESS_FILE, RENDEZVOUS

THREADS = "OMP_NUM_THREADS"


def step_variables(step: Step, shard: int | None, threads: int) -> dict[str, str]:
    """What every executor sets for a step's process: its thread count, and the file its progress is
    published in (one per shard)."""
    return {THREADS: str(threads), PROGRESS_FILE: str(step.progress_file(shard))}


def local_environment(step: Step, shard: int | None, threads: int, processes: int, gpus: list[str],
                      scheduler: dict[str, str], attempt: str) -> dict[str, str]:
    """The whole environment of a local launch's processes: this process's, with the cores of all of them
    together (their DataLoader workers fit within), their GPUs, PYTHONSAFEPATH (no folder of the user's
    is on their import path: torch's launcher starts its ranks as `python -u -m pipelines`, without -P),
    the scheduler's identity (they end with it: processes.py) and the launch's attempt."""
    return {**os.environ, **step_variables(step, shard, threads), CORES: str(processes * threads),
            "CUDA_VISIBLE_DEVICES": ",".join(gpus), SAFE_PATH: "1", **scheduler, ATTEMPT: attempt}


def slurm_variables(step: Step, shard: int | None, threads: int, rendezvous: Path | None) -> dict[str, str]:
    """What a Slurm job's task sets in its own environment before it runs its step: with `rendezvous`
    (a DDP job), the file in which its ranks meet."""
    return {**step_variables(step, shard, threads), **({RENDEZVOUS: str(rendezvous)} if rendezvous else {})}
