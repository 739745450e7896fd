"""The `world` step: the synthetic demo world (images, train/val annotations, corpus.txt)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.steps.base import Log, StepKind, field_names, parse
from vlbert.typed_config import SEEDS, at_least

@dataclass
class WorldParams:
    images: int = dataclasses.field(default=1000, metadata=at_least(1))
    seed: int = dataclasses.field(default=0, metadata=SEEDS)


def world(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """The synthetic demo world: images, train/val annotations, corpus.txt."""
    from pipelines.world import generate_world

    chosen = parse(WorldParams, params)
    generate_world(folder, chosen.images, chosen.seed)


KIND = StepKind(world, functools.partial(parse, WorldParams), field_names(WorldParams), light=True)
