"""The embedded demo world: synthetic shape scenes with captions, VQA, referring expressions and a corpus."""

from pipelines.world.generate import WorldConfig, generate_world, load_split, load_world_image
from pipelines.world.vocabulary import ATTRIBUTE_NAMES, CLASS_NAMES

__all__ = ["ATTRIBUTE_NAMES", "CLASS_NAMES", "WorldConfig", "generate_world", "load_split", "load_world_image"]
