"""The project's one annotation schema: JSON lines, one image each (`vlbert data prepare` writes it
from the benchmarks' published files; the demo world writes it too).

    {"file": "val2014/COCO_val2014_000000000042.jpg",   # relative to the images root; without its
                                                         # extension it is the FeatureStore key
     "image_id": 42,                                     # the dataset's own id (optional)
     "captions": ["a man riding a horse", ...],
     "vqa": [{"question_id": 420, "question": "...", "answers": [ten answers as published],
              "answer_type": "yes/no", "question_type": "is the"}],   # answers [] on test splits
     "refs": [{"sent_id": 7, "ref_id": 3, "text": "left horse", "box": [x1, y1, x2, y2]}],
     "vcr": [{"annot_id": "val-0", "question": TAGGED, "answer_choices": [TAGGED x4],
              "rationale_choices": [TAGGED x4], "answer_label": 1, "rationale_label": 2}],
     "objects": ["person", "horse", ...],                # VCR: the category of each given box
     "snli_ve": [{"pair_id": "...", "hypothesis": "...", "label": "entailment"}],   # label null: unlabelled
     "nlvr2": [{"identifier": "dev-850-0-0", "sentence": "...", "label": true,        # label null: unlabelled
                "right": "dev/dev-850-0-img1.png"}]}   # on the left image's record; the right image's file

Every key but `file` is optional; `{"question", "answer"}` is read as one answer. TAGGED is a list
of tokens, each a word or [word, object] where `object` indexes the image's boxes (the boxes file
of given-box extraction, in its order): that word's visual feature is the object's RoI feature.

The item kinds are one registry, `ITEM_KINDS`, listed whole in this module, so that every reader (a
dataset, `vlbert vocab build`) knows every kind whatever else it imported: a task whose items are
none of these adds its kind here (its JSON key, its parser, its texts).

`AnnotationFile` indexes a file in one streaming pass into NumPy arrays (the offset of each line,
and each item's line and position) and parses a line when a sample needs it, so datasets of
millions of items cost a few bytes per item, shared by DataLoader workers rather than copied.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from train.data.files import DataError, parse_json_line, read_text
from train.evaluation.vqa_answers import answer_scores, normalize_answer

Token = str | tuple[str, int]  # a word, or a word tagged with the index of the object it names


@dataclass
class Question:
    question: str
    answers: list[str]  # as published (VQA v2: ten); empty on test splits
    question_id: int | None = None
    answer_type: str | None = None
    question_type: str | None = None


@dataclass
class Reference:
    text: str
    box: list[float]  # xyxy, pixels
    sent_id: int | None = None
    ref_id: int | None = None


@dataclass
class CommonsenseQuestion:
    """A VCR annotation: a question, four answers and four rationales, with their labels."""

    annot_id: str
    question: list[Token]
    answer_choices: list[list[Token]]
    rationale_choices: list[list[Token]]
    answer_label: int | None = None  # None on the test split
    rationale_label: int | None = None


# SNLI-VE's gold labels, in the order a classifier's outputs give them.
ENTAILMENT_LABELS = ("entailment", "neutral", "contradiction")


@dataclass
class EntailmentPair:
    """An SNLI-VE pair: a hypothesis that the image (the premise) entails, contradicts, or neither."""

    pair_id: str
    hypothesis: str
    label: str | None = None  # one of ENTAILMENT_LABELS; None where unlabelled


@dataclass
class StatementPair:
    """An NLVR2 item: a statement about a pair of images, true or false of the pair; the item sits on
    the left image's record and names the right image's file."""

    identifier: str  # split-setid-pairid-sentenceid, as published
    sentence: str
    right: str  # the right image's file, relative to the images root
    label: bool | None = None  # None where unlabelled

    @property
    def right_image_id(self) -> str:
        """The right image's FeatureStore key."""
        return Path(self.right).with_suffix("").as_posix()


@dataclass
class ImageAnnotation:
    image_id: str  # the FeatureStore key
    file: str
    items_by_kind: dict[str, list] = field(default_factory=dict)  # an ITEM_KINDS key → the record's items
    objects: list[str] = field(default_factory=list)

    def items(self, kind: str) -> list:
        return self.items_by_kind.get(kind, [])

    # The kinds that the data layer reads too (the vocabulary, word pieces, phrases).
    @property
    def captions(self) -> list[str]:
        return self.items("captions")

    @property
    def questions(self) -> list[Question]:
        return self.items("vqa")

    @property
    def refs(self) -> list[Reference]:
        return self.items("refs")

    @property
    def vcr(self) -> list[CommonsenseQuestion]:
        return self.items("vcr")


@dataclass(frozen=True)
class ItemKind:
    parse: Callable[[Any, Mapping[str, Any]], Any]  # (the item's JSON value, the whole record) → the item
    texts: Callable[[list], list[str]] = lambda items: []  # a record's items → their texts, for vocabularies


def parse_annotation(record: Any) -> ImageAnnotation:
    """An ImageAnnotation from one line's JSON value; KeyError, TypeError or ValueError if malformed."""
    if not isinstance(record, dict):
        raise TypeError(f"expected a JSON object, found {type(record).__name__}")
    file = record["file"]
    if not isinstance(file, str):
        raise TypeError("`file` must be a string")
    # `objects` belongs to VCR's items; other writers (the demo world) may use the key for their own.
    objects = [_text(name) for name in record.get("objects", [])] if "vcr" in record else []
    return ImageAnnotation(
        image_id=Path(file).with_suffix("").as_posix(),
        file=file,
        items_by_kind={key: [kind.parse(item, record) for item in record.get(key, [])] for key, kind in ITEM_KINDS.items()},
        objects=objects,
    )


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a text, found {value!r}")
    return value


def _box(value: Any) -> list[float]:
    box = [float(v) for v in value]
    if len(box) != 4:
        raise ValueError(f"a box is [x1, y1, x2, y2], found {value!r}")
    return box


def _question(q: dict) -> Question:
    answers = [_text(a) for a in q["answers"]] if "answers" in q else [_text(q["answer"])] if "answer" in q else []
    return Question(_text(q["question"]), answers, q.get("question_id"), q.get("answer_type"), q.get("question_type"))


def _commonsense(v: dict, num_objects: int) -> CommonsenseQuestion:
    def tagged(tokens: Any) -> list[Token]:
        if not isinstance(tokens, list):
            raise TypeError(f"annotation {v.get('annot_id')!r}: expected a list of tokens, found {tokens!r}")
        result: list[Token] = []
        for token in tokens:
            if isinstance(token, list) and len(token) == 2 and isinstance(token[1], int):
                if not 0 <= token[1] < num_objects:
                    raise ValueError(f"annotation {v.get('annot_id')!r}: token {token!r} names object {token[1]}, "
                                     f"but the image has {num_objects} objects")
                result.append((_text(token[0]), token[1]))
            else:
                result.append(_text(token))
        return result

    def choices(name: str) -> list[list[Token]]:
        return [tagged(choice) for choice in v[name]]

    return CommonsenseQuestion(str(v["annot_id"]), tagged(v["question"]), choices("answer_choices"),
                               choices("rationale_choices"), v.get("answer_label"), v.get("rationale_label"))


def _commonsense_texts(items: list[CommonsenseQuestion]) -> list[str]:
    """VCR's questions, answers and rationales as the words the model reads (a tagged object as its word)."""
    return [" ".join(token if isinstance(token, str) else token[0] for token in tokens)
            for item in items for tokens in (item.question, *item.answer_choices, *item.rationale_choices)]


def _entailment_pair(item: Any) -> EntailmentPair:
    pair_id, hypothesis, label = item["pair_id"], item["hypothesis"], item.get("label")
    if not isinstance(pair_id, str) or not isinstance(hypothesis, str):
        raise TypeError(f"an snli_ve pair needs a string pair_id and hypothesis, found {item!r}")
    if label is not None and label not in ENTAILMENT_LABELS:
        raise ValueError(f"pair {pair_id!r}: label {label!r} is not one of {', '.join(ENTAILMENT_LABELS)}")
    return EntailmentPair(pair_id, hypothesis, label)


def _statement_pair(item: Any) -> StatementPair:
    identifier, sentence, right, label = item["identifier"], item["sentence"], item["right"], item.get("label")
    if not all(isinstance(value, str) for value in (identifier, sentence, right)):
        raise TypeError(f"an nlvr2 item needs a string identifier, sentence and right, found {item!r}")
    if label is not None and not isinstance(label, bool):
        raise ValueError(f"statement {identifier!r}: label {label!r} is not true, false or null")
    return StatementPair(identifier, sentence, right, label)


# Every item kind, by its JSON key in a record; the file indexes each of them when it is opened.
ITEM_KINDS: dict[str, ItemKind] = {
    "captions": ItemKind(lambda c, record: _text(c), texts=list),
    "vqa": ItemKind(lambda q, record: _question(q),
                    texts=lambda questions: [q.question for q in questions] + [a for q in questions for a in q.answers]),
    "refs": ItemKind(lambda r, record: Reference(_text(r["text"]), _box(r["box"]), r.get("sent_id"), r.get("ref_id")),
                     texts=lambda refs: [r.text for r in refs]),
    "vcr": ItemKind(lambda v, record: _commonsense(v, len(record.get("objects", []))), texts=_commonsense_texts),
    "snli_ve": ItemKind(lambda pair, record: _entailment_pair(pair),
                        texts=lambda pairs: [pair.hypothesis for pair in pairs]),
    "nlvr2": ItemKind(lambda item, record: _statement_pair(item),
                      texts=lambda statements: [statement.sentence for statement in statements]),
}


def parse_annotation_line(line: bytes, path: str | Path, number: int) -> ImageAnnotation:
    """Line `number` of annotation file `path`; DataError naming both when it is not a record."""
    try:
        return parse_annotation(parse_json_line(line, path, number))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise DataError(f"{path}:{number}: not an annotation record ({what})") from None


class IndexedAnnotations:
    """Annotations read by index: `a[i]` parses the i-th kept line, `items(kind)` lists (line,
    position) of every item of a kind, `item` reads one. Subclasses give `__len__`, `__getitem__`
    and `items`."""

    def __iter__(self) -> Iterator[ImageAnnotation]:
        return (self[i] for i in range(len(self)))

    def item(self, line_and_position: np.ndarray, kind: str):
        line, position = (int(v) for v in line_and_position)
        annotation = self[line]
        return annotation, annotation.items(kind)[position]


class AnnotationFile(IndexedAnnotations):
    """An annotation file, indexed: `file[i]` parses the i-th kept line, `items(kind)` lists (line,
    position) of every item of a kind. `keep(image_id)` drops images (those the store lacks) while
    indexing; `dropped` counts them."""

    def __init__(self, path: str | Path, keep: Callable[[str], bool] | None = None) -> None:
        self.path = Path(path)
        offsets: list[int] = []
        counts: dict[str, list[int]] = {kind: [] for kind in ITEM_KINDS}
        self.dropped = 0
        for offset, annotation in self._scan():
            if keep is not None and not keep(annotation.image_id):
                self.dropped += 1
                continue
            offsets.append(offset)
            for kind in ITEM_KINDS:
                counts[kind].append(len(annotation.items(kind)))
        self.offsets = np.asarray(offsets, np.int64)
        self._counts = {kind: np.asarray(c, np.int32) for kind, c in counts.items()}
        self._handle = None
        self._handle_pid = None

    def _scan(self) -> Iterator[tuple[int, ImageAnnotation]]:
        try:
            with self.path.open("rb") as f:
                offset = 0
                for number, line in enumerate(f, 1):
                    if line.strip():
                        yield offset, self._parse(line, number)
                    offset += len(line)
        except OSError as exc:
            raise DataError(f"{self.path}: cannot read ({exc.strerror or exc})") from None

    def _parse(self, line: bytes, number: int) -> ImageAnnotation:
        return parse_annotation_line(line, self.path, number)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> ImageAnnotation:
        # A handle opened before a fork shares its file offset with the other DataLoader workers,
        # so each process opens its own.
        if self._handle is None or self._handle_pid != os.getpid():
            self._handle = self.path.open("rb")
            self._handle_pid = os.getpid()
        self._handle.seek(int(self.offsets[index]))
        return parse_annotation(parse_json_line(self._handle.readline(), self.path, 0))

    def items(self, kind: str) -> np.ndarray:
        """(M, 2) int: the line (index among kept lines) and position of each item of `kind`."""
        counts = self._counts[kind]
        lines = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        starts = np.repeat(np.cumsum(counts, dtype=np.int64) - counts, counts)
        return np.stack([lines, np.arange(len(lines), dtype=np.int64) - starts], 1)

    def item_counts(self) -> dict[str, int]:
        """The number of items of each kind the kept lines hold (kinds with none left out)."""
        return {kind: int(counts.sum()) for kind, counts in self._counts.items() if counts.sum()}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handle": None, "_handle_pid": None}


class MixedAnnotations(IndexedAnnotations):
    """Several annotation files read as one (a stage that trains on two corpora): their lines one
    after the other, so that an epoch's permutation draws each file's items in proportion to its
    number of items."""

    def __init__(self, files: list[AnnotationFile]) -> None:
        self.files = files
        self.path = " + ".join(str(file.path) for file in files)  # for messages
        self.dropped = sum(file.dropped for file in files)
        self._starts = np.cumsum([0] + [len(file) for file in files])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: int) -> ImageAnnotation:
        part = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self.files[part][index - int(self._starts[part])]

    def items(self, kind: str) -> np.ndarray:
        parts = [file.items(kind) + np.array([start, 0]) for file, start in zip(self.files, self._starts)]
        return np.concatenate(parts).astype(np.int64, copy=False)

    def mixture(self) -> list[dict[str, Any]]:
        """Each file with its images, its items of each kind, and its share of them: the proportion
        of that kind's samples drawn from it."""
        counts = [file.item_counts() for file in self.files]
        totals = Counter()
        for count in counts:
            totals.update(count)
        return [{"file": str(file.path), "images": len(file), "items": count,
                 "share": {kind: round(n / totals[kind], 6) for kind, n in count.items()}}
                for file, count in zip(self.files, counts)]


def read_annotations(path: str | Path) -> list[ImageAnnotation]:
    """Every record of a (small) annotation file, parsed."""
    return list(AnnotationFile(path))


class AnswerVocabulary:
    """The answers a VQA head scores, most frequent first; targets are the official soft scores."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.index = {a: i for i, a in enumerate(self.answers)}

    @classmethod
    def from_annotations(cls, annotations) -> AnswerVocabulary:
        """Every normalised answer of the annotations' questions."""
        counts = Counter(normalize_answer(a) for ann in annotations for q in ann.questions for a in q.answers)
        return cls([a for a, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))])

    @classmethod
    def from_file(cls, path: str | Path) -> AnswerVocabulary:
        """An answers.txt written by `vlbert data prepare vqa2`: one answer a line (a BOM that an
        editor added is dropped)."""
        answers = [line for line in read_text(path).splitlines() if line]
        if not answers:
            raise DataError(f"{path}: lists no answers")
        return cls(answers)

    def __len__(self) -> int:
        return len(self.answers)

    def scores(self, answers: list[str]) -> np.ndarray:
        scores = np.zeros(len(self.answers), np.float32)
        for answer, score in answer_scores(answers).items():
            if answer in self.index:
                scores[self.index[answer]] = score
        return scores


def annotation_texts(annotations) -> list[str]:
    """Every text of the annotations, as each item kind gives them: captions, questions, answers,
    referring expressions, VCR's questions, answers and rationales, SNLI-VE's hypotheses."""
    return [text for a in annotations for key, kind in ITEM_KINDS.items() for text in kind.texts(a.items(key))]


def answers_by_type(annotations) -> dict[str | None, list[str]]:
    """The distinct answers of each answer type, in a stable order (multiple-choice distractors)."""
    groups: dict[str | None, set[str]] = {}
    for a in annotations:
        for q in a.questions:
            groups.setdefault(q.answer_type, set()).update(q.answers)
    return {kind: sorted(answers) for kind, answers in groups.items()}
