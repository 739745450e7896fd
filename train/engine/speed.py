"""What a stage's speed settings come to on this machine, one frozen record (`StageSpeed`) that the
trainer applies through its methods and run.json records under "speed" as it is: its DataLoader
workers (from the cores when `num_workers` is not given), the optimiser's kernel, whether prefetching
and length-aware batches are on, torch.compile's mode (false: eager), what the features travel to
the device as, whether a pooled [CLS] that no head reads is skipped, and whether the encoder's layers
are this library's fused ones. Each is a speed path, one record of SPEED_PATHS: its name, its setting,
how it applies."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from extract.store.schema import FEATURE_ENCODINGS
from train.engine.compiled import BATCH_LENGTH_MULTIPLE, LENGTH_MULTIPLE, compiled_step
from train.engine.config import StageConfig
from train.engine.distributed import World
from train.engine.errors import RunConfigError
from train.engine.optimization import optimizer_kernel
from vlbert.utils import step_environment

if TYPE_CHECKING:
    from vlbert.modeling import VLBertPreTrainedModel


# The cores an executor gives a step's processes, all ranks together, where it leaves their affinity
# alone: pipelines' local executor shares a machine's cores among the steps it runs side by side.
CORES_VARIABLE = step_environment.CORES


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


Losses = Callable[[dict], dict[str, torch.Tensor]]  # a batch's inputs → its loss tensors


@dataclass(frozen=True)
class SpeedPath:
    """One speed setting of a stage, as SPEED_PATHS registers it: its key under run.json's "speed", its
    value there for a stage on a device (`setting`: a false one leaves the path off), and where it is
    on, how it applies (parts of the trainer read the others' values: its DataLoaders the workers,
    its optimiser the kernel)."""

    name: str
    setting: Callable[[StageConfig, torch.device, World, str], Any]  # (stage, device, world, feature dtype)
    sequence_multiple: int = 1  # the model pads its sequences to a multiple of this many elements
    batch_length_multiple: int = 1  # the batches pad their text and region counts to a multiple of this
    step: Callable[[Any, Losses], Losses] | None = None  # (its value, the step's losses) → the losses it runs
    model: Callable[[VLBertPreTrainedModel], None] | None = None  # what it changes in the stage's model


# Every speed path, by name, in run.json's order: a new one is its module plus one entry here.
SPEED_PATHS: dict[str, SpeedPath] = {path.name: path for path in (
    SpeedPath("workers", lambda stage, device, world, _: worker_count(stage.num_workers, world, device.type == "cuda")),
    SpeedPath("optimizer_kernel", lambda stage, device, *_: optimizer_kernel(stage.fused_optimizer, device)),
    # On a GPU only: the next batch copied while the device computes this one.
    SpeedPath("prefetch", lambda stage, device, *_: stage.prefetch and device.type == "cuda"),
    # torch.compile's mode; False: eager.
    SpeedPath("compile", lambda stage, *_: stage.compile_mode if stage.compile else False,
              sequence_multiple=LENGTH_MULTIPLE, batch_length_multiple=BATCH_LENGTH_MULTIPLE,
              step=lambda mode, losses: compiled_step(losses, mode)),
    SpeedPath("length_buckets", lambda stage, *_: stage.length_buckets, sequence_multiple=LENGTH_MULTIPLE),
    SpeedPath("log_every", lambda stage, *_: stage.log_every),
    SpeedPath("features_sent_as", lambda stage, device, world, feature_dtype: feature_transfer(stage, feature_dtype)),
    SpeedPath("skip_unread_pooler", lambda stage, *_: stage.skip_unread_pooler,
              model=lambda model: model.skip_unread_pooler()),
    SpeedPath("fused_encoder_layers", lambda stage, *_: stage.fused_encoder_layers,
              model=lambda model: model.use_encoder_layers("fused")),
)}


@dataclass(frozen=True)
class StageSpeed:
    settings: dict[str, Any]  # each speed path's setting (SPEED_PATHS), by name, in its order

    @classmethod
    def on(cls, stage: StageConfig, device: torch.device, world: World, feature_dtype: str) -> StageSpeed:
        """`stage`'s speed settings on `device`, for a rank of `world`, from a store of `feature_dtype`."""
        return cls({name: path.setting(stage, device, world, feature_dtype) for name, path in SPEED_PATHS.items()})

    def record(self) -> dict:
        """What run.json keeps of it."""
        return dict(self.settings)

    @property
    def workers(self) -> int:
        return self.settings["workers"]

    @property
    def optimizer_kernel(self) -> str:
        return self.settings["optimizer_kernel"]

    def _on(self) -> list[SpeedPath]:
        return [SPEED_PATHS[name] for name, value in self.settings.items() if value]

    @property
    def batch_length_multiple(self) -> int:
        """What the stage's batches pad their text and region counts to a multiple of."""
        return math.lcm(1, *(path.batch_length_multiple for path in self._on()))

    def shape(self, model: VLBertPreTrainedModel) -> None:
        """A compiled stage's or length-aware batches' model pads its sequences to few shapes; the paths
        that change the model change it. Before the optimiser is built: a path may replace parameters."""
        multiple = math.lcm(1, *(path.sequence_multiple for path in self._on()))
        if multiple > 1:
            model.pad_sequences_to(multiple)
        for path in self._on():
            if path.model is not None:
                path.model(model)

    def step(self, losses: Losses) -> Losses:
        """The stage's losses as each optimiser step computes them: through the paths that change them
        (compiled in its mode), or eager."""
        for path in self._on():
            if path.step is not None:
                losses = path.step(self.settings[path.name], losses)
        return losses
