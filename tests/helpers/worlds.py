"""Run configs over the tiny training world (pipelines/world/tiny.py), and a copy of it to write into."""

import shutil
from pathlib import Path

import torch

from pipelines.world.tiny import TINY_MODEL
from train.engine.config import RunConfig, StageConfig


def copy_world(world: Path, root: Path) -> Path:
    """The tiny world at `world` copied to `root`, for tests that write run folders or models into it.
    The store's images_root still names the original world's images, which the copy only reads."""
    shutil.copytree(world, root, dirs_exist_ok=True)
    return root


def run_config(root: Path, out: str, stages: list[StageConfig], **overrides) -> RunConfig:
    world = root / "world"
    values = dict(out=str(root / out), store=str(root / "cache"), train_annotations=str(world / "train.jsonl"),
                  eval_annotations=str(world / "val.jsonl"), vocabulary=str(root / "vocab"),
                  corpus=str(world / "corpus.txt"), model=dict(TINY_MODEL), max_length=48)
    values.update(overrides)
    return RunConfig(stages=stages, **values)


def interrupt_optimiser_step(monkeypatch, call: int) -> None:
    """Ctrl-C on the `call`-th optimiser step (before it updates anything)."""
    original, calls = torch.optim.AdamW.step, {"n": 0}

    def step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
