"""`vlbert world …`: the embedded demo world (synthetic scenes and text) and its detector."""

from pathlib import Path

import click

from extract.training.config import TrainConfig
from pipelines.commands.values import FiniteFloatRange
from pipelines.world import ATTRIBUTE_NAMES, WorldConfig, generate_world
from pipelines.world.generate import split_sizes
from pipelines.world.scene import MAX_OBJECTS


@click.group("world")
def world_group() -> None:
    """The demo world: synthetic shape scenes with captions, VQA, referring expressions, a corpus."""


@world_group.command("generate")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--images", default=1000, show_default=True, help="Images in all; a fifth go to the val split unless "
              "--val-images says otherwise.")
@click.option("--seed", default=0, show_default=True)
@click.option("--annotated-fraction", default=1.0, show_default=True, type=FiniteFloatRange(0, 1, min_open=True),
              help="The share of training images that keep their VQA questions and referring expressions "
                   "(all keep their captions): a low-data fine-tuning regime.")
@click.option("--max-objects", default=MAX_OBJECTS, show_default=True, type=click.IntRange(1, MAX_OBJECTS),
              help="Each scene holds 1 to this many objects.")
@click.option("--val-images", type=click.IntRange(0), default=None,
              help="Images of the val split, the last of the world's (default: a fifth of --images); the training "
                   "split is the same for any value.")
def generate(out_dir: Path, images: int, seed: int, annotated_fraction: float, max_objects: int,
             val_images: int | None) -> None:
    """Write images, train/val annotations and corpus.txt to OUT."""
    try:
        split_sizes(images, val_images)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--val-images") from None
    from vlbert.utils.paths import output_folder

    meta = generate_world(output_folder(out_dir), images, seed, WorldConfig(annotated_fraction=annotated_fraction,
                                                             max_objects=max_objects, val_images=val_images))
    click.echo(f"{out_dir}: {meta['splits']['train']} train, {meta['splits']['val']} val images, corpus.txt")


@world_group.command("entities")
@click.option("--world", "world_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
def entities_command(world_dir: Path, out: Path) -> None:
    """Write WORLD in Flickr30K Entities' layout to OUT (train.txt, val.txt, Sentences/, Annotations/,
    flickr30k-images/) with CoNLL-U parses of the captions (train.conllu, val.conllu), for `vlbert
    analyze grounding --format flickr30k-entities` and `vlbert analyze syntax`."""
    from pipelines.world.entities import write_world_entities
    from vlbert.utils.paths import output_folder

    output_folder(out, (("--world", world_dir),))
    counts = write_world_entities(world_dir, out)
    click.echo(f"{out}: " + ", ".join(f"{split}.txt and {split}.conllu ({count} captions)"
                                      for split, count in counts.items()))


@world_group.command("corpora")
@click.option("--world", "world_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
def corpora_command(world_dir: Path, out_dir: Path) -> None:
    """Write WORLD's images as Conceptual Captions' and SBU Captions' published files and their
    img2dataset webdataset shards to OUT (pipelines/configs/pretrain_cc_sbu.yaml reads them)."""
    from pipelines.world.corpus_files import write_corpus_files
    from vlbert.utils.paths import output_folder

    output_folder(out_dir, (("--world", world_dir),))
    rows = write_corpus_files(world_dir, out_dir)
    click.echo(f"{out_dir}: " + ", ".join(f"{folder} {count} rows" for folder, count in rows.items()))


@world_group.command("train-detector")
@click.option("--world", "world_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "weights", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Weights file (.safetensors); its .yaml config and .metrics.json are written beside it.")
@click.option("--steps", default=TrainConfig.steps, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--threads", default=1, show_default=True,
              help="CPU threads; results are reproducible for a given count. One thread copes best with a busy machine.")
@click.option("--attributes", default=",".join(ATTRIBUTE_NAMES), show_default=True,
              help="The attributes the detector learns, comma-separated; the others are left unlabelled, so it is "
                   "not trained to separate them (small,large: a detector never taught the colours).")
def train_detector_command(world_dir: Path, weights: Path, steps: int, seed: int, threads: int,
                           attributes: str) -> None:
    """Train the tiny detector on WORLD's train split and evaluate it on its val split."""
    import torch

    from pipelines.world.detector import check_attribute_names, train_world_detector
    from vlbert.utils.paths import check_apart

    if weights.suffix != ".safetensors":
        raise click.BadParameter("expected a .safetensors path", param_hint="--out")
    attribute_names = tuple(attributes.split(",")) if attributes else ()
    try:
        check_attribute_names(attribute_names)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--attributes") from None
    check_apart(weights, (("--world", world_dir),))
    torch.set_num_threads(threads)
    metrics = train_world_detector(world_dir, weights, TrainConfig(steps=steps, seed=seed), log=click.echo,
                                   attribute_names=attribute_names)
    quality = metrics["val"]
    click.echo(f"{weights} ({metrics['train_seconds']:.0f}s): val recall@0.5 {quality['recall']:.3f}, "
               f"class accuracy {quality['class_accuracy']:.3f}, attribute accuracy {quality['attribute_accuracy']:.3f}")


COMMANDS = [world_group]
