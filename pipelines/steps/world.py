"""The `world` step: the synthetic demo world (images, train/val annotations, corpus.txt)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.steps.base import Log, StepKind, field_names, parse
from pipelines.world.scene import MAX_OBJECTS
from train.engine.errors import RunConfigError
from vlbert.utils.typed_config import SEEDS, above, at_least

@dataclass
class WorldParams:
    images: int = dataclasses.field(default=1000, metadata=at_least(1))
    seed: int = dataclasses.field(default=0, metadata=SEEDS)
    # also the images as img2dataset writes them (pipelines/world/shards.py): img2dataset/webdataset/
    # (tar shards) and img2dataset/files/, `samples_per_shard` images a shard
    img2dataset: bool = False
    samples_per_shard: int = dataclasses.field(default=10_000, metadata=at_least(1))
    # also the world in Flickr30K Entities' layout with CoNLL-U parses (pipelines/world/entities.py), in
    # the world's own folder: train.txt, val.txt, Sentences/, Annotations/, train.conllu, val.conllu and
    # flickr30k-images/, so that the world's extraction stores its images under Flickr30K's keys too and
    # one store serves the training and the analyses (`analyze` steps)
    entities: bool = False
    # the share of training images that keep their VQA questions and referring expressions, all keeping
    # their captions (`WorldConfig.annotated_fraction`): a low-data fine-tuning regime
    annotated_fraction: float = dataclasses.field(default=1.0, metadata=above(0, 1))
    # each scene holds 1 to `max_objects` objects (`WorldConfig.max_objects`)
    max_objects: int = dataclasses.field(default=MAX_OBJECTS, metadata=at_least(1, MAX_OBJECTS))
    # images of the val split, the world's last (`WorldConfig.val_images`; default a fifth): more of them
    # narrow a comparison's interval without changing the training split
    val_images: int | None = dataclasses.field(default=None, metadata=at_least(0))

    def __post_init__(self) -> None:
        from pipelines.world.generate import split_sizes

        try:
            split_sizes(self.images, self.val_images)
        except ValueError as error:
            raise RunConfigError(str(error)) from None


def world(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """The synthetic demo world: images, train/val annotations, corpus.txt; with `img2dataset`, its
    images as img2dataset's webdataset and files outputs too; with `entities`, the world in Flickr30K
    Entities' layout too."""
    from pipelines.world import WorldConfig, generate_world

    chosen = parse(WorldParams, params)
    generate_world(folder, chosen.images, chosen.seed,
                   WorldConfig(annotated_fraction=chosen.annotated_fraction, max_objects=chosen.max_objects,
                               val_images=chosen.val_images))
    if chosen.img2dataset:
        from pipelines.world.shards import OUTPUT_FORMATS, write_img2dataset  # pyarrow: only when asked for

        for output_format in OUTPUT_FORMATS:
            write_img2dataset(folder, folder / "img2dataset" / output_format, output_format, chosen.samples_per_shard)
    if chosen.entities:
        from pipelines.world.entities import write_world_entities

        counts = write_world_entities(folder, folder)
        log(f"Flickr30K Entities layout: {', '.join(f'{split} {n} captions' for split, n in counts.items())}")


KIND = StepKind(world, functools.partial(parse, WorldParams), field_names(WorldParams), light=True)
