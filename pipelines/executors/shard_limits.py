"""The most shards one extract step may have under each executor: its `problems` checks them with its
other bounds, before anything runs, so that nothing is made per shard (a launch, a job array's
index) first. Locally each shard is a process of its own: at most what this user may run (ulimit -u)
and the system may number (kernel.pid_max). Under Slurm the shards are one job array's tasks: at
most its MaxArraySize (indices 0 to MaxArraySize - 1).
"""

from __future__ import annotations

import re
import resource

from pipelines.executors.processes import pid_max

# `scontrol show config`'s line of the array limit: "MaxArraySize            = 1001"
MAX_ARRAY_SIZE = re.compile(r"^MaxArraySize\s*=\s*(\d+)\s*$", re.MULTILINE)


def too_many_shards(pipeline, most: int, why: str) -> list[str]:
    """A problem for each step of more shards than `most`, which `why` names."""
    return [f"step {step.name!r}: shards {step.layout.shards}: more than {why} ({most})"
            for step in pipeline.steps if step.layout.shards > most]


def local_processes() -> tuple[int, str]:
    """(the processes a local run may have at once, what bounds them)."""
    user, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    system = pid_max()
    if user == resource.RLIM_INFINITY or user > system:
        return system, "the processes this system numbers (kernel.pid_max)"
    return user, "the processes this user may run (ulimit -u)"


def array_tasks(config: str) -> tuple[int, str]:
    """(the tasks a Slurm job array may have, what bounds them), from `scontrol show config`'s output;
    Slurm's default (1001) where it names no MaxArraySize."""
    found = MAX_ARRAY_SIZE.search(config)
    return (int(found.group(1)) if found else 1001), "the tasks of a job array on this cluster (MaxArraySize)"
