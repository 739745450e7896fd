"""Text side of VL-BERT inputs: WordPiece tokenizer, whole-word masking, sequence builders, padding.

Builders return the text part `[CLS] A [SEP] (B [SEP])`; the model appends the [IMG] elements
and [END] itself. Lengths are capped on the whole sequence: text + RoIs + [END] ≤ max_length.
"""

from __future__ import annotations

import json
import random
import shutil
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from transformers import BertTokenizerFast, PreTrainedTokenizerFast

from vlbert.losses import IGNORE_INDEX
from vlbert.utils.errors import UserError

MASK_PROBABILITY = 0.15
MEMO_TEXTS = 1 << 18  # texts a WordPieceMemo keeps: ~70 MB a process
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt")  # what load_tokenizer reads from a folder (tokenizer.json first)
# What a tokenizer folder may hold (BertTokenizerFast.from_pretrained reads them); a vocabulary file is needed.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json")
TOKENIZER_CONFIG = "tokenizer_config.json"
# The class a copied tokenizer_config.json names where it names none: AutoTokenizer then reads a model folder
# without knowing its config.json's model type (it takes the fast variant where there is one).
TOKENIZER_CLASS = "BertTokenizer"


class VocabularyError(UserError):
    """A tokenizer folder that cannot be used, or that does not fit the model; the message names its file."""


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """The checkpoint's WordPiece tokenizer (a directory with vocab.txt or tokenizer.json). VocabularyError
    for a folder with neither, a file that is not UTF-8 text or JSON, and a vocabulary without BERT's
    special pieces (an empty one among them): the tokenizer would otherwise append them as new ids
    and fail, or turn every word into [UNK], only when it first reads text."""
    source = vocabulary_file(directory)
    if source.is_dir():
        raise VocabularyError(f"{source}: no {' or '.join(VOCABULARY_FILES)}, expected a tokenizer folder")
    _check_readable(source)  # one line for a file it cannot read, not the tokenizers library's bare Exception
    tokenizer = BertTokenizerFast.from_pretrained(str(directory))
    pieces = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    missing = [token for token in tokenizer.all_special_tokens if token not in pieces]
    if missing:
        raise VocabularyError(f"{source}: {len(pieces)} word pieces, without {', '.join(missing)}; expected a BERT "
                        "WordPiece vocabulary, one piece a line, with the special pieces")
    return tokenizer


def copy_tokenizer(source: str | Path, target: str | Path) -> None:
    """The tokenizer files of folder `source` (TOKENIZER_FILES) copied into folder `target`, its
    tokenizer_config.json naming the tokenizer's class (TOKENIZER_CLASS where it names none); nothing
    where `target` is `source`."""
    source, target = Path(source), Path(target)
    if target.exists() and source.resolve() == target.resolve():
        return
    for name in TOKENIZER_FILES:
        if (source / name).is_file() and name != TOKENIZER_CONFIG:
            shutil.copyfile(source / name, target / name)
    settings = {}
    if (source / TOKENIZER_CONFIG).is_file():
        _check_readable(source / TOKENIZER_CONFIG)
        settings = json.loads((source / TOKENIZER_CONFIG).read_text(encoding="utf-8-sig"))
    settings = {"tokenizer_class": TOKENIZER_CLASS, **settings}
    (target / TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=2) + "\n")


def check_vocabulary_size(tokenizer: PreTrainedTokenizerFast, vocab_size: int, vocabulary: str | Path) -> None:
    """VocabularyError unless the tokenizer has exactly the model's `vocab_size` word pieces: with fewer,
    a model trained on another vocabulary reads different words under the same ids (or [UNK]); with
    more, ids fall outside the model's embedding table. `vocabulary` is the folder (or file) the
    tokenizer came from; the message names its vocabulary file."""
    if len(tokenizer) != vocab_size:
        raise VocabularyError(f"{vocabulary_file(vocabulary)}: {len(tokenizer)} word pieces, but the model's vocab_size is "
                        f"{vocab_size}; use the vocabulary the model was trained with")


def _check_readable(source: Path) -> None:
    """VocabularyError for a vocabulary file that is not UTF-8 text (tokenizer.json: not JSON)."""
    try:
        text = source.read_bytes().decode("utf-8-sig")
        if source.suffix == ".json":
            json.loads(text)
    except UnicodeDecodeError as exc:
        raise VocabularyError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise VocabularyError(f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except OSError as exc:
        raise VocabularyError(f"{source}: cannot read ({exc.strerror or exc})") from None


def vocabulary_file(vocabulary: str | Path) -> Path:
    """The file of a tokenizer folder that holds its word pieces (the folder itself when it has none)."""
    vocabulary = Path(vocabulary)
    return next((vocabulary / name for name in VOCABULARY_FILES if (vocabulary / name).is_file()), vocabulary)


@dataclass
class WordPieces:
    """A text as WordPiece ids, with the word each piece belongs to (whole-word masking needs it)."""

    ids: list[int]
    word_index: list[int]

    def __len__(self) -> int:
        return len(self.ids)

    def truncated(self, length: int) -> WordPieces:
        return WordPieces(self.ids[:length], self.word_index[:length])


def word_pieces(tokenizer: PreTrainedTokenizerFast, text: str | tuple[str, ...]) -> WordPieces:
    """`text` as word pieces; a tuple is a text already split into words (VCR's tagged tokens)."""
    split = isinstance(text, tuple)
    encoding = tokenizer(list(text) if split else text, is_split_into_words=split, add_special_tokens=False)
    return WordPieces(list(encoding["input_ids"]), list(encoding.word_ids()))


class WordPieceMemo:
    """`word_pieces` of each distinct text tokenized once: a dataset's fixed texts (questions, captions,
    expressions) come back every epoch. Each call returns new lists, so that no caller can change what
    the memo holds; a text's ids and word indices (an int for every piece: no special tokens are added)
    are kept as one int32 array, 8 bytes a piece, ~280 bytes a question with its key and entry. The
    first `limit` texts are kept, the others tokenized at each use: a caption corpus of millions
    (Conceptual Captions), met once or twice in a pre-training, would hold a gigabyte in every worker.
    A process (a DataLoader worker) fills its own memo: a pickled one travels empty."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, limit: int = MEMO_TEXTS) -> None:
        self.tokenizer, self.limit = tokenizer, limit
        self._pieces: dict[str | tuple[str, ...], array] = {}

    def __call__(self, text: str | tuple[str, ...]) -> WordPieces:
        stored = self._pieces.get(text)
        if stored is None:
            pieces = word_pieces(self.tokenizer, text)
            if len(self._pieces) >= self.limit:
                return pieces
            stored = self._pieces[text] = array("i", pieces.ids + pieces.word_index)
        count = len(stored) // 2
        return WordPieces(stored[:count].tolist(), stored[count:].tolist())

    def __len__(self) -> int:
        return len(self._pieces)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pieces": {}}


@dataclass
class MaskedText:
    ids: list[int]
    labels: list[int]  # the original id where a word was chosen, IGNORE_INDEX elsewhere


def mask_whole_words(
    tokenizer: PreTrainedTokenizerFast,
    pieces: WordPieces,
    rng: random.Random,
    probability: float = MASK_PROBABILITY,
) -> MaskedText:
    """BERT masking over whole words: each word is chosen with `probability`; all its pieces then
    become [MASK] (80%), random tokens (10%) or stay (10%), and all are predicted."""
    special, mask, vocab_size = set(tokenizer.all_special_ids), tokenizer.mask_token_id, len(tokenizer)
    ids, labels = list(pieces.ids), [IGNORE_INDEX] * len(pieces)
    words: dict[int, list[int]] = {}
    for position, word in enumerate(pieces.word_index):
        words.setdefault(word, []).append(position)
    for positions in words.values():
        if rng.random() >= probability:
            continue
        action = rng.random()
        for position in positions:
            labels[position] = pieces.ids[position]
            if action < 0.8:
                ids[position] = mask
            elif action < 0.9:
                ids[position] = _random_token(vocab_size, special, rng)
    return MaskedText(ids, labels)


def _random_token(vocab_size: int, special: set[int], rng: random.Random) -> int:
    while True:
        token = rng.randrange(vocab_size)
        if token not in special:
            return token


def choose_masked_regions(
    num_regions: int, rng: random.Random, probability: float = MASK_PROBABILITY
) -> tuple[list[bool], list[bool]]:
    """Masked RoI classification: (replaced, predicted) per RoI. Box 0, the whole image, is never
    chosen; a chosen RoI is predicted, and its [IMG] / appearance replaced 90% of the time."""
    replaced, predicted = [False] * num_regions, [False] * num_regions
    for index in range(1, num_regions):
        if rng.random() < probability:
            predicted[index] = True
            replaced[index] = rng.random() < 0.9
    return replaced, predicted


@dataclass
class TextSequence:
    input_ids: list[int]
    token_type_ids: list[int]
    labels: list[int]  # MLM labels aligned with input_ids
    text_box_index: list[int]  # box whose visual feature each element gets (0 = whole image)
    num_regions: int  # RoIs kept under the length cap (the whole-image box first)
    answer_position: int | None = None  # VQA: where the [MASK] to classify sits

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Segment:
    """One text segment of a sequence; labels and per-token box indices are optional."""

    ids: list[int]
    labels: list[int] | None = None
    box_index: list[int] | None = None
    truncatable: bool = True

    def __post_init__(self) -> None:
        for name in ("labels", "box_index"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.ids):
                raise ValueError(f"segment {name} has {len(values)} entries for {len(self.ids)} tokens")


def fit_lengths(
    segment_lengths: list[int], truncatable: list[bool], num_regions: int, max_length: int, min_regions: int = 1
) -> tuple[list[int], int]:
    """Shorten segments and RoIs until [CLS] + segments + [SEP]s + RoIs + [END] ≤ max_length.

    The longer side loses one element at a time (RoIs against the text, as the reference code),
    and within the text the longest truncatable segment, as BERT does for sentence pairs.
    """
    lengths = list(segment_lengths)
    overhead = 1 + len(lengths) + 1  # [CLS], one [SEP] per segment, [END]
    excess = overhead + sum(lengths) + num_regions - max_length
    if len(lengths) == 1 and truncatable[0] and num_regions <= min_regions and 0 < excess < lengths[0]:
        return [lengths[0] - excess], num_regions  # what the loop gives a piece at a time (a long text-only sample)
    while overhead + sum(lengths) + num_regions > max_length:
        can_cut_text = [length > 1 and cut for length, cut in zip(lengths, truncatable)]
        if num_regions > min_regions and (num_regions > sum(lengths) or not any(can_cut_text)):
            num_regions -= 1
        elif any(can_cut_text):
            longest = max((length, i) for i, length in enumerate(lengths) if can_cut_text[i])[1]
            lengths[longest] -= 1
        else:
            raise ValueError(
                f"cannot fit {segment_lengths} tokens and {num_regions} RoIs into {max_length} elements"
            )
    return lengths, num_regions


def build_sequence(
    tokenizer: PreTrainedTokenizerFast,
    segments: list[Segment],
    num_regions: int = 0,
    max_length: int = 512,
) -> TextSequence:
    """`[CLS] A [SEP] (B [SEP])` with segment ids 0 / 1, truncated with the RoIs under the cap."""
    if not 1 <= len(segments) <= 2:
        raise ValueError(f"a sequence has one or two text segments, got {len(segments)}")
    lengths, kept_regions = fit_lengths(
        [len(segment.ids) for segment in segments],
        [segment.truncatable for segment in segments],
        num_regions,
        max_length,
        min_regions=min(num_regions, 1),
    )
    input_ids, sep = [tokenizer.cls_token_id], tokenizer.sep_token_id  # each a lookup in the tokenizer
    token_type_ids, labels, box_index = [0], [IGNORE_INDEX], [0]
    for segment_id, (segment, length) in enumerate(zip(segments, lengths)):
        input_ids += segment.ids[:length] + [sep]
        token_type_ids += [segment_id] * (length + 1)
        labels += (segment.labels or [IGNORE_INDEX] * length)[:length] + [IGNORE_INDEX]
        # A tag pointing at a RoI cut by the cap falls back to the whole image.
        indices = [index if index < kept_regions else 0 for index in (segment.box_index or [0] * length)[:length]]
        box_index += indices + [0]
    return TextSequence(input_ids, token_type_ids, labels, box_index, kept_regions)


def build_caption_sequence(
    tokenizer: PreTrainedTokenizerFast,
    caption: list[int],
    num_regions: int = 0,
    max_length: int = 512,
    labels: list[int] | None = None,
) -> TextSequence:
    """Pre-training (caption or text-only with num_regions=0), retrieval and RefCOCO+: `[CLS] text [SEP]`."""
    return build_sequence(tokenizer, [Segment(caption, labels)], num_regions, max_length)


def build_vqa_sequence(
    tokenizer: PreTrainedTokenizerFast, question: list[int], num_regions: int, max_length: int = 512
) -> TextSequence:
    """VQA: `[CLS] question [SEP] [MASK] [SEP]`; the answer is read at the [MASK]."""
    segments = [Segment(question), Segment([tokenizer.mask_token_id], truncatable=False)]
    sequence = build_sequence(tokenizer, segments, num_regions, max_length)
    sequence.answer_position = len(sequence) - 2
    return sequence


def build_choice_sequences(
    tokenizer: PreTrainedTokenizerFast,
    context: Segment,
    candidates: list[Segment],
    num_regions: int,
    max_length: int = 512,
) -> list[TextSequence]:
    """VCR: `[CLS] context [SEP] candidate [SEP]` for each candidate (Q→A: context = question;
    QA→R: context = question + answer). Every candidate keeps the same number of RoIs."""
    sequences = [build_sequence(tokenizer, [context, candidate], num_regions, max_length) for candidate in candidates]
    kept = min(sequence.num_regions for sequence in sequences)
    return [
        sequence
        if sequence.num_regions == kept
        else build_sequence(tokenizer, [context, candidate], kept, max_length)
        for sequence, candidate in zip(sequences, candidates)
    ]


def pad_text(sequences: list[TextSequence], pad_token_id: int = 0, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Batch tensors for the model: input_ids, token_type_ids, text_mask, text_box_index, mlm_labels
    (int64, text_mask bool), as long as the longest sequence rounded up to a `multiple`. Filled row by
    row through NumPy: torch.tensor of nested lists costs several times as much."""
    lengths = np.array([len(sequence) for sequence in sequences])
    length = int(lengths.max())
    length += -length % multiple

    def padded(values: Callable[[TextSequence], list[int]], fill: int) -> torch.Tensor:
        out = np.full((len(sequences), length), fill, np.int64)
        for row, sequence in zip(out, sequences):
            row[: len(sequence)] = values(sequence)
        return torch.from_numpy(out)

    return {
        "input_ids": padded(lambda s: s.input_ids, pad_token_id),
        "token_type_ids": padded(lambda s: s.token_type_ids, 0),
        "text_mask": torch.from_numpy(np.arange(length) < lengths[:, None]),
        "text_box_index": padded(lambda s: s.text_box_index, 0),
        "mlm_labels": padded(lambda s: s.labels, IGNORE_INDEX),
    }
