"""What a stage's speed settings come to on this machine, recorded in run.json under "speed": its
DataLoader workers (from the cores when `num_workers` is not given), the optimiser's kernel, and
which of prefetching, compiling and length-aware batches are on."""

from __future__ import annotations

import os

import torch

from train.engine.config import StageConfig
from train.engine.distributed import World
from train.engine.optimization import optimizer_kernel


def available_cores() -> int:
    """The cores this process may run on (its affinity, which Slurm and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_count(requested: int | None, world: World) -> int:
    """`requested`, or the cores shared by the node's ranks less one for each rank's own process."""
    if requested is not None:
        return requested
    return max(1, available_cores() // world.local_size - 1)


def stage_speed(stage: StageConfig, device: torch.device, world: World) -> dict:
    return {"workers": worker_count(stage.num_workers, world),
            "optimizer_kernel": optimizer_kernel(stage.fused_optimizer, device),
            "prefetch": stage.prefetch and device.type == "cuda", "compile": stage.compile,
            "length_buckets": stage.length_buckets, "log_every": stage.log_every}
