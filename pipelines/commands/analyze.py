"""`vlbert analyze …`: looking inside a trained model (`grounding`: which regions phrases attend to)."""

from pathlib import Path

import click

from train.analysis.phrases import MIN_LENGTH, PHRASE_READERS

_folder = click.Path(exists=True, file_okay=False, path_type=Path)


@click.group("analyze")
def analyze_group() -> None:
    """Analyses of a trained model's attention."""


@analyze_group.command("grounding")
@click.option("--model", "model_dir", required=True, type=_folder,
              help="A saved model folder, e.g. a run stage's final model (docs/training.md).")
@click.option("--store", required=True, type=_folder, help="The FeatureStore of the annotations' images.")
@click.option("--annotations", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Phrases and their boxes: an annotation file (refs), or Flickr30K Entities' split file.")
@click.option("--format", "phrase_format", type=click.Choice(list(PHRASE_READERS)), default="refs", show_default=True,
              help="refs: each referring expression of an annotation file; flickr30k-entities: the entity "
                   "phrases of the captions of the split file's images (Sentences/ and Annotations/ beside it).")
@click.option("--vocabulary", required=True, type=_folder, help="The tokenizer folder (vocab.txt).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--images", type=_folder, help="The images root, to draw the examples on the images themselves.")
@click.option("--examples", default=0, show_default=True, type=click.IntRange(min=0),
              help="Phrases to draw (the first ones).")
@click.option("--max-items", type=click.IntRange(min=1), help="Analyse only the first N phrases.")
@click.option("--batch-size", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--max-length", type=click.IntRange(min=MIN_LENGTH),
              help="Cap on text + RoIs (default: the model's position count).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--fresh-weights", is_flag=True,
              help="Analyse the model's config with freshly initialised weights: the before-training reference.")
def grounding_command(model_dir: Path, store: Path, annotations: Path, phrase_format: str, vocabulary: Path,
                      out: Path, images: Path | None, examples: int, max_items: int | None, batch_size: int,
                      max_length: int | None, device: str, fresh_weights: bool) -> None:
    """Per layer and head, the share of phrases whose most-attended RoI has IoU ≥ 0.5 with the
    annotated box, against a random RoI and the most confident RoI: OUT/grounding.json,
    OUT/grounding.png (heat map) and OUT/examples/*.png (the best head's attention)."""
    from extract.paths import check_apart
    from train.analysis.grounding import analyze_grounding

    check_apart(out, (("--model", model_dir), ("--store", store), ("--annotations", annotations),
                      ("--vocabulary", vocabulary), ("--images", images)))
    result = analyze_grounding(model_dir, store, annotations, vocabulary, out, phrase_format, images=images,
                               examples=examples, max_items=max_items, batch_size=batch_size, device=device,
                               max_length=max_length, fresh_weights=fresh_weights)
    best = result["best"]
    click.echo(f"{result['phrases']} phrases: best head layer {best['layer']} head {best['head']} "
               f"{best['accuracy']:.3f}, mean over heads {result['mean_accuracy']:.3f}, random RoI "
               f"{result['random_baseline']:.3f}, most confident RoI {result['confidence_baseline']:.3f}; "
               f"{out / 'grounding.json'}")
    if result["left_out"]:
        ids = [phrase["item_id"] for phrase in result["left_out"]]
        click.echo(f"{len(ids)} phrases left out, their box no box (NaN, or x2 <= x1 or y2 <= y1): "
                   f"{', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''} (all in grounding.json, left_out)")


COMMANDS = [analyze_group]
