"""Training checkpoints in safetensors: model weights, optimizer, scheduler and each rank's RNG state.

A checkpoint is a directory written under a temporary name and renamed into place, so a crash
never leaves a half-written one that a resume would pick up; a failed write removes it (a killed
one leaves it for the next run to sweep: `RunFolder.temporaries`). A stage writes one every N steps,
every M minutes of wall time, or both (`CheckpointSchedule`), and keeps the newest few.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from time import monotonic

import torch
from safetensors.torch import load_file, save_file

from train.engine.errors import RunConfigError
from train.engine.run_folder import StageFolder
from vlbert.utils.atomic import folder_written_whole
from vlbert.utils.records import read_record

STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"


def save_checkpoint(directory: Path, model, optimizer: torch.optim.Optimizer, scheduler, step: int,
                    progress: dict | None = None, extra: dict[str, dict[str, torch.Tensor]] | None = None,
                    random_states: list[dict[str, torch.Tensor]] | None = None, scaler: dict | None = None) -> None:
    """`progress`: counters to carry over a resume (e.g. seconds and samples so far); `extra`: more
    safetensors files (name: tensors) that belong in the checkpoint, such as a tuned detector's;
    `random_states`: each rank's `random_state()`, in rank order (default: this process's);
    `scaler`: the fp16 gradient scaler's state."""
    tensors, scalars = _optimizer_state(optimizer)
    random_states = random_states or [random_state(None)]
    for rank, states in enumerate(random_states):
        tensors.update({f"rng.{rank}.{kind}": state for kind, state in states.items()})
    with folder_written_whole(directory, directory.with_name(directory.name + ".tmp")) as tmp:
        model.save_pretrained(tmp)
        for name, extra_tensors in (extra or {}).items():
            save_file(extra_tensors, tmp / name)
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp / STATE_TENSORS)
        (tmp / STATE_JSON).write_text(json.dumps({
            "step": step, "progress": progress or {}, "optimizer": scalars, "scheduler": scheduler.state_dict(),
            "world_size": len(random_states), "scaler": scaler}, indent=1))


@dataclass
class TrainingState:
    step: int
    progress: dict  # the counters `save_checkpoint` was given
    scaler: dict | None  # the fp16 gradient scaler's state
    world_size: int  # the number of processes that saved it
    random_state_note: str | None  # why this rank's random state was not restored, or None


def load_training_state(directory: Path, optimizer: torch.optim.Optimizer, scheduler, rank: int = 0,
                        world_size: int = 1, device: torch.device | None = None) -> TrainingState:
    """Restores optimizer and scheduler state, and rank `rank`'s random state when the checkpoint
    was written by as many ranks. Load it after the model has moved to its device: the optimizer
    state then moves to each parameter's device and dtype."""
    tensors = load_file(directory / STATE_TENSORS)
    meta = read_record(directory / STATE_JSON, "a checkpoint's training state", RunConfigError)
    if meta is None:
        raise RunConfigError(f"{directory}: no {STATE_JSON}: not a whole checkpoint")
    state = {int(k.split(".")[1]): {} for k in tensors if k.startswith("optimizer.")}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            state[int(index)][name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
    scheduler.load_state_dict(meta["scheduler"])
    saved_ranks = _random_states(tensors, meta, device)
    note = None
    if len(saved_ranks) == world_size:
        restore_random_state(saved_ranks[rank], device)
    else:
        note = (f"{directory} was written by {len(saved_ranks)} process(es), this run has {world_size}: random "
                "states start afresh, so dropout draws differ from an uninterrupted run")
    return TrainingState(int(meta["step"]), meta.get("progress", {}), meta.get("scaler"), len(saved_ranks), note)


def random_state(device: torch.device | None) -> dict[str, torch.Tensor]:
    """This process's CPU generator state, and its CUDA device's when it trains on one."""
    state = {"cpu": torch.get_rng_state()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_random_state(state: dict[str, torch.Tensor], device: torch.device | None) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _random_states(tensors: dict[str, torch.Tensor], meta: dict, device: torch.device | None) -> list[dict]:
    """Each saving rank's random state. Checkpoints of one process from before per-rank states
    held `rng.cpu` and one `rng.cuda.<i>` per visible GPU."""
    if "world_size" not in meta:
        state = {"cpu": tensors["rng.cpu"]}
        index = 0 if device is None or device.index is None else device.index
        if f"rng.cuda.{index}" in tensors:
            state["cuda"] = tensors[f"rng.cuda.{index}"]
        return [state]
    ranks: list[dict] = [{} for _ in range(int(meta["world_size"]))]
    for key, value in tensors.items():
        if key.startswith("rng."):
            _, rank, kind = key.split(".")
            ranks[int(rank)][kind] = value
    return ranks


def _optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors = {}
    for index, values in state["state"].items():
        for name, value in values.items():
            tensors[f"optimizer.{index}.{name}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return tensors, {"param_groups": state["param_groups"]}


def prune_checkpoints(stage: StageFolder, keep: int) -> None:
    """Removes all but the newest `keep` checkpoints (0 keeps all), so a long run does not fill the disk."""
    for old in stage.checkpoints()[:-keep] if keep else []:
        shutil.rmtree(old)


class CheckpointSchedule:
    """When a stage writes a checkpoint: every `every_steps` steps or once `minutes` of wall time
    have passed since the last one (or since the stage started), whichever comes first; 0 turns a
    trigger off. Each process decides by its own clock: only rank 0 writes checkpoints."""

    def __init__(self, every_steps: int, minutes: float) -> None:
        self.every_steps, self.seconds = every_steps, minutes * 60
        self.last = monotonic()

    def due(self, step: int, clock: bool = True) -> bool:
        """Whether a checkpoint is due after `step`; without `clock`, by the step trigger alone."""
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        return by_steps or (clock and self.seconds > 0 and monotonic() - self.last >= self.seconds)

    def written(self) -> None:
        self.last = monotonic()
