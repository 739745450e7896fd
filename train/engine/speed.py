"""What a stage's speed settings come to on this machine, recorded in run.json under "speed": its
DataLoader workers (from the cores when `num_workers` is not given), the optimiser's kernel,
whether prefetching and length-aware batches are on, torch.compile's mode (false: eager), and what
the features travel to the device as."""

from __future__ import annotations

import os

import torch

from extract.store.schema import FEATURE_ENCODINGS
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


def feature_transfer(stage: StageConfig, feature_dtype: str) -> str:
    """What the stage's features travel to the device as, from a store of `feature_dtype`: its dtype,
    or an encoded store's codes ("q8 codes") where the stage decodes them there."""
    encoding = FEATURE_ENCODINGS[feature_dtype]
    if encoding.encode is None:
        return feature_dtype
    return f"{feature_dtype} codes" if stage.decode_on_device else encoding.dtype


def stage_speed(stage: StageConfig, device: torch.device, world: World, feature_dtype: str) -> dict:
    return {"workers": worker_count(stage.num_workers, world),
            "optimizer_kernel": optimizer_kernel(stage.fused_optimizer, device),
            "prefetch": stage.prefetch and device.type == "cuda",
            "compile": stage.compile_mode if stage.compile else False,
            "length_buckets": stage.length_buckets, "log_every": stage.log_every,
            "features_sent_as": feature_transfer(stage, feature_dtype)}
