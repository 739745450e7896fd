"""`vlbert vocab build FILES…`: a WordPiece vocabulary from the user's own texts."""

from pathlib import Path

import click


@click.group("vocab")
def vocab_group() -> None:
    """WordPiece vocabularies from your own texts, for training without a BERT checkpoint.

    `vlbert vocab build` trains one on annotation files and text corpora and writes vocab.txt
    (with tokenizer_config.json) into a folder that a run config's `vocabulary:` can name:

    \b
    vlbert vocab build data/train.jsonl corpus/ --out vocab/ --size 30522
    """


@vocab_group.command("build", short_help="Build vocab.txt from annotation and text files.")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for vocab.txt and tokenizer_config.json (created; a previous build is replaced). Not an "
                   "input folder, nor inside or holding an input.")
@click.option("--size", default=30522, show_default=True, type=click.IntRange(1),
              help="Tokens at most, special tokens included (BERT-base: 30522).")
@click.option("--min-frequency", default=2, show_default=True, type=click.IntRange(1),
              help="Keep a piece only when the texts hold it this many times.")
@click.option("--cased", is_flag=True, help="Keep case and accents (default: lower-case and strip accents, "
                                            "as BERT uncased).")
def build_command(files: tuple[Path, ...], out: Path, size: int, min_frequency: int, cased: bool) -> None:
    """Train a BERT WordPiece vocabulary on the texts of FILES: annotation files (.jsonl, the schema
    `vlbert data prepare` writes: every item's texts, captions to VCR rationales and SNLI-VE hypotheses),
    text files (one text a line) and folders of *.txt files. vocab.txt starts with [PAD] [UNK]
    [CLS] [SEP] [MASK] (ids 0-4), then the characters of the texts, then the learned pieces."""
    from train.data.wordpiece import build_vocabulary

    path = build_vocabulary(files, out, size, min_frequency, lowercase=not cased, log=click.echo)
    tokens = len(path.read_text(encoding="utf-8").splitlines())
    click.echo(f"{path}: {tokens} tokens ({'cased' if cased else 'uncased'})")


COMMANDS = [vocab_group]
