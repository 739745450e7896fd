"""The smallest complete training input: the demo world, its FeatureStore from the tiny detector and
its vocabulary, with a VL-BERT size to match. Tests and benchmarks train on it in seconds."""

from __future__ import annotations

from pathlib import Path

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from pipelines.world.generate import generate_world
from train.data.vocabulary import write_world_vocabulary

TINY_MODEL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=128, geometry_frequencies=8)


def build_tiny_world(root: Path, images: int = 24) -> Path:
    """`root` with world/ (the demo world, seed 3), cache/ (its FeatureStore, two masked-pixel
    variants) and vocab/."""
    world = root / "world"
    generate_world(world, num_images=images, seed=3)
    run_extraction(ExtractionConfig(world, "tiny", mask_variants=2, batch_size=4, progress=False), root / "cache")
    write_world_vocabulary(world, root / "vocab")
    return root
