"""A small demo world extracted into a FeatureStore, shared by the training tests."""

from pathlib import Path

import torch

from extract.job import run_extraction
from pipelines.world.generate import generate_world
from train.data.vocabulary import write_world_vocabulary
from train.engine.config import RunConfig, StageConfig

TINY_MODEL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=128, geometry_frequencies=8)


def make_world(root: Path, images: int = 24) -> Path:
    world = root / "world"
    generate_world(world, num_images=images, seed=3)
    run_extraction(world, root / "cache", "tiny", mask_variants=2, batch_size=4, progress=False)
    write_world_vocabulary(world, root / "vocab")
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
