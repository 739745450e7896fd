"""A WordPiece vocabulary built from a corpus, for worlds that come without a BERT checkpoint."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from vlbert.utils.atomic import made_folder, write_atomically

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocabulary(texts: Iterable[str], directory: str | Path) -> Path:
    """Writes `vocab.txt` with every lower-cased word and punctuation mark of `texts` as one piece;
    `vlbert.tokenization.load_tokenizer(directory)` then reads it as a BERT tokenizer."""
    words = sorted({w for text in texts for w in re.findall(r"\w+|[^\w\s]", text.lower())})
    directory = Path(directory)
    made_folder(directory)
    write_atomically(directory / "vocab.txt", "\n".join(SPECIAL_TOKENS + words) + "\n")
    return directory


def write_world_vocabulary(world_dir: str | Path, directory: str | Path) -> Path:
    """The vocabulary of a world folder: its corpus.txt and every text of its train/val annotations."""
    from train.data.annotations import annotation_texts, read_annotations

    world_dir = Path(world_dir)
    texts = (world_dir / "corpus.txt").read_text().splitlines()
    for split in ("train", "val"):
        texts += annotation_texts(read_annotations(world_dir / f"{split}.jsonl"))
    return write_vocabulary(texts, directory)
