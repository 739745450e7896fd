"""`vlbert analyze …`: looking inside a trained model (`grounding`: which regions phrases attend to;
`syntax`: which regions the words of a dependency arc attend to; `attention`: one sample's attention
between its words and regions, drawn; `words`: which masked words a pre-trained model predicts from
the image)."""

from pathlib import Path

import click

from pipelines.commands.values import FiniteFloatRange
from train.analysis.parses import PARSERS
from train.analysis.phrases import MIN_LENGTH, PHRASE_READERS

_folder = click.Path(exists=True, file_okay=False, path_type=Path)
TEXT_KINDS = ("captions", "refs", "vqa")  # train.analysis.attention.TEXT_KINDS, named here without importing torch


def _model_options(command):
    """How an analysis runs the model: the options every analysis shares."""
    options = (
        click.option("--max-length", type=click.IntRange(min=MIN_LENGTH),
                     help="Cap on text + RoIs (default: the model's position count)."),
        click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N."),
        click.option("--fresh-weights", is_flag=True, help="Analyse the model's config with freshly initialised "
                                                           "weights: the before-training reference."),
    )
    for option in reversed(options):
        command = option(command)
    return command


def _running_options(command):
    """The model options of an analysis over many items, which it runs in batches."""
    return click.option("--batch-size", default=16, show_default=True, type=click.IntRange(min=1))(
        _model_options(command))


@click.group("analyze")
def analyze_group() -> None:
    """Analyses of a trained model: its attention, and what its word predictions take from the image."""


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
@_running_options
def grounding_command(model_dir: Path, store: Path, annotations: Path, phrase_format: str, vocabulary: Path,
                      out: Path, images: Path | None, examples: int, max_items: int | None, batch_size: int,
                      max_length: int | None, device: str, fresh_weights: bool) -> None:
    """Per layer and head, the share of phrases whose most-attended RoI has IoU ≥ 0.5 with the
    annotated box, against a random RoI and the most confident RoI: OUT/grounding.json,
    OUT/grounding.png (heat map) and OUT/examples/*.png (the best head's attention)."""
    from train.analysis.grounding import analyze_grounding
    from train.analysis.verdicts import grounding_verdicts
    from vlbert.utils.paths import output_folder

    output_folder(out, (("--model", model_dir), ("--store", store), ("--annotations", annotations),
                      ("--vocabulary", vocabulary), ("--images", images)))
    result = analyze_grounding(model_dir, store, annotations, vocabulary, out, phrase_format, images=images,
                               examples=examples, max_items=max_items, batch_size=batch_size, device=device,
                               max_length=max_length, fresh_weights=fresh_weights)
    figures = result.scores.figures
    best = figures.best
    click.echo(f"{result.scores.count} phrases: best head layer {best.layer} head {best.head} "
               f"{best.accuracy:.3f}, mean over heads {figures.mean_accuracy:.3f}, random RoI "
               f"{figures.random_baseline:.3f}, most confident RoI {figures.confidence_baseline:.3f}; "
               f"{out / 'grounding.json'}")
    if result.left_out:
        ids = [phrase["item_id"] for phrase in result.left_out]
        click.echo(f"{len(ids)} phrases left out, their box no box (NaN, or x2 <= x1 or y2 <= y1): "
                   f"{', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''} (all in grounding.json, left_out)")
    for line in grounding_verdicts(figures.held_out_best):
        click.echo(f"Held out: {line}")


@analyze_group.command("syntax")
@click.option("--model", "model_dir", required=True, type=_folder,
              help="A saved model folder, e.g. a run stage's final model (docs/training.md).")
@click.option("--store", required=True, type=_folder, help="The FeatureStore of the captions' images.")
@click.option("--annotations", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Flickr30K Entities' split file (val.txt), Sentences/ and Annotations/ beside it.")
@click.option("--parses", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CoNLL-U parses of the split's captions, one sentence per caption in the order of the split "
                   "file's images and of their Sentences lines (--parser conllu).")
@click.option("--parser", type=click.Choice(list(PARSERS)), default="conllu", show_default=True,
              help="conllu: read --parses; spacy: parse the captions with an installed English spaCy model "
                   "(the syntax extra; nothing is downloaded).")
@click.option("--labels", type=click.Choice(["ud", "clearnlp"]),
              help="The parses' relation labels, to match them with the paper's Stanford names: ud (Universal "
                   "Dependencies) or clearnlp (spaCy's English models). Default: conllu ud, spacy clearnlp.")
@click.option("--vocabulary", required=True, type=_folder, help="The tokenizer folder (vocab.txt).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--plot", "plot", multiple=True,
              help="A relation to draw as VisualBERT's Figure 4 (its label in the parses, or a Stanford name of "
                   "the paper's table); repeat for several. Default: pobj, nsubj and amod where they occur.")
@click.option("--min-region-attention", type=FiniteFloatRange(0.0, 1.0, max_open=True),
              help="Choose best heads among those giving more than this share of their attention to the RoIs "
                   "(the paper: 0.2). Default: every head.")
@click.option("--max-items", type=click.IntRange(min=1), help="Analyse only the first N captions.")
@_running_options
def syntax_command(model_dir: Path, store: Path, annotations: Path, parses: Path | None, parser: str,
                   labels: str | None, vocabulary: Path, out: Path, plot: tuple[str, ...],
                   min_region_attention: float | None, max_items: int | None, batch_size: int, max_length: int | None, device: str,
                   fresh_weights: bool) -> None:
    """Per dependency relation and head, the share of arcs (w1 an entity word, w2 the other end)
    whose w2 attends most to a RoI with IoU ≥ 0.5 with w1's box, against a random RoI and the most
    confident RoI (VisualBERT's Table 2): OUT/syntax.json, OUT/syntax.md (the table, the paper's
    figures beside), OUT/relations.png (relations × heads) and OUT/layers/<relation>.png (Figure 4)."""
    from train.analysis.syntax import analyze_syntax
    from train.analysis.verdicts import syntax_verdicts
    from vlbert.utils.paths import output_folder

    output_folder(out, (("--model", model_dir), ("--store", store), ("--annotations", annotations),
                      ("--parses", parses), ("--vocabulary", vocabulary)))
    result = analyze_syntax(model_dir, store, annotations, vocabulary, out, parses=parses, parser=parser,
                            plot=list(plot) or None, min_region_attention=min_region_attention, max_items=max_items,
                            batch_size=batch_size, device=device, max_length=max_length, fresh_weights=fresh_weights,
                            labels=labels)
    click.echo(f"{result.arcs} arcs of {len(result.relations)} relations in {result.captions} captions; "
               f"{out / 'syntax.md'}, {out / 'syntax.json'}")
    for row in result.relations[:3]:
        best = row.figures.best
        click.echo(f"  {row.relation}: {row.arcs} arcs, most confident RoI {row.figures.confidence_baseline:.3f}, "
                   + ("no head passes --min-region-attention" if best is None else
                      f"best head {best.layer}-{best.head} {best.accuracy:.3f}"))
    for line in syntax_verdicts(result.held_out())[:1]:
        click.echo(f"Held out: {line} (each relation's verdict in syntax.md)")
    if result.skipped:
        names = [f"{item['image_id']}/{item['caption']}" for item in result.skipped]
        click.echo(f"{len(names)} captions skipped, their parse not a tree or not their text: {', '.join(names[:5])}"
                   f"{', ...' if len(names) > 5 else ''} (all in syntax.json, skipped)")


@analyze_group.command("attention")
@click.argument("model_dir", metavar="MODEL", type=_folder)
@click.argument("store", type=_folder)
@click.option("--annotations", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An annotation file (the project's JSON lines, e.g. a world's val.jsonl).")
@click.option("--item", default=0, show_default=True, type=click.IntRange(min=0),
              help="Which text of --kind in the file (from 0, in file order).")
@click.option("--kind", type=click.Choice(list(TEXT_KINDS)), default="captions", show_default=True,
              help="The texts --item counts: captions, referring expressions or VQA questions.")
@click.option("--word", help="Also draw this word's attention over the image (a word of the sample).")
@click.option("--vocabulary", required=True, type=_folder, help="The tokenizer folder (vocab.txt).")
@click.option("--images", help="The images root, for --word [default: the images root the store records].")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@_model_options
def attention_command(model_dir: Path, store: Path, annotations: Path, item: int, kind: str, word: str | None,
                      vocabulary: Path, images: str | None, out: Path, max_length: int | None, device: str,
                      fresh_weights: bool) -> None:
    """One sample's attention from each word to each region, every layer and head: OUT/attention.png
    (heat maps, layers × heads), OUT/attention.json, and with --word OUT/word-<position>.png (the
    regions over the image shaded by that word's attention, VisualBERT's Figure 3)."""
    from train.analysis.attention import analyze_attention
    from vlbert.utils.paths import output_folder

    output_folder(out, (("MODEL", model_dir), ("STORE", store), ("--annotations", annotations),
                      ("--vocabulary", vocabulary), ("--images", images)))
    result = analyze_attention(model_dir, store, annotations, vocabulary, out, item, kind, word, images, device,
                               max_length, fresh_weights, log=click.echo)
    click.echo(f'{kind} item {item} ("{result["text"]}", image {result["image_id"]}): {len(result["words"])} words '
               f'x {len(result["regions"])} regions')
    for path in result["files"].values():
        click.echo(path)


def _groups(_ctx, _param, values: tuple[str, ...]) -> dict[str, list[str]]:
    groups = {}
    for value in values:
        name, equals, words = value.partition("=")
        if not equals or not name.strip() or name.strip() in groups:
            raise click.BadParameter(f"{value!r}: expected NAME=word,word,... with a NAME not given before")
        groups[name.strip()] = [word for word in words.split(",") if word.strip()]
    return groups


@analyze_group.command("words")
@click.option("--model", "model_dir", required=True, type=_folder,
              help="A pre-training stage's saved model (it has the masked-word head), e.g. its final model.")
@click.option("--store", required=True, type=_folder, help="The FeatureStore of the captions' images.")
@click.option("--annotations", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An annotation file with captions (the project's JSON lines, e.g. a world's val.jsonl).")
@click.option("--vocabulary", required=True, type=_folder, help="The tokenizer folder (vocab.txt).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--group", "groups", multiple=True, callback=_groups, metavar="NAME=WORD,WORD,...",
              help="Also report these words together (repeatable), e.g. --group colour=red,green,blue.")
@click.option("--max-items", type=click.IntRange(min=1), help="Analyse only the first N captions.")
@_running_options
def words_command(model_dir: Path, store: Path, annotations: Path, vocabulary: Path, out: Path,
                  groups: dict[str, list[str]], max_items: int | None, batch_size: int, max_length: int | None,
                  device: str, fresh_weights: bool) -> None:
    """Every word of every caption masked alone and predicted with the caption's own image and with
    another image's regions: the accuracies and their paired difference (the image's part in the
    predictions), in all, per --group and per word: OUT/words.md, OUT/words.json."""
    from train.analysis.masked_words import analyze_masked_words
    from train.analysis.verdicts import words_verdicts
    from vlbert.utils.paths import output_folder

    output_folder(out, (("--model", model_dir), ("--store", store), ("--annotations", annotations),
                      ("--vocabulary", vocabulary)))
    result = analyze_masked_words(model_dir, store, annotations, vocabulary, out, groups, max_items, batch_size,
                                  device, max_length, fresh_weights)
    click.echo(f"{result.figures.masked_words} masked words in {result.captions} captions; {out / 'words.md'}")
    for line in words_verdicts(result):
        click.echo(f"  {line}")


COMMANDS = [analyze_group]
