"""VCR (Visual Commonsense Reasoning, Zellers et al., CVPR 2019) as published at visualcommonsense.com.

Layout read:
    --root    train.jsonl, val.jsonl, test.jsonl (from vcr1annots.zip), one annotation a line:
              {"annot_id": "val-0", "img_fn": "lsmdc_.../x.jpg", "metadata_fn": "lsmdc_.../x.json",
               "objects": ["person", "person", "car", ...], "question": TOKENS,
               "answer_choices": [TOKENS x4], "rationale_choices": [TOKENS x4],
               "answer_label": int, "rationale_label": int, ...}   (no labels in test.jsonl)
              TOKENS: a list of words (str) and object references: lists of indices into `objects`.
    --images  the vcr1images folder (from vcr1images.zip); without --images, root/vcr1images.
              `img_fn` and `metadata_fn` are relative to it; a metadata file holds {"boxes": [[x1, y1, x2, y2, score], ...] (pixels,
              one per entry of `objects`, same order), "segms": [...], "width", "height", ...}.

Written: one record per image ({"file": img_fn, "objects": [...], "vcr": [...]}, annotations in the
project's tagged form, labels on train and val only) and boxes.json (img_fn → the metadata boxes as
[x1, y1, x2, y2], score dropped, metadata order: object index i is the i-th box). Items are
annotations. An annotation is skipped (and counted, with its reason) when its image or metadata file
is missing, unreadable or outside the images folder (an absolute path, or `..`), when a metadata box
is not finite or is inverted (x2 < x1 or y2 < y1), when the metadata boxes do not match `objects`
one to one, when `objects` differ from an earlier annotation of the same image, or when a token
names an object the image does not have. A line that is not a VCR annotation, and an `annot_id`
that appears twice in a file (which `vlbert evaluate vcr` refuses too), fail the run. The image is
found with any extension extraction reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from train.data.files import DataError, iter_jsonl, read_json, shown
from train.data.prepare import Preparation, SplitWriter, Source, outside

SPLITS = ("train", "val", "test")
UNLABELLED = ("test",)  # test.jsonl publishes no labels: the leaderboard holds them
IMAGES_FOLDER = "vcr1images"
CHOICES = 4

# VL-BERT's VCR reader (jackroos/VL-BERT, vcr/data/datasets/vcr.py) shows a "person" object to the
# text as one of these gender-neutral names, handed out in turn; R2C (rowanz/r2c) does the same with a
# slightly different list. VL-BERT's turn counter runs on across samples; here it restarts at every
# image, so an image's k-th person is always names[k mod 13] and the prepared files are reproducible.
PERSON_NAMES = ("Casey", "Riley", "Jessie", "Jackie", "Avery", "Jaime", "Peyton", "Kerry", "Jody", "Kendall",
                "Frankie", "Pat", "Quinn")
PERSON = "person"

Token = str | list[int]  # as published: a word, or references to objects
Tagged = str | list[Any]  # the project's schema: a word, or [word, object index]
Fail = Callable[[str], DataError]  # what is wrong → the error naming the file and line


@dataclass
class VcrAnnotation:
    """One line of a VCR annotation file, checked for shape."""

    annot_id: str
    img_fn: str
    metadata_fn: str
    objects: list[str]
    question: list[Token]
    answer_choices: list[list[Token]]
    rationale_choices: list[list[Token]]
    answer_label: int | None  # None on the test split
    rationale_label: int | None

    def texts(self) -> Iterator[list[Token]]:
        yield self.question
        yield from self.answer_choices
        yield from self.rationale_choices


@dataclass
class VcrImage:
    """One image's record under construction: its objects, their boxes, the annotations kept so far."""

    file: str
    objects: list[str]
    boxes: list[list[float]]
    annotations: list[dict[str, Any]] = field(default_factory=list)


def parse_annotation(value: Any, path: Path, line: int, labelled: bool) -> VcrAnnotation:
    """The annotation on `line` of `path`; DataError naming the line when it is not one."""
    def fail(what: str) -> DataError:
        return DataError(f"{path}:{line}: {what}")

    if not isinstance(value, dict):
        raise fail(f"expected a JSON object, found {type(value).__name__}")
    for key in ("annot_id", "img_fn", "metadata_fn"):
        if not isinstance(value.get(key), str):
            raise fail(f"{key!r}: expected a string, found {shown(value.get(key))}")
    objects = value.get("objects")
    if not isinstance(objects, list) or not all(isinstance(o, str) for o in objects):
        raise fail(f"'objects': expected a list of category words, found {shown(objects)}")
    question = _tokens(value.get("question"), "question", fail)
    choices = {key: _choices(value.get(key), key, fail) for key in ("answer_choices", "rationale_choices")}
    labels = {key: _label(value.get(key), key, fail) if labelled else None
              for key in ("answer_label", "rationale_label")}
    return VcrAnnotation(value["annot_id"], value["img_fn"], value["metadata_fn"], objects, question, **choices,
                         **labels)


def _tokens(value: Any, what: str, fail: Fail) -> list[Token]:
    def is_token(token: Any) -> bool:
        return isinstance(token, str) or (isinstance(token, list) and len(token) > 0 and all(
            isinstance(i, int) and not isinstance(i, bool) for i in token))

    if not isinstance(value, list) or not all(is_token(t) for t in value):
        raise fail(f"{what!r}: expected a list of words and object-index lists, found {shown(value)}")
    return value


def _choices(value: Any, what: str, fail: Fail) -> list[list[Token]]:
    if not isinstance(value, list) or len(value) != CHOICES:
        raise fail(f"{what!r}: expected {CHOICES} choices, found {shown(value)}")
    return [_tokens(choice, f"{what}[{n}]", fail) for n, choice in enumerate(value)]


def _label(value: Any, what: str, fail: Fail) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < CHOICES:
        raise fail(f"{what!r}: expected a choice index 0-{CHOICES - 1}, found {shown(value)}")
    return value


def object_words(objects: list[str]) -> list[str]:
    """The word the text shows for each object: its category, a gender-neutral name for a person."""
    words, people = [], 0
    for category in objects:
        if category == PERSON:
            words.append(PERSON_NAMES[people % len(PERSON_NAMES)])
            people += 1
        else:
            words.append(category)
    return words


def tag_tokens(tokens: list[Token], words: list[str]) -> list[Tagged]:
    """Published tokens → the schema's tagged tokens. A reference [i] becomes [words[i], i]; one to
    several objects [i, j] becomes [words[i], i], "and", [words[j], j], as VL-BERT's VCR reader
    spells it (R2C instead puts the names side by side, without "and")."""
    tagged: list[Tagged] = []
    for token in tokens:
        if isinstance(token, str):
            tagged.append(token)
            continue
        for n, index in enumerate(token):
            if n:
                tagged.append("and")
            tagged.append([words[index], index])
    return tagged


def bad_reference(annotation: VcrAnnotation) -> int | None:
    """The first object index that `annotation`'s texts name but its objects do not hold."""
    count = len(annotation.objects)
    return next((index for text in annotation.texts() for token in text if isinstance(token, list)
                 for index in token if not 0 <= index < count), None)


def read_metadata_boxes(path: Path) -> list[list[float]]:
    """The [x1, y1, x2, y2] of every box in a VCR metadata file, in its order (scores dropped);
    DataError for a box that is not finite or is inverted (JSON allows NaN and Infinity tokens)."""
    metadata = read_json(path)
    boxes = metadata.get("boxes") if isinstance(metadata, dict) else None
    if not isinstance(boxes, list):
        raise DataError(f"{path}: no 'boxes' list")
    for n, box in enumerate(boxes):
        if not (isinstance(box, list) and len(box) == 5
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)):
            raise DataError(f"{path}: box {n} is {shown(box)}, expected [x1, y1, x2, y2, score]")
        x1, y1, x2, y2 = (float(v) for v in box[:4])
        if not all(map(math.isfinite, (x1, y1, x2, y2))) or x2 < x1 or y2 < y1:
            raise DataError(f"{path}: box {n} is {shown(box)}, expected finite x1 <= x2 and y1 <= y2")
    return [[float(v) for v in box[:4]] for box in boxes]


def tagged_annotation(annotation: VcrAnnotation) -> dict[str, Any]:
    """The annotation in the schema's `vcr` form (labels only where published)."""
    words = object_words(annotation.objects)
    record: dict[str, Any] = {
        "annot_id": annotation.annot_id,
        "question": tag_tokens(annotation.question, words),
        "answer_choices": [tag_tokens(choice, words) for choice in annotation.answer_choices],
        "rationale_choices": [tag_tokens(choice, words) for choice in annotation.rationale_choices],
    }
    if annotation.answer_label is not None:
        record.update(answer_label=annotation.answer_label, rationale_label=annotation.rationale_label)
    return record


class SplitReader:
    """Streams one split's annotations into per-image records; only the converted annotations are
    kept (an image's lines need not be adjacent)."""

    def __init__(self, preparation: Preparation, writer: SplitWriter, path: Path) -> None:
        self.preparation, self.writer, self.path = preparation, writer, path
        self.labelled = writer.name not in UNLABELLED
        self.images: dict[str, VcrImage] = {}  # by img_fn, in order of first appearance

    def read(self) -> None:
        first_line: dict[str, int] = {}  # annot_id → its line
        for line, value in self.preparation.progress(iter_jsonl(self.path), self.writer.name):
            annotation = parse_annotation(value, self.path, line, self.labelled)
            if annotation.annot_id in first_line:
                raise DataError(f"{self.path}:{line}: annot_id {shown(annotation.annot_id)} appears again (first on "
                                f"line {first_line[annotation.annot_id]}); `vlbert evaluate vcr` needs each once")
            first_line[annotation.annot_id] = line
            self.add(annotation)
        for image in self.images.values():
            if image.annotations:
                self.writer.add({"file": image.file, "objects": image.objects, "vcr": image.annotations},
                                len(image.annotations))
                self.preparation.boxes[image.file] = image.boxes
        self.writer.extra["images"] = sum(1 for image in self.images.values() if image.annotations)

    def add(self, annotation: VcrAnnotation) -> None:
        image = self.images.get(annotation.img_fn) or self.open_image(annotation)
        if image is None:
            return
        if annotation.objects != image.objects:
            self.writer.skip(annotation.annot_id, f"'objects' differ from an earlier annotation of {image.file}")
        elif (index := bad_reference(annotation)) is not None:
            self.writer.skip(annotation.annot_id, f"refers to object {index}, but the image has "
                                                  f"{len(annotation.objects)} objects")
        else:
            image.annotations.append(tagged_annotation(annotation))

    def open_image(self, annotation: VcrAnnotation) -> VcrImage | None:
        """The image of `annotation` with its metadata boxes, or None (the annotation skipped)."""
        file = self.writer.find_image(annotation.annot_id, annotation.img_fn)
        if file is None:
            return None
        if outside(annotation.metadata_fn):
            self.writer.skip(annotation.annot_id, f"metadata_fn {shown(annotation.metadata_fn)} lies outside the "
                                                  f"images folder {self.preparation.images}")
            return None
        metadata = self.preparation.images / annotation.metadata_fn
        try:
            boxes = read_metadata_boxes(metadata)
        except DataError as exc:  # one image's metadata: its annotations are skipped, the run goes on
            self.writer.skip(annotation.annot_id, f"metadata unusable: {exc}")
            return None
        if len(boxes) != len(annotation.objects):
            self.writer.skip(annotation.annot_id, f"{metadata} holds {len(boxes)} boxes for "
                                                  f"{len(annotation.objects)} objects")
            return None
        image = self.images[annotation.img_fn] = VcrImage(file, annotation.objects, boxes)
        return image


def prepare(preparation: Preparation) -> None:
    for split in preparation.present({split: preparation.root / f"{split}.jsonl" for split in SPLITS}):
        with preparation.split(split) as writer:
            SplitReader(preparation, writer, preparation.root / f"{split}.jsonl").read()


SOURCE = Source("vcr", SPLITS, prepare, about="VCR: train/val/test.jsonl under --root, the vcr1images folder "
                                              "as --images (default root/vcr1images)", images_folder=IMAGES_FOLDER,
                image_names="<img_fn without extension>")
