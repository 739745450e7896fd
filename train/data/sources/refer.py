"""RefCOCO, RefCOCO+ and RefCOCOg as the refer toolkit (github.com/lichengunc/refer) publishes them.

`--root` is the toolkit's DATA folder, or one dataset's own folder when the folder carries the
dataset's name (`.../refcoco+`); the dataset folders hold:

    refcoco+/instances.json, refs(unc).p
    refcoco/instances.json,  refs(unc).p, refs(google).p
    refcocog/instances.json, refs(umd).p, refs(google).p

`instances.json` is COCO format: {"images": [{"id", "file_name", "width", "height"}],
"annotations": [{"id", "image_id", "bbox": [x, y, w, h], "category_id", ...}], "categories"}.
`refs(<split_by>).p` is a pickle, written by Python 2, of a list of refs, one per referred object:
{"ref_id", "ann_id" (the object's annotation in instances.json), "image_id", "split", "category_id",
"file_name" (not the image's file: ignored), "sent_ids", "sentences": [{"sent_id", "sent", "raw",
"tokens"}]}. A pickle can run code when loaded; these are read by vlbert/utils/pickles.py's loader with
no global allowed, so only plain containers, strings and numbers load (Python 2 strings as UTF-8).
A pickle can also share one object between places (its memo): refs that share their sentences,
which would multiply the sentences (N refs sharing one N-sentence list make N² of them), are
refused before any is built. Blank expressions are kept, as the toolkit and its evaluation keep
them.

The images are COCO train2014 (`--images` is the COCO images root, holding `train2014/`). A record
per image: `refs` = [{"sent_id", "ref_id", "text" (the `sent`), "box": the referred object's box,
xyxy}]; items are expressions (sentences). Candidate boxes (boxes.json): the image's ground-truth
annotations in annotation id order, or with the `detections` option those of a detections file.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from train.data.files import DataError, read_json, shown
from train.data.prepare import Preparation, Source, SourceOption, SplitWriter
from vlbert.utils.pickles import load_pickle

IMAGE_FOLDER = "train2014"
UNC_SPLITS = ("train", "val", "testA", "testB")  # testA: people only; testB: other objects
GOOGLE_SPLITS = ("train", "val", "test")
Box = list[float]
KIND_NAMES = {int: "an int", str: "a string", list: "a list"}


@dataclass(frozen=True)
class ReferDataset:
    name: str
    partitions: dict[str, tuple[str, ...]]  # split_by (the refs file's provider) → its splits; default first
    about: str

    @property
    def default_split_by(self) -> str:
        return next(iter(self.partitions))


DATASETS: dict[str, ReferDataset] = {d.name: d for d in (
    ReferDataset("refcoco+", {"unc": UNC_SPLITS}, "refer toolkit DATA/refcoco+: refs(unc).p, instances.json; "
                 "--images: COCO (train2014/)"),
    ReferDataset("refcoco", {"unc": UNC_SPLITS, "google": GOOGLE_SPLITS},
                 "refer toolkit DATA/refcoco: refs(unc).p or refs(google).p (--split-by), instances.json; "
                 "--images: COCO (train2014/)"),
    # RefCOCOg's google partition has no test split and shares images between train and val.
    ReferDataset("refcocog", {"umd": GOOGLE_SPLITS, "google": ("train", "val")},
                 "refer toolkit DATA/refcocog: refs(umd).p or refs(google).p (--split-by), instances.json; "
                 "--images: COCO (train2014/)"),
)}


@dataclass(frozen=True)
class Sentence:
    sent_id: int
    text: str


@dataclass(frozen=True)
class Ref:
    """A referred object and the expressions that name it."""

    ref_id: int
    ann_id: int
    image_id: int
    split: str
    sentences: tuple[Sentence, ...]


@dataclass(frozen=True)
class Annotation:
    image_id: int
    box: Box  # xyxy


@dataclass(frozen=True)
class Instances:
    """instances.json, indexed by id."""

    path: Path
    files: dict[int, str]  # image id → file_name
    annotations: dict[int, Annotation]

    def boxes_by_image(self) -> dict[int, list[Box]]:
        """Every image's annotation boxes, in annotation id order."""
        boxes: dict[int, list[Box]] = defaultdict(list)
        for ann_id in sorted(self.annotations):
            boxes[self.annotations[ann_id].image_id].append(self.annotations[ann_id].box)
        return boxes

    def problem(self, ref: Ref) -> str | None:
        """Why `ref` cannot be used (its object or image is not here), or None."""
        annotation = self.annotations.get(ref.ann_id)
        if annotation is None:
            return f"ref {ref.ref_id}: annotation {ref.ann_id} is not in {self.path}"
        if annotation.image_id != ref.image_id:
            return (f"ref {ref.ref_id}: annotation {ref.ann_id} belongs to image {annotation.image_id}, "
                    f"not {ref.image_id}")
        if ref.image_id not in self.files:
            return f"ref {ref.ref_id}: image {ref.image_id} is not in {self.path}"
        return None


@dataclass(frozen=True)
class ReferFiles:
    refs: Path
    instances: Path
    split_by: str
    splits: tuple[str, ...]  # as published for that split_by


def published_files(root: Path, dataset: str, split_by: str | None = None) -> ReferFiles:
    """Where `dataset`'s files lie under `root` (the DATA folder, or the dataset folder itself when it
    has the dataset's name); `split_by` defaults to unc (refcoco, refcoco+) or umd (refcocog)."""
    spec = DATASETS[dataset]
    split_by = split_by or spec.default_split_by
    if split_by not in spec.partitions:
        raise DataError(f"{dataset}: no split_by {split_by!r}; published: {', '.join(spec.partitions)}")
    root = Path(root)
    folder = root if root.name == dataset and not (root / dataset).is_dir() else root / dataset
    return ReferFiles(folder / f"refs({split_by}).p", folder / "instances.json", split_by,
                      spec.partitions[split_by])


def read_refs(path: Path) -> list[Ref]:
    """The refs of a refs(<split_by>).p file; DataError naming the ref when one is malformed, shares
    its sentences with another, or a sent_id repeats, and for a file without refs."""
    value = load_pickle(path, DataError)
    if not isinstance(value, list):
        raise DataError(f"{path}: expected a list of refs, found {type(value).__name__}")
    if not value:
        raise DataError(f"{path}: holds an empty list of refs")
    _refuse_shared_sentences(path, value)
    refs = list(_parse_each(path, "refs", value, _ref))
    seen = set()
    for ref in refs:
        for sentence in ref.sentences:
            if sentence.sent_id in seen:
                raise DataError(f"{path}: ref {ref.ref_id}: sent_id {sentence.sent_id} appears twice in the file")
            seen.add(sentence.sent_id)
    return refs


def _refuse_shared_sentences(path: Path, refs: list) -> None:
    """DataError when a ref's sentences, or one sentence, is the very object another place holds too
    (the pickle's memo): checked before anything is built from them, in time proportional to the
    file, as their expansion is not. In a published file every sentence is its own (sent_ids are
    unique)."""
    seen: dict[int, str] = {}  # id() of a sentence list or sentence → where it was first met
    for index, ref in enumerate(refs):
        sentences = ref.get("sentences") if isinstance(ref, dict) else None
        if not isinstance(sentences, list) or not sentences:
            continue  # an empty list multiplies nothing; a malformed one is named when parsed
        for key, where in ((id(sentences), f"refs[{index}]'s sentence list"),
                           *((id(s), f"refs[{index}].sentences[{n}]") for n, s in enumerate(sentences))):
            if key in seen:
                raise DataError(f"{path}: {where} is the same object as {seen[key]} (shared through the pickle's "
                                f"memo): each ref has its own sentences in a published refs file")
            seen[key] = where


def _ref(item: Any) -> Ref:
    sentences = tuple(Sentence(_typed(s, "sent_id", int), _typed(s, "sent", str))
                      for s in _typed(item, "sentences", list))
    return Ref(_typed(item, "ref_id", int), _typed(item, "ann_id", int), _typed(item, "image_id", int),
               _typed(item, "split", str), sentences)


def read_instances(path: Path) -> Instances:
    """instances.json; DataError naming the image or annotation that is malformed."""
    value = read_json(path)
    if not isinstance(value, dict) or not all(isinstance(value.get(k), list) for k in ("images", "annotations")):
        raise DataError(f'{path}: expected COCO instances: an object with lists "images" and "annotations"')
    files = dict(_parse_each(path, "images", value["images"], _image))
    annotations = dict(_parse_each(path, "annotations", value["annotations"], _annotation))
    return Instances(path, files, annotations)


def _image(record: Any) -> tuple[int, str]:
    return _typed(record, "id", int), _typed(record, "file_name", str)


def _annotation(record: Any) -> tuple[int, Annotation]:
    return _typed(record, "id", int), Annotation(_typed(record, "image_id", int), xywh_to_xyxy(record["bbox"]))


def read_detections(path: Path) -> dict[int, list[Box]]:
    """Candidate boxes per image id, in file order, from a JSON list of detections
    [{"image_id": int, "bbox" or "box": [x, y, w, h], ...}]: COCO results format, or the refer
    toolkit's detections (MAttNet's res101_coco_minus_refer_notime_dets.json, VL-BERT's proposals)."""
    value = read_json(path)
    if not isinstance(value, list):
        raise DataError(f"{path}: expected a list of detections, found {type(value).__name__}")
    boxes: dict[int, list[Box]] = defaultdict(list)
    for image_id, box in _parse_each(path, "detections", value, _detection):
        boxes[image_id].append(box)
    return boxes


def _detection(record: Any) -> tuple[int, Box]:
    # COCO results name the box "bbox", the refer toolkit's detections "box".
    return _typed(record, "image_id", int), xywh_to_xyxy(record.get("bbox", record.get("box")))


def _parse_each(path: Path, what: str, records: list, parse: Callable[[Any], Any]) -> Iterator[Any]:
    """`parse` of every record; DataError naming the record (`what[index]`) that is malformed."""
    for index, record in enumerate(records):
        try:
            yield parse(record)
        except (KeyError, TypeError, ValueError) as exc:
            reason = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise DataError(f"{path}: {what}[{index}]: {reason}") from None


def _typed(record: Any, key: str, kind: type) -> Any:
    """`record[key]`, checked to be of `kind`; TypeError or KeyError otherwise."""
    if not isinstance(record, dict):
        raise TypeError(f"expected an object, found {shown(record)}")
    value = record[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{key!r} is {shown(value)}, not {KIND_NAMES[kind]}")
    return value


def xywh_to_xyxy(box: Any) -> Box:
    """[x, y, w, h] (COCO) → [x1, y1, x2, y2], continuous pixel coordinates; ValueError if malformed
    (JSON allows NaN and Infinity tokens: refused)."""
    if not (isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)):
        raise ValueError(f"a box is [x, y, w, h], four finite numbers, found {shown(box)}")
    x, y, w, h = (float(v) for v in box)
    if w < 0 or h < 0:
        raise ValueError(f"box {shown(box)} has a negative width or height")
    return [x, y, x + w, y + h]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def prepare_refer(preparation: Preparation, dataset: str) -> None:
    """Options: `split_by` (default unc; umd for refcocog), `detections` (a detections file, see
    `read_detections`, whose boxes replace the ground-truth candidates)."""
    files = published_files(preparation.root, dataset, preparation.options.get("split_by"))
    if not preparation.present({split: files.refs for split in files.splits}):
        preparation.log(f"{dataset}: no {files.refs}")
        return
    refs, instances = read_refs(files.refs), read_instances(files.instances)
    detections = preparation.options.get("detections")
    candidates = read_detections(Path(detections)) if detections else instances.boxes_by_image()
    by_split: dict[str, list[Ref]] = {split: [] for split in files.splits}
    for ref in refs:
        by_split.setdefault(ref.split, []).append(ref)  # a split not in the table is kept as published
    for split, split_refs in by_split.items():
        if not split_refs:
            preparation.summary["absent"].append(split)
            preparation.log(f"{dataset} {split}: no refs in {files.refs}")
            continue
        with preparation.split(split) as writer:
            counts = _write_split(preparation, writer, split_refs, instances, candidates)
            writer.extra = {"split_by": files.split_by, **counts}
    if detections:
        without = sum(1 for boxes in preparation.boxes.values() if not boxes)
        preparation.log(f"{dataset}: {without} of {len(preparation.boxes)} images have no box in {detections}")


def _write_split(preparation: Preparation, writer: SplitWriter, refs: list[Ref], instances: Instances,
                 candidates: dict[int, list[Box]]) -> dict[str, int]:
    """Writes `refs` as a record per image; returns the split's counts of objects and images written."""
    by_image: dict[int, list[Ref]] = defaultdict(list)
    for ref in refs:
        by_image[ref.image_id].append(ref)
    counts = {"refs": 0, "images": 0}
    for image_id, image_refs in preparation.progress(by_image.items(), f"{writer.name} images", len(by_image)):
        usable = []
        for ref in image_refs:
            problem = instances.problem(ref)
            if problem is None:
                usable.append(ref)
                continue
            for sentence in ref.sentences:
                writer.skip(sentence.sent_id, problem)
        if not usable:
            continue
        sent_ids = [sentence.sent_id for ref in usable for sentence in ref.sentences]
        file = writer.find_image(sent_ids, f"{IMAGE_FOLDER}/{instances.files[image_id]}", len(sent_ids))
        if file is None:
            continue
        entries = [{"sent_id": sentence.sent_id, "ref_id": ref.ref_id, "text": sentence.text,
                    "box": instances.annotations[ref.ann_id].box} for ref in usable for sentence in ref.sentences]
        if entries:
            writer.add({"file": file, "image_id": image_id, "refs": entries}, items=len(entries))
            preparation.boxes[file] = candidates.get(image_id, [])
            counts["refs"] += sum(1 for ref in usable if ref.sentences)
            counts["images"] += 1
    return counts


OPTIONS = (
    SourceOption("split_by", str, "the refs file's split provider (unc, umd, google)."),
    SourceOption("detections", Path, "candidate boxes from a detections file instead of the ground-truth boxes."),
)
SOURCES = tuple(Source(d.name, d.partitions[d.default_split_by], partial(prepare_refer, dataset=d.name), d.about,
                       options=OPTIONS,
                       image_names=f"{IMAGE_FOLDER}/<file_name of instances.json without extension>")
                for d in DATASETS.values())
