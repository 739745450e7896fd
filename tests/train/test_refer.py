"""RefCOCO+ (refer toolkit layout) → annotation files, the restricted unpickler, and accuracy at IoU ≥ 0.5."""

from __future__ import annotations

import copy
import itertools
import json
import os
import pickle
import pickletools
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import box_iou

from train.data.annotations import AnnotationFile
from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.sources.refer import SOURCES, Ref, Sentence, published_files, read_refs
from train.evaluation.refer import box_ious, evaluate_refer, score_refer, write_refer_predictions
from vlbert.utils.pickles import load_pickle

REFCOCO_PLUS = SOURCES[0]
IMAGE = "COCO_train2014_{:012d}.jpg"
ANY_IMAGE = "{jpg,jpeg,png,bmp,webp,tif,tiff,gif}"  # the extensions an image is looked for with

# Annotation id → (image id, COCO [x, y, w, h]); listed out of id order to show that boxes come by id.
ANNOTATIONS = {11: (1, [20, 20, 5, 5]), 10: (1, [0, 0, 10, 10]), 20: (2, [1, 2, 30, 40]), 21: (2, [5, 5, 5, 5]),
               30: (3, [0, 0, 8, 8])}
REFS = [
    {"ref_id": 100, "ann_id": 10, "image_id": 1, "split": "train", "category_id": 1, "sent_ids": [1000, 1001],
     "file_name": "COCO_train2014_000000000001_10.jpg",
     "sentences": [{"sent_id": 1000, "sent": "left man", "raw": "Left man", "tokens": ["left", "man"]},
                   {"sent_id": 1001, "sent": "man on left", "raw": "man on left", "tokens": ["man", "on", "left"]}]},
    {"ref_id": 101, "ann_id": 11, "image_id": 1, "split": "train",
     "sentences": [{"sent_id": 1002, "sent": "red ball"}]},
    {"ref_id": 102, "ann_id": 20, "image_id": 2, "split": "val", "sentences": [{"sent_id": 1003, "sent": "dog"}]},
    # Image 3's file is missing: two expressions skipped.
    {"ref_id": 103, "ann_id": 30, "image_id": 3, "split": "val",
     "sentences": [{"sent_id": 1004, "sent": "cat"}, {"sent_id": 1005, "sent": "the cat"}]},
    {"ref_id": 104, "ann_id": 99, "image_id": 2, "split": "testA", "sentences": [{"sent_id": 1006, "sent": "ghost"}]},
    {"ref_id": 105, "ann_id": 21, "image_id": 2, "split": "testA",
     "sentences": [{"sent_id": 1007, "sent": "brown dog"}]},
]


def write_dataset(tmp_path: Path, refs_bytes: bytes | None = None) -> tuple[Path, Path]:
    """DATA/refcoco+/{refs(unc).p, instances.json} and COCO images under coco/train2014 (image 3 absent)."""
    data, coco = tmp_path / "DATA", tmp_path / "coco"
    (data / "refcoco+").mkdir(parents=True)
    (coco / "train2014").mkdir(parents=True)
    instances = {"images": [{"id": i, "file_name": IMAGE.format(i), "width": 64, "height": 48} for i in (1, 2, 3)],
                 "annotations": [{"id": a, "image_id": image, "bbox": bbox, "category_id": 1, "area": 1.0}
                                 for a, (image, bbox) in ANNOTATIONS.items()],
                 "categories": [{"id": 1, "name": "person"}]}
    (data / "refcoco+" / "instances.json").write_text(json.dumps(instances))
    (data / "refcoco+" / "refs(unc).p").write_bytes(refs_bytes or pickle.dumps(REFS, protocol=2))
    for i in (1, 2):
        Image.new("RGB", (8, 6)).save(coco / "train2014" / IMAGE.format(i))
    return data, coco


def prepare(data: Path, coco: Path, out: Path, **options) -> dict:
    return prepare_dataset(REFCOCO_PLUS, data, out, coco, log=lambda line: None, **options)


def lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prepare_writes_an_image_record_per_split_and_counts_expressions(tmp_path):
    data, coco = write_dataset(tmp_path)
    summary = prepare(data, coco, tmp_path / "out")
    out = tmp_path / "out"
    assert lines(out / "train.jsonl") == [{"file": "train2014/" + IMAGE.format(1), "image_id": 1, "refs": [
        {"sent_id": 1000, "ref_id": 100, "text": "left man", "box": [0.0, 0.0, 10.0, 10.0]},
        {"sent_id": 1001, "ref_id": 100, "text": "man on left", "box": [0.0, 0.0, 10.0, 10.0]},
        {"sent_id": 1002, "ref_id": 101, "text": "red ball", "box": [20.0, 20.0, 25.0, 25.0]}]}]
    assert lines(out / "val.jsonl") == [{"file": "train2014/" + IMAGE.format(2), "image_id": 2, "refs": [
        {"sent_id": 1003, "ref_id": 102, "text": "dog", "box": [1.0, 2.0, 31.0, 42.0]}]}]
    assert [r["sent_id"] for r in lines(out / "testA.jsonl")[0]["refs"]] == [1007]
    assert len(AnnotationFile(out / "train.jsonl").items("refs")) == 3  # the trainer reads what was written
    assert summary["splits"] == {
        "train": {"items": 3, "skipped": 0, "missing_images": 0, "split_by": "unc", "refs": 2, "images": 1},
        "val": {"items": 1, "skipped": 2, "missing_images": 2, "split_by": "unc", "refs": 1, "images": 1},
        "testA": {"items": 1, "skipped": 1, "missing_images": 0, "split_by": "unc", "refs": 1, "images": 1}}
    assert summary["absent"] == ["testB"]
    # Candidates: every ground-truth box of the image, by annotation id, xyxy.
    assert json.loads((out / "boxes.json").read_text()) == {
        "train2014/" + IMAGE.format(1): [[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 25.0, 25.0]],
        "train2014/" + IMAGE.format(2): [[1.0, 2.0, 31.0, 42.0], [5.0, 5.0, 10.0, 10.0]]}
    assert (out / "images.txt").read_text().splitlines() == ["train2014/" + IMAGE.format(i) for i in (1, 2, 2)]
    skipped = lines(out / "skipped.jsonl")
    assert [s["id"] for s in skipped] == [[1004, 1005], 1006]  # an image's expressions together
    assert skipped[0]["reason"] == f"no image found as {coco / 'train2014' / IMAGE.format(3)[:-4]}.{ANY_IMAGE}"
    assert "annotation 99 is not in" in skipped[1]["reason"]


def test_detections_replace_the_ground_truth_candidates(tmp_path):
    data, coco = write_dataset(tmp_path)
    # COCO results ("bbox") and the refer toolkit's detections ("box") in one file; image 2 has none.
    detections = [{"image_id": 1, "bbox": [1, 1, 4, 4], "score": 0.9, "category_id": 1},
                  {"image_id": 1, "box": [10, 0, 2, 3], "score": 0.8, "det_id": 7},
                  {"image_id": 7, "bbox": [0, 0, 1, 1], "score": 0.5}]
    (tmp_path / "dets.json").write_text(json.dumps(detections))
    prepare(data, coco, tmp_path / "out", detections=tmp_path / "dets.json")
    assert json.loads((tmp_path / "out" / "boxes.json").read_text()) == {
        "train2014/" + IMAGE.format(1): [[1.0, 1.0, 5.0, 5.0], [10.0, 0.0, 12.0, 3.0]],
        "train2014/" + IMAGE.format(2): []}
    (tmp_path / "dets.json").write_text(json.dumps([{"image_id": 1, "bbox": [1, 1, 4]}]))
    with pytest.raises(DataError, match=r"dets\.json: detections\[0\]: a box is \[x, y, w, h\]"):
        prepare(data, coco, tmp_path / "out", detections=tmp_path / "dets.json")


def test_root_may_be_the_dataset_folder_and_split_by_picks_the_refs_file(tmp_path):
    data, coco = write_dataset(tmp_path)
    summary = prepare(data / "refcoco+", coco, tmp_path / "out")
    assert summary["splits"]["train"]["items"] == 3
    files = published_files(data, "refcoco", "google")
    assert (files.refs, files.splits) == (data / "refcoco" / "refs(google).p", ("train", "val", "test"))
    assert published_files(data, "refcocog").refs.name == "refs(umd).p"
    with pytest.raises(DataError, match="refcoco\\+: no split_by 'google'; published: unc"):
        prepare(data, coco, tmp_path / "out", split_by="google")


def test_a_ref_whose_annotation_belongs_to_another_image_is_skipped(tmp_path):
    refs = [{"ref_id": 1, "ann_id": 20, "image_id": 1, "split": "train", "sentences": [{"sent_id": 5, "sent": "x"}]},
            {"ref_id": 2, "ann_id": 10, "image_id": 1, "split": "train", "sentences": [{"sent_id": 6, "sent": "y"}]}]
    data, coco = write_dataset(tmp_path, pickle.dumps(refs))
    summary = prepare(data, coco, tmp_path / "out")
    assert summary["splits"]["train"] == {"items": 1, "skipped": 1, "missing_images": 0, "split_by": "unc",
                                          "refs": 1, "images": 1}
    assert "annotation 20 belongs to image 2, not 1" in lines(tmp_path / "out" / "skipped.jsonl")[0]["reason"]


class RunsAShellCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("kind", ["reduce", "protocol-0 eval"])
def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path, kind):
    marker = tmp_path / "pwned"
    if kind == "reduce":
        stream, refused = pickle.dumps([RunsAShellCommand(marker)], protocol=2), f"{os.system.__module__}.system"
    else:
        stream, refused = f"cbuiltins\neval\n(S'open(\"{marker}\", \"w\")'\ntR.".encode(), "builtins.eval"
    # The stream really asks for a global and calls it.
    assert {"GLOBAL", "REDUCE"} <= {op.name for op, _, _ in pickletools.genops(stream)}
    data, coco = write_dataset(tmp_path, stream)
    with pytest.raises(DataError) as error:
        prepare(data, coco, tmp_path / "out")
    assert str(error.value) == (f"{data / 'refcoco+' / 'refs(unc).p'}: refused to load {refused}: "
                                "the file holds more than plain data")
    assert not marker.exists()


def python2_pickle(value) -> bytes:
    """`value` as Python 2's cPickle.dump(value, f, 2) writes it, assembled opcode by opcode: bytes stand
    for Python 2 `str` (SHORT_BINSTRING), str for `unicode` (BINUNICODE), ints take the smallest of
    BININT1 / BININT2 / BININT, ints of 2**31 and more stand for `long` (LONG1); every container and
    string is memoized (BINPUT) and a repeated string is read back from the memo (BINGET), as Python 2
    interns dict keys; lists and dicts of several items are batched between MARK and APPENDS /
    SETITEMS, a single item uses APPEND / SETITEM."""
    memo_size = itertools.count()
    strings: dict[bytes | str, int] = {}

    def memoize() -> tuple[int, bytes]:
        index = next(memo_size)
        return index, b"q" + bytes([index])

    def emit(item) -> bytes:
        if isinstance(item, (bytes, str)):
            if item in strings:
                return b"h" + bytes([strings[item]])
            encoded = item if isinstance(item, bytes) else item.encode("utf-8")
            code = b"U" + bytes([len(encoded)]) if isinstance(item, bytes) else b"X" + struct.pack("<I", len(encoded))
            strings[item], put = memoize()
            return code + encoded + put
        if isinstance(item, int):
            if item < 2 ** 8:
                return b"K" + bytes([item])
            if item < 2 ** 16:
                return b"M" + struct.pack("<H", item)
            if item < 2 ** 31:
                return b"J" + struct.pack("<i", item)
            encoded = item.to_bytes((item.bit_length() + 8) // 8, "little", signed=True)
            return b"\x8a" + bytes([len(encoded)]) + encoded
        opened = (b"]" if isinstance(item, list) else b"}") + memoize()[1]
        parts = [emit(x) for x in item] if isinstance(item, list) else [emit(k) + emit(v) for k, v in item.items()]
        batch, single = (b"e", b"a") if isinstance(item, list) else (b"u", b"s")
        if len(parts) > 1:
            return opened + b"(" + b"".join(parts) + batch
        return opened + b"".join(parts) + (single if parts else b"")

    return b"\x80\x02" + emit(value) + b"."


PYTHON2_REF = {b"ref_id": 7, b"ann_id": 20, b"image_id": 2 ** 40, b"split": b"val", b"category_id": 18,
               b"sent_ids": [1003, 1008], b"file_name": b"COCO_train2014_000000000002_20.jpg",
               b"sentences": [{b"sent_id": 1003, b"sent": "dog on the right", b"raw": "Dog on the right",
                               b"tokens": ["dog", "on", "the", "right"]},
                              {b"sent_id": 1008, b"sent": b"caf\xc3\xa9 dog", b"raw": b"caf\xc3\xa9 dog",
                               b"tokens": [b"caf\xc3\xa9", b"dog"]}]}


PYTHON2_PROTOCOL0 = (  # cPickle.dump([ref], f) as Python 2 writes it by default (protocol 0), by hand
    b"(lp0\n(dp1\nS'split'\np2\nS'val'\np3\nsS'ref_id'\np4\nI7\nsS'ann_id'\np5\nI20\nsS'image_id'\np6\n"
    b"L1099511627776L\nsS'sentences'\np7\n(lp8\n(dp9\nS'sent_id'\np10\nI1003\nsS'sent'\np11\n"
    b"Vdog on the right\np12\nsa(dp13\ng10\nI1008\nsg11\nS'caf\\xc3\\xa9 dog'\np14\nsasa.")


@pytest.mark.parametrize("protocol", [2, 0])
def test_a_refs_file_written_by_python_2_loads(tmp_path, protocol):
    stream = python2_pickle([PYTHON2_REF]) if protocol == 2 else PYTHON2_PROTOCOL0
    if protocol == 2:  # a well-formed stream of Python 2's opcodes (pickletools cannot read non-ASCII STRINGs)
        opcodes = {op.name for op, _, _ in pickletools.genops(stream)}
        assert {"PROTO", "SHORT_BINSTRING", "BINUNICODE", "BINGET", "BININT2", "LONG1", "SETITEMS", "APPEND"} <= opcodes
        assert not {"GLOBAL", "STACK_GLOBAL", "REDUCE"} & opcodes
    path = tmp_path / "refs(unc).p"
    path.write_bytes(stream)
    assert read_refs(path) == [Ref(7, 20, 2 ** 40, "val", (Sentence(1003, "dog on the right"),
                                                          Sentence(1008, "café dog")))]


def test_damaged_or_malformed_refs_files_are_refused(tmp_path):
    path = tmp_path / "refs(unc).p"
    for stream, message in [
            (pickle.dumps(REFS)[:40], "not a readable pickle"),
            (pickle.dumps({"refs": []}), "expected a list of refs, found dict"),
            (pickle.dumps([{"ref_id": 1, "ann_id": 2, "image_id": 3, "split": "val"}]),
             r"refs\[0\]: missing key 'sentences'"),
            (pickle.dumps([{**REFS[2], "ref_id": "102"}]), r"refs\[0\]: 'ref_id' is '102', not an int"),
            (pickle.dumps([REFS[2], copy.deepcopy(REFS[2])]), "ref 102: sent_id 1003 appears twice"),
            (b"\x80\x02U\x02\xff\xfeq\x00.", "a Python 2 byte string that is not UTF-8")]:
        path.write_bytes(stream)
        with pytest.raises(DataError, match=message):
            read_refs(path)


def test_memory_stays_proportional_to_the_file(tmp_path):
    path = tmp_path / "refs(unc).p"
    path.write_bytes(b"]r\x00\x00\x00\x01.")  # a list memoized at index 2**24: 256 MB in the C unpickler
    tracemalloc.start()
    try:
        assert load_pickle(path, DataError) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 ** 20
    path.write_bytes(b"\x80\x05\x96" + (2 ** 62).to_bytes(8, "little") + b".")  # a 4-EiB bytearray, stated
    with pytest.raises(DataError, match="not a readable pickle .*a bytearray of 4611686018427387904 bytes in a file of 12"):
        load_pickle(path, DataError)


def test_malformed_instances_are_refused(tmp_path):
    data, coco = write_dataset(tmp_path)
    instances = data / "refcoco+" / "instances.json"
    for value, message in [({"images": []}, 'lists "images" and "annotations"'),
                           ({"images": [], "annotations": [{"id": 1, "image_id": 1, "bbox": [0, 0, 1]}]},
                            r"annotations\[0\]: a box is \[x, y, w, h\]"),
                           ({"images": [{"id": 1}], "annotations": []}, r"images\[0\]: missing key 'file_name'")]:
        instances.write_text(json.dumps(value))
        with pytest.raises(DataError, match=message):
            prepare(data, coco, tmp_path / "out")
    instances.write_text("{")
    with pytest.raises(DataError, match="instances.json: invalid JSON"):
        prepare(data, coco, tmp_path / "out")


def test_score_counts_iou_of_at_least_one_half():
    truth = {1: [0, 0, 100, 1], 2: [0, 0, 100, 1], 3: [0, 0, 10, 10], 4: [0, 0, 10, 10], 5: [0, 0, 10, 10]}
    predictions = {1: [0, 0, 49, 1],     # 49 / 100 = 0.49: missed
                   2: [0, 0, 50, 1],     # 50 / 100 = 0.5: found
                   3: [5, 0, 15, 10],    # 50 / 150 = 0.33: missed
                   4: [1, 1, 9, 9],      # 64 / 100 = 0.64: found
                   5: [10, 10, 20, 20]}  # touching corners: 0
    assert score_refer(truth, predictions) == {"accuracy": 40.0, "count": 5}
    assert score_refer({k: truth[k] for k in (1, 2, 4)}, predictions) == {"accuracy": 66.67, "count": 3}
    assert score_refer({}, {}) == {"accuracy": 0.0, "count": 0}


def test_box_ious_are_torchvisions_bit_for_bit_signed_zeros_and_non_finite_boxes_included():
    """Training's IoU targets (referring expressions, grounding) were torchvision's: the same bits."""
    rng = np.random.default_rng(0)
    values = np.array([0.0, -0.0, 1.0, 2.0, -1.0, 3.5, np.nan, np.inf, -np.inf, 3e38], np.float32)
    for trial in range(300):
        count = int(rng.integers(1, 110))
        boxes = (rng.random((count, 4)) * 300 - 50).astype(np.float32)
        if trial % 2:  # few distinct values: many ties, equal and inverted boxes, +0 against -0
            boxes = rng.choice(values[:6] if trial % 4 == 1 else values, (count, 4))
        targets = rng.choice(values[:6], (int(rng.integers(1, 4)), 4)).tolist()
        expected = box_iou(torch.from_numpy(boxes), torch.tensor(targets, dtype=torch.float32)).numpy()
        assert box_ious(boxes, targets).tobytes() == expected.tobytes(), trial


def test_evaluate_reads_the_truth_from_the_published_files(tmp_path):
    data, _ = write_dataset(tmp_path)
    predictions = tmp_path / "val.json"
    # val: 1003 → ann 20 [1, 2, 31, 42]; 1004 and 1005 → ann 30 [0, 0, 8, 8] (its image file plays no part).
    write_refer_predictions(predictions, {1003: [1, 2, 31, 42], 1005: [4, 0, 12, 8], 1004: [0, 0, 8, 4]})
    assert json.loads(predictions.read_text())[0] == {"sent_id": 1003, "box": [1.0, 2.0, 31.0, 42.0]}
    # 1003: 1.0; 1004: 32 / 64 = 0.5; 1005: 32 / 96 = 0.33.
    assert evaluate_refer(data, "refcoco+", "val", predictions) == {"accuracy": 66.67, "count": 3}
    # testA: 1006's annotation is not in instances.json; it is left out as the preparation leaves it out.
    write_refer_predictions(predictions, {1007: [5, 5, 10, 10]})
    assert evaluate_refer(data, "refcoco+", "testA", predictions) == {"accuracy": 100.0, "count": 1}


def test_evaluate_refuses_missing_unknown_and_repeated_ids_and_unknown_splits(tmp_path):
    data, _ = write_dataset(tmp_path)
    predictions = tmp_path / "val.json"
    write_refer_predictions(predictions, {1003: [0, 0, 1, 1], 1004: [0, 0, 1, 1], 42: [0, 0, 1, 1]})
    with pytest.raises(DataError) as error:
        evaluate_refer(data, "refcoco+", "val", predictions)
    assert str(error.value) == (f"{predictions}: 1 of 3 sent_ids have no prediction (first: 1005); "
                                "1 predictions name unknown sent_ids (first: 42)")
    predictions.write_text(json.dumps([{"sent_id": s, "box": [0, 0, 1, 1]} for s in (1003, 1003, 1004, 1005)]))
    with pytest.raises(DataError, match=r"1 sent_ids predicted more than once \(first: 1003\)"):
        evaluate_refer(data, "refcoco+", "val", predictions)
    with pytest.raises(DataError, match=r"refs\(unc\)\.p: no split 'testB'; the file holds train, val, testA"):
        evaluate_refer(data, "refcoco+", "testB", predictions)


def test_evaluate_refuses_malformed_predictions(tmp_path):
    data, _ = write_dataset(tmp_path)
    predictions = tmp_path / "val.json"
    for value, message in [({"1003": [0, 0, 1, 1]}, "expected a list of"),
                           ([{"ref_id": 102, "box": [0, 0, 1, 1]}], "prediction 0: expected"),
                           ([{"sent_id": 1003, "box": [0, 0, 1]}], r"prediction 0 \(sent_id 1003\): box \[0, 0, 1\]"),
                           ([{"sent_id": 1003, "box": [0, 0, "1", 1]}], "not four finite numbers")]:
        predictions.write_text(json.dumps(value))
        with pytest.raises(DataError, match=message):
            evaluate_refer(data, "refcoco+", "val", predictions)
