"""A BERT WordPiece vocabulary trained on the user's own texts (`vlbert vocab build`).

Inputs: annotation files (`*.jsonl` in the project's schema: the texts of every item kind, such as
captions, VCR's rationales, SNLI-VE's hypotheses) and plain-text corpora (a file, or a
folder whose `*.txt` files are read as train.data.sources.text reads them, one text a line). The
texts are streamed into the `tokenizers` library's WordPiece trainer with BERT's normalisation
(lower-casing and accent stripping unless cased) and pre-tokenisation, so the pieces are those
that `vlbert.tokenization.load_tokenizer` cuts words into.

Written to the folder `out`, as a BERT checkpoint has them:
- vocab.txt: the special tokens first, in BERT's order ([PAD] at id 0, the model's padding id;
  [UNK] [CLS] [SEP] [MASK]), then the texts' characters (the 1000 most frequent) as `##`
  continuations and alone, so that no word made of them becomes [UNK]; then the learned pieces.
  The same texts give the same file;
- tokenizer_config.json: `do_lower_case`. A vocab.txt alone is read as uncased, which would
  lower-case every text given to a cased vocabulary.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator, Sequence

from tokenizers import BertWordPieceTokenizer

from train.data.annotations import annotation_texts, parse_annotation_line
from train.data.files import DataError
from train.data.sources.text import corpus_files
from train.data.vocabulary import SPECIAL_TOKENS
from vlbert.utils.atomic import made_folder
from vlbert.utils.paths import checked, output_folder
from vlbert.utils.progress import progress_bar

VOCABULARY_FILE = "vocab.txt"
CONFIG_FILE = "tokenizer_config.json"
SHADOWING_FILE = "tokenizer.json"  # load_tokenizer prefers it to vocab.txt
_SURROGATE = re.compile("[\ud800-\udfff]")  # a JSON escape such as "\\ud800" alone: no UTF-8 holds it
LIMIT_ALPHABET = 1000  # characters kept, the most frequent (the trainer's default; BERT's has ~1000)
PROGRESS_FROM_BYTES = 64 << 20  # smaller inputs are read in seconds: no progress lines
# The trainer reserves memory by the size asked for (about 1.3 GB at 2**28) and aborts the process
# from 2**30; BERT's vocabularies have 30,522 tokens, multilingual ones about 120,000.
MAX_SIZE = 2 ** 24


def build_vocabulary(files: Sequence[Path], out: Path, size: int = 30522, min_frequency: int = 2,
                     lowercase: bool = True, log: Callable[[str], None] = print) -> Path:
    """Trains a WordPiece vocabulary of at most `size` tokens on the texts of `files` (annotation
    `.jsonl` files, text files, folders of `*.txt` files), keeping pieces seen `min_frequency` times;
    writes `out/vocab.txt` (and `out/tokenizer_config.json`) and returns the vocab.txt path.
    DataError, with nothing written, for a missing or unreadable input, one without text or with
    a lone surrogate, a `size` below what the texts' characters need or above MAX_SIZE;
    OutputOverlapError for an `out` that is, lies inside or holds an input."""
    out = Path(out)
    if not 1 <= size <= MAX_SIZE:
        raise DataError(f"size {size}: expected 1 to {MAX_SIZE:,} (2**24), far beyond any WordPiece vocabulary: the "
                        "trainer reserves memory by the size asked for")
    if not 1 <= min_frequency < 2 ** 64:
        raise DataError(f"min_frequency {min_frequency}: expected 1 to 2**64 - 1, the trainer's counts")
    inputs = [(Path(path), input_files(Path(path))) for path in files]
    if not inputs:
        raise DataError("no input files given")
    check_out(out, inputs)
    reading = Reading(inputs)
    tokenizer = BertWordPieceTokenizer(lowercase=lowercase)
    alphabet = characters(tokenizer, reading.texts("counting characters"))
    if reading.shows_progress:
        log(f"{len(alphabet)} characters; reading the texts again for the WordPiece merges")
    # The trainer numbers the ## continuations as it meets them in a hash map, and breaks ties
    # between merges by those numbers, so that two builds from the same texts differ
    # (huggingface/tokenizers#1794). Given in a fixed order up front, they are not renumbered.
    continuations = ["##" + character for character in alphabet]
    tokenizer.train_from_iterator(reading.texts("reading texts"), vocab_size=size, min_frequency=min_frequency,
                                  limit_alphabet=len(alphabet), initial_alphabet=alphabet,
                                  special_tokens=SPECIAL_TOKENS + continuations, show_progress=False)
    vocabulary = tokenizer.get_vocab()
    tokens = sorted(vocabulary, key=vocabulary.get)
    if len(tokens) > size:  # the trainer keeps every character whatever the size
        raise DataError(f"size {size} is too small: the texts need at least {len(tokens)} tokens, "
                        f"{len(SPECIAL_TOKENS)} special ones and {len(alphabet)} characters, alone and as "
                        f"## continuations")
    if len(tokens) < size:
        log(f"{len(tokens)} tokens, fewer than size {size}: the texts hold no other piece at min_frequency "
            f"{min_frequency}")
    replace_together(out, {CONFIG_FILE: json.dumps({"do_lower_case": lowercase}) + "\n",
                           VOCABULARY_FILE: "".join(token + "\n" for token in tokens)})
    return out / VOCABULARY_FILE


def characters(tokenizer: BertWordPieceTokenizer, texts: Iterator[str]) -> list[str]:
    """The LIMIT_ALPHABET most frequent characters of `texts` after the tokenizer's normalisation
    (lower-casing, accents stripped), sorted."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(text)
    normalized: Counter[str] = Counter()
    for character, count in counts.items():
        for piece in tokenizer.normalizer.normalize_str(character):
            if not piece.isspace():
                normalized[piece] += count
    return sorted(character for character, _ in normalized.most_common(LIMIT_ALPHABET))


def input_files(path: Path) -> list[Path]:
    """An annotation or text file itself, or the `*.txt` files under a folder."""
    files = corpus_files(path)
    if not files:
        raise DataError(f"{path}: a folder without *.txt files")
    return files


def check_out(out: Path, inputs: list[tuple[Path, list[Path]]]) -> None:
    """Refuses an `out` that would give a vocabulary load_tokenizer does not read, or that is, lies
    inside or holds an input: its vocab.txt could replace the input, or be read by the next build."""
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: not a folder")
    if (out / SHADOWING_FILE).exists():
        raise DataError(f"{out}: holds a {SHADOWING_FILE}, which load_tokenizer would read instead of the new "
                        f"{VOCABULARY_FILE}; choose another folder")
    output_folder(out, (("folder" if path.is_dir() else "file", path) for path, _ in inputs))


class Reading:
    """The texts of every input, streamed; progress in bytes for large inputs."""

    def __init__(self, inputs: list[tuple[Path, list[Path]]]) -> None:
        self.inputs = inputs
        try:
            self.total = sum(file.stat().st_size for _, files in inputs for file in files)
        except OSError as exc:
            raise DataError(f"{exc.filename}: cannot read ({exc.strerror or exc})") from None
        self.shows_progress = self.total >= PROGRESS_FROM_BYTES

    def texts(self, doing: str) -> Iterator[str]:
        with progress_bar(self.total, doing, "B", enabled=self.shows_progress) as bar:
            for path, files in self.inputs:
                yield from self._texts_of_input(path, files, bar)

    def _texts_of_input(self, path: Path, files: list[Path], bar) -> Iterator[str]:
        count = 0
        for file in files:
            reader = annotation_file_texts if file.suffix == ".jsonl" else text_file_texts
            for text in reader(file, self._lines(file, bar)):
                if not text.isascii() and (surrogate := _SURROGATE.search(text)):
                    raise DataError(f"{file}: the text {ascii(text[:80])} holds a lone surrogate "
                                    f"({ascii(surrogate.group())}), which is no character")
                if text.strip():
                    count += 1
                    yield text
        if not count:
            raise DataError(f"{path}: no text")

    @staticmethod
    def _lines(path: Path, bar) -> Iterator[tuple[int, bytes]]:
        """(number, line) of every non-blank line of `path`, streamed."""
        try:
            with path.open("rb") as f:
                for number, line in enumerate(f, 1):
                    bar.update(len(line))
                    if line.strip():
                        yield number, line
        except OSError as exc:
            raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def text_file_texts(path: Path, lines: Iterator[tuple[int, bytes]]) -> Iterator[str]:
    for number, line in lines:
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}:{number}: not UTF-8 text ({exc.reason})") from None


def annotation_file_texts(path: Path, lines: Iterator[tuple[int, bytes]]) -> Iterator[str]:
    """The texts of every item of every kind (`train.data.annotations.ITEM_KINDS`) of each record."""
    for number, line in lines:
        yield from annotation_texts([parse_annotation_line(line, path, number)])


def replace_together(out: Path, contents: dict[str, str]) -> None:
    """Every file written under a temporary name first, then renamed: a failure while writing
    leaves the previous build whole and no temporary file behind."""
    made_folder(out)
    temporary = {checked(out / name): checked(out / f"{name}.tmp") for name in contents}
    try:
        for tmp, text in zip(temporary.values(), contents.values()):
            tmp.write_text(text, encoding="utf-8")
    except BaseException:
        for tmp in temporary.values():
            tmp.unlink(missing_ok=True)
        raise
    for final, tmp in temporary.items():
        os.replace(tmp, final)
