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
from train.engine.errors import RunConfigError
from train.engine.optimization import optimizer_kernel


# The cores an executor gives a step's processes, all ranks together, where it leaves their affinity
# alone: pipelines' local executor shares a machine's cores among the steps it runs side by side.
CORES_VARIABLE = "VLBERT_CORES"


def available_cores() -> int:
    """The cores this process may run on: its affinity (which Slurm and taskset narrow), at most the
    cores its executor gives it (CORES_VARIABLE)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    given = os.environ.get(CORES_VARIABLE, "").strip()
    if not given:
        return cores
    if not given.isdigit() or int(given) < 1:
        raise RunConfigError(f"{CORES_VARIABLE}={given!r}: expected a positive number of cores")
    return min(cores, int(given))


def worker_count(requested: int | None, world: World, on_gpu: bool) -> int:
    """`requested`, or the cores shared by the node's ranks less one for each rank's own process. On
    the CPU that is none where a rank has one core: a worker would only take it from the model's
    threads, or from the steps beside it. On a GPU one worker at least makes batches while the
    device computes."""
    if requested is not None:
        return requested
    return max(1 if on_gpu else 0, available_cores() // world.local_size - 1)


def feature_transfer(stage: StageConfig, feature_dtype: str) -> str:
    """What the stage's features travel to the device as, from a store of `feature_dtype`: its dtype,
    or an encoded store's codes ("q8 codes") where the stage decodes them there."""
    encoding = FEATURE_ENCODINGS[feature_dtype]
    if encoding.encode is None:
        return feature_dtype
    return f"{feature_dtype} codes" if stage.decode_on_device else encoding.dtype


def stage_speed(stage: StageConfig, device: torch.device, world: World, feature_dtype: str) -> dict:
    return {"workers": worker_count(stage.num_workers, world, device.type == "cuda"),
            "optimizer_kernel": optimizer_kernel(stage.fused_optimizer, device),
            "prefetch": stage.prefetch and device.type == "cuda",
            "compile": stage.compile_mode if stage.compile else False,
            "length_buckets": stage.length_buckets, "log_every": stage.log_every,
            "features_sent_as": feature_transfer(stage, feature_dtype)}
