"""The processes of a training run: the process group, bound to each rank's GPU, and the few
collectives the trainer needs (agreeing on a flag, gathering objects to rank 0).

Under torchrun every process reads RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; a plain
`python` run is rank 0 of 1. Each rank trains on its own GPU, cuda:LOCAL_RANK
(`extract.device.rank_device`): without that, every rank would put its model on cuda:0 and NCCL
refuses two ranks on one GPU. The process group lives as long as the run (`process_group`).
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from extract.device import launcher_variable

# DDP's setting for no broadcast of buffers before each forward: torch 2.14 names it forward_sync_buffers
# and deprecates broadcast_buffers. The new one still broadcasts rank 0's buffers once, when DDP wraps
# the model: the same values, since every rank loaded the same ones.
NO_BUFFER_BROADCASTS = ({"forward_sync_buffers": False}
                        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                        else {"broadcast_buffers": False})


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> World:
        size = launcher_variable(env, "WORLD_SIZE", 1)
        return cls(launcher_variable(env, "RANK", 0), size, launcher_variable(env, "LOCAL_RANK", 0),
                   launcher_variable(env, "LOCAL_WORLD_SIZE", size))

    @property
    def distributed(self) -> bool:
        return self.size > 1


@contextmanager
def process_group(world: World, device: torch.device) -> Iterator[None]:
    """The process group of a distributed `world` for the block: NCCL bound to this rank's GPU (the
    current device already: `extract.device.use_device`) on CUDA, gloo on the CPU; ended after the
    block, also on an error, unless it was running before."""
    started = world.distributed and not dist.is_initialized()
    if started:
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    try:
        yield
    finally:
        if started:
            dist.destroy_process_group()


def from_rank_zero(value: Any, world: World) -> Any:
    """Rank 0's `value` on every rank."""
    if not world.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(flag: bool, world: World, device: torch.device) -> bool:
    """True on every rank when `flag` is true on any, so that ranks take the same branch."""
    if not world.distributed:
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def gathered(value: Any, world: World) -> list[Any] | None:
    """Every rank's `value` on rank 0, in rank order; None on the other ranks."""
    if not world.distributed:
        return [value]
    values = [None] * world.size if world.rank == 0 else None
    dist.gather_object(value, values, dst=0)
    return values


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()
