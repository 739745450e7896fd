"""What a stage's speed settings come to on this machine, one frozen record (`StageSpeed`) that the
trainer applies through its methods and run.json records under "speed" as it is: its DataLoader
workers (from the cores when `num_workers` is not given), the optimiser's kernel, whether prefetching
and length-aware batches are on, torch.compile's mode (false: eager), and what the features travel to
the device as."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable

import torch

from extract.store.schema import FEATURE_ENCODINGS
from train.engine.compiled import BATCH_LENGTH_MULTIPLE, LENGTH_MULTIPLE, compiled_step
from train.engine.config import StageConfig
from train.engine.distributed import World
from train.engine.errors import RunConfigError
from train.engine.optimization import optimizer_kernel

if TYPE_CHECKING:
    from vlbert.modeling import VLBertPreTrainedModel


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


@dataclass(frozen=True)
class StageSpeed:
    workers: int
    optimizer_kernel: str
    prefetch: bool  # on a GPU only: the next batch copied while the device computes this one
    compile: str | bool  # torch.compile's mode; False: eager
    length_buckets: bool
    log_every: int
    features_sent_as: str

    @classmethod
    def on(cls, stage: StageConfig, device: torch.device, world: World, feature_dtype: str) -> StageSpeed:
        """`stage`'s speed settings on `device`, for a rank of `world`, from a store of `feature_dtype`."""
        return cls(workers=worker_count(stage.num_workers, world, device.type == "cuda"),
                   optimizer_kernel=optimizer_kernel(stage.fused_optimizer, device),
                   prefetch=stage.prefetch and device.type == "cuda",
                   compile=stage.compile_mode if stage.compile else False,
                   length_buckets=stage.length_buckets, log_every=stage.log_every,
                   features_sent_as=feature_transfer(stage, feature_dtype))

    def record(self) -> dict:
        """What run.json keeps of it."""
        return asdict(self)

    @property
    def batch_length_multiple(self) -> int:
        """What the stage's batches pad their text and region counts to a multiple of."""
        return BATCH_LENGTH_MULTIPLE if self.compile else 1

    def shape(self, model: VLBertPreTrainedModel) -> None:
        """A compiled stage's or length-aware batches' model pads its sequences to few shapes."""
        if self.compile or self.length_buckets:
            model.pad_sequences_to(LENGTH_MULTIPLE)

    def step(self, losses: Callable[[dict], dict[str, torch.Tensor]]) -> Callable[[dict], dict[str, torch.Tensor]]:
        """The stage's losses as each optimiser step computes them: compiled in its mode, or eager."""
        return compiled_step(losses, self.compile) if self.compile else losses
