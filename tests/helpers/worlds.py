"""Run configs over the tiny training world (pipelines/world/tiny.py), and a copy of it to write into."""

import dataclasses
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
    """A run over the tiny world at `root`; its pre-training stages read the world's corpus unless
    their options name another."""
    world = root / "world"
    values = dict(out=str(root / out), store=str(root / "cache"), train_annotations=str(world / "train.jsonl"),
                  eval_annotations=str(world / "val.jsonl"), vocabulary=str(root / "vocab"), model=dict(TINY_MODEL),
                  max_length=48)
    values.update(overrides)
    return RunConfig(stages=[with_corpus(stage, world / "corpus.txt") for stage in stages], **values)


def with_corpus(stage: StageConfig, corpus: Path) -> StageConfig:
    """A pre-training stage with `corpus` as its text-only corpus where it names none; others as given."""
    if stage.task != "pretrain" or stage.options.corpus is not None:
        return stage
    return dataclasses.replace(stage, options=dataclasses.replace(stage.options, corpus=str(corpus)))


def interrupt_optimiser_step(monkeypatch, call: int) -> None:
    """Ctrl-C on the `call`-th optimiser step (before it updates anything)."""
    original, calls = torch.optim.AdamW.step, {"n": 0}

    def step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
