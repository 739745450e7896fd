"""VCR: the published annotation files → the project's schema, and the leaderboard CSV and metrics."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.sources.vcr import SOURCE
from train.evaluation.vcr import (VcrPrediction, evaluate_vcr, merge_vcr_predictions, read_vcr_csv, score_vcr,
                                  write_vcr_csv)

MOVIE = "lsmdc_1001_Movie"
SCENE_A, SCENE_B, SCENE_C = (f"{MOVIE}/1001_Movie_00.0{n}.00.000-00.0{n}.02.000@0" for n in (1, 2, 3))
BOXES = {
    SCENE_A: [[10, 20, 50, 60, 0.99], [5.5, 6, 30, 31, 0.9], [60, 10, 90, 70, 0.8]],
    SCENE_B: [[1, 2, 3, 4, 0.7]],
    SCENE_C: [[0, 0, 8, 8, 0.95], [2, 2, 6, 6, 0.5]],
}
OBJECTS = {SCENE_A: ["person", "car", "person"], SCENE_B: ["dog"], SCENE_C: ["person", "chair"]}
TEXT = [["It", "is", "."], ["No", "."], ["Yes", "."], ["Maybe", "."]]


def annotation(annot_id: str, scene: str, labels: tuple[int, int] | None = (1, 2), **fields) -> dict:
    """A line as published: the fields the reader uses plus some it ignores."""
    line = {"movie": "1001_Movie", "annot_id": annot_id, "objects": OBJECTS[scene], "img_fn": f"{scene}.jpg",
            "metadata_fn": f"{scene}.json", "question": ["Is", [0], "ok", "?"], "answer_choices": TEXT,
            "rationale_choices": TEXT, "interesting_scores": [0], "question_orig": "Is 1 ok?"}
    if labels is not None:
        line.update(answer_label=labels[0], rationale_label=labels[1])
    return {**line, **fields}


def write_jsonl(path: Path, lines: list) -> None:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


@pytest.fixture
def vcr_root(tmp_path: Path) -> Path:
    """vcr1annots unzipped into root, vcr1images into root/vcr1images; no train.jsonl."""
    root = tmp_path / "vcr"
    (root / "vcr1images" / MOVIE).mkdir(parents=True)
    for scene, boxes in BOXES.items():
        Image.new("RGB", (8, 6)).save(root / "vcr1images" / f"{scene}.jpg")
        metadata = {"boxes": boxes, "segms": [[[[0, 0], [1, 1], [0, 1]]] for _ in boxes],
                    "names": [f"{n + 1}" for n in range(len(boxes))], "width": 8, "height": 6}
        (root / "vcr1images" / f"{scene}.json").write_text(json.dumps(metadata))
    write_jsonl(root / "val.jsonl", [
        annotation("val-0", SCENE_A, (1, 2), question=["Why", "is", [0], "near", [1], "?"],
                   answer_choices=[["Because", [0, 2], "talk", "."], *TEXT[1:]]),
        annotation("val-1", SCENE_B, (0, 3), question=["Is", [0], "hungry", "?"]),
        annotation("val-2", SCENE_A, (3, 0), rationale_choices=[*TEXT[:3], [[2, 1, 0], "left", "."]]),
    ])
    write_jsonl(root / "test.jsonl", [annotation("test-0", SCENE_C, labels=None, question=["Is", [1], "free", "?"])])
    return root


def read_lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def prepare(root: Path, out: Path, **kwargs) -> dict:
    return prepare_dataset(SOURCE, root, out, log=lambda message: None, **kwargs)


def test_prepare_writes_one_record_per_image_with_tagged_text(vcr_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = prepare(vcr_root, out)

    assert summary["absent"] == ["train"]
    assert summary["splits"]["val"] == {"items": 3, "skipped": 0, "missing_images": 0, "images": 2}
    assert summary["splits"]["test"] == {"items": 1, "skipped": 0, "missing_images": 0, "images": 1}
    val = read_lines(out / "val.jsonl")
    assert [record["file"] for record in val] == [f"{SCENE_A}.jpg", f"{SCENE_B}.jpg"]
    scene_a = val[0]
    assert scene_a["objects"] == ["person", "car", "person"]
    assert [item["annot_id"] for item in scene_a["vcr"]] == ["val-0", "val-2"]  # lines 1 and 3 of the file
    first = scene_a["vcr"][0]
    # persons get gender-neutral names in turn (VL-BERT), other objects their category
    assert first["question"] == ["Why", "is", ["Casey", 0], "near", ["car", 1], "?"]
    assert first["answer_choices"][0] == ["Because", ["Casey", 0], "and", ["Riley", 2], "talk", "."]
    assert first["answer_choices"][1:] == TEXT[1:] and first["rationale_choices"] == TEXT
    assert (first["answer_label"], first["rationale_label"]) == (1, 2)
    assert scene_a["vcr"][1]["rationale_choices"][3] == [["Riley", 2], "and", ["car", 1], "and", ["Casey", 0],
                                                          "left", "."]
    assert val[1] == {"file": f"{SCENE_B}.jpg", "objects": ["dog"], "vcr": [{
        "annot_id": "val-1", "question": ["Is", ["dog", 0], "hungry", "?"], "answer_choices": TEXT,
        "rationale_choices": TEXT, "answer_label": 0, "rationale_label": 3}]}

    [test] = read_lines(out / "test.jsonl")
    assert test["objects"] == ["person", "chair"]
    assert test["vcr"][0]["question"] == ["Is", ["chair", 1], "free", "?"]
    assert "answer_label" not in test["vcr"][0] and "rationale_label" not in test["vcr"][0]

    boxes = json.loads((out / "boxes.json").read_text())
    assert boxes == {f"{SCENE_A}.jpg": [[10, 20, 50, 60], [5.5, 6, 30, 31], [60, 10, 90, 70]],
                     f"{SCENE_B}.jpg": [[1, 2, 3, 4]], f"{SCENE_C}.jpg": [[0, 0, 8, 8], [2, 2, 6, 6]]}
    assert (out / "images.txt").read_text().splitlines() == [f"{SCENE_A}.jpg", f"{SCENE_B}.jpg", f"{SCENE_C}.jpg"]
    assert (out / "skipped.jsonl").read_text() == ""


def test_images_folder_given_explicitly(vcr_root: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    (vcr_root / "vcr1images").rename(moved)
    summary = prepare(vcr_root, tmp_path / "out", images=moved)
    assert summary["splits"]["val"]["items"] == 3 and summary["splits"]["val"]["missing_images"] == 0


def test_unusable_annotations_are_skipped_with_their_reasons(vcr_root: Path, tmp_path: Path) -> None:
    images = vcr_root / "vcr1images"
    (images / f"{SCENE_B}.json").unlink()
    (images / f"{SCENE_C}.json").write_text('{"boxes": [[0, 0, 8, 8, 0.9]]')  # cut short
    write_jsonl(vcr_root / "train.jsonl", [
        annotation("train-0", SCENE_A),
        annotation("train-1", SCENE_A, question=["Is", [3], "ok", "?"]),  # SCENE_A has objects 0-2
        annotation("train-2", SCENE_B),
        annotation("train-3", SCENE_C),
        annotation("train-4", SCENE_A, img_fn=f"{MOVIE}/gone.jpg"),
        annotation("train-5", SCENE_A, img_fn=f"{MOVIE}/other.jpg", metadata_fn=f"{SCENE_A}.json",
                   objects=["person", "car"]),  # SCENE_A's metadata has 3 boxes
        annotation("train-6", SCENE_A, objects=["person", "car", "dog"]),
        annotation("train-7", SCENE_A, rationale_choices=[*TEXT[:3], [[0, -1], "."]]),
    ])
    Image.new("RGB", (8, 6)).save(images / MOVIE / "other.jpg")
    out = tmp_path / "out"
    summary = prepare(vcr_root, out)

    assert summary["splits"]["train"] == {"items": 1, "skipped": 7, "missing_images": 1, "images": 1}
    skipped = {entry["id"]: entry["reason"] for entry in read_lines(out / "skipped.jsonl") if entry["split"] == "train"}
    assert set(skipped) == {"train-1", "train-2", "train-3", "train-4", "train-5", "train-6", "train-7"}
    assert skipped["train-1"] == "refers to object 3, but the image has 3 objects"
    assert skipped["train-7"] == "refers to object -1, but the image has 3 objects"
    assert skipped["train-2"].startswith(f"metadata unusable: {images / SCENE_B}.json: cannot read")
    assert skipped["train-3"].startswith(f"metadata unusable: {images / SCENE_C}.json: invalid JSON")
    assert skipped["train-4"] == f"no image found as {images / MOVIE / 'gone'}.{{jpg,jpeg,png,bmp,webp,tif,tiff,gif}}"
    assert skipped["train-5"] == f"{images / SCENE_A}.json holds 3 boxes for 2 objects"
    assert skipped["train-6"] == f"'objects' differ from an earlier annotation of {SCENE_A}.jpg"
    [record] = read_lines(out / "train.jsonl")
    assert [item["annot_id"] for item in record["vcr"]] == ["train-0"]
    # val-1 shows SCENE_B, whose metadata is gone now
    assert summary["splits"]["val"] == {"items": 2, "skipped": 1, "missing_images": 0, "images": 1}


@pytest.mark.parametrize("line, message", [
    ('{"annot_id": "val-9", ', "val.jsonl:2: invalid JSON"),
    (json.dumps(annotation("val-9", SCENE_A, labels=None)), "val.jsonl:2: 'answer_label'"),
    (json.dumps(annotation("val-9", SCENE_A, answer_choices=TEXT[:3])), "val.jsonl:2: 'answer_choices': expected 4"),
    (json.dumps(annotation("val-9", SCENE_A, question=["Is", ["0"], "?"])), "val.jsonl:2: 'question'"),
])
def test_a_line_that_is_not_an_annotation_fails_with_its_line(vcr_root: Path, tmp_path: Path, line: str,
                                                              message: str) -> None:
    write_jsonl(vcr_root / "val.jsonl", [annotation("val-0", SCENE_A), line])
    with pytest.raises(DataError, match=re.escape(message)):
        prepare(vcr_root, tmp_path / "out")
    assert not (tmp_path / "out" / "summary.json").exists()


def test_no_published_file_fails(tmp_path: Path) -> None:
    (tmp_path / "vcr").mkdir()
    with pytest.raises(DataError, match="none of vcr's published files"):
        prepare(tmp_path / "vcr", tmp_path / "out")


# -- evaluation ---------------------------------------------------------------------------------------

def prediction(answer: int | None, rationale_given: dict[int, int] | None = None) -> VcrPrediction:
    """Scores that pick `answer`, and rationale `rationale_given[i]` given answer i (others: choice 0)."""
    def one_hot(choice: int) -> np.ndarray:
        return np.eye(4)[choice] * 0.7 + 0.075

    rationales = {} if rationale_given is None else {i: one_hot(rationale_given.get(i, 0)) for i in range(4)}
    return VcrPrediction(None if answer is None else one_hot(answer), rationales)


LABELS = {"val-0": (0, 1), "val-1": (2, 3), "val-2": (1, 0)}
PREDICTIONS = {
    "val-0": prediction(0, {0: 1}),  # all right
    "val-1": prediction(1, {1: 3, 2: 3}),  # answer wrong; the rationale right given either answer
    "val-2": prediction(1, {1: 2}),  # answer right, rationale wrong
}


def test_score_vcr_counts_each_metric_by_hand() -> None:
    assert score_vcr(LABELS, PREDICTIONS) == {"q2a": 66.67, "qa2r": 66.67, "q2ar": 33.33}


def test_score_vcr_scores_what_one_run_predicts() -> None:
    answers = {i: VcrPrediction(answers=p.answers) for i, p in PREDICTIONS.items()}
    rationales = {i: VcrPrediction(rationales=p.rationales) for i, p in PREDICTIONS.items()}
    assert score_vcr(LABELS, answers) == {"q2a": 66.67}
    assert score_vcr(LABELS, rationales) == {"qa2r": 66.67}
    with pytest.raises(DataError, match="1 of 3 predictions have no rationale scores.*val-2"):
        score_vcr(LABELS, {**PREDICTIONS, "val-2": VcrPrediction(answers=PREDICTIONS["val-2"].answers)})
    with pytest.raises(DataError, match="1 of 3 annot_ids have no prediction"):
        score_vcr(LABELS, {"val-0": PREDICTIONS["val-0"], "val-1": PREDICTIONS["val-1"]})


def assert_same(given: VcrPrediction, expected: VcrPrediction) -> None:
    np.testing.assert_array_equal(given.answers, expected.answers)
    assert sorted(given.rationales) == sorted(expected.rationales) == [0, 1, 2, 3]
    for answer, scores in expected.rationales.items():
        np.testing.assert_array_equal(given.rationales[answer], scores)


def test_csv_round_trip_in_the_leaderboard_layout(tmp_path: Path) -> None:
    path = tmp_path / "submission.csv"
    predictions = {**PREDICTIONS, "val-0": VcrPrediction([0.1, 0.2, 0.3, 1 / 3],
                                                         dict(enumerate(np.arange(16).reshape(4, 4) / 7)))}
    write_vcr_csv(path, predictions)
    header = path.read_text().splitlines()[0].split(",")
    assert header[:5] == ["annot_id", "answer_0", "answer_1", "answer_2", "answer_3"]
    assert header[5:9] == [f"rationale_conditioned_on_a0_{j}" for j in range(4)]
    assert header[-1] == "rationale_conditioned_on_a3_3" and len(header) == 21
    back = read_vcr_csv(path)
    assert list(back) == list(predictions)
    for annot_id, expected in predictions.items():
        assert_same(back[annot_id], expected)


def test_a_csv_saved_with_a_bom_reads_as_without(tmp_path: Path) -> None:
    path = tmp_path / "submission.csv"
    write_vcr_csv(path, PREDICTIONS)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as spreadsheet programs save UTF-8
    back = read_vcr_csv(path)
    assert list(back) == list(PREDICTIONS)


def test_predictions_filled_as_a_run_scores_them(tmp_path: Path) -> None:
    """A QA->R run fills the rationales given each answer in turn, as plain lists."""
    predictions: dict[str, VcrPrediction] = defaultdict(VcrPrediction)
    for answer in (2, 0, 3, 1):
        predictions["val-0"].rationales[answer] = [0.1 * answer, 0.2, 0.3, 0.4]
    write_vcr_csv(tmp_path / "qa2r.csv", dict(predictions))
    assert read_vcr_csv(tmp_path / "qa2r.csv")["val-0"].rationales[3].tolist() == [0.30000000000000004, 0.2, 0.3, 0.4]
    del predictions["val-0"].rationales[1]
    with pytest.raises(DataError, match=r"annot_id 'val-0': rationale scores .*expected 4 x 4 finite numbers"):
        write_vcr_csv(tmp_path / "partial.csv", dict(predictions))
    with pytest.raises(DataError, match=r"annot_id 'val-1': answer scores \[1, 2\], expected 4 finite"):
        write_vcr_csv(tmp_path / "short.csv", {"val-1": VcrPrediction(answers=[1, 2])})


def write_runs(tmp_path: Path) -> tuple[Path, Path]:
    """The CSVs of a Q->A run and a QA->R run, rows in different orders."""
    q2a, qa2r = tmp_path / "q2a.csv", tmp_path / "qa2r.csv"
    write_vcr_csv(q2a, {i: VcrPrediction(answers=p.answers) for i, p in PREDICTIONS.items()})
    write_vcr_csv(qa2r, {i: VcrPrediction(rationales=p.rationales) for i, p in reversed(PREDICTIONS.items())})
    return q2a, qa2r


def test_merge_joins_runs_by_annot_id(tmp_path: Path) -> None:
    q2a, qa2r = write_runs(tmp_path)
    assert len(q2a.read_text().splitlines()[0].split(",")) == 5
    merged = merge_vcr_predictions([q2a, qa2r])
    assert list(merged) == ["val-0", "val-1", "val-2"]
    for annot_id, expected in PREDICTIONS.items():
        assert_same(merged[annot_id], expected)
    with pytest.raises(DataError, match=r"q2a\.csv: its answer columns are given by .*q2a\.csv already"):
        merge_vcr_predictions([q2a, q2a])
    fewer = tmp_path / "fewer.csv"
    fewer.write_text("\n".join(qa2r.read_text().splitlines()[:-1]) + "\n")
    with pytest.raises(DataError, match=r"fewer\.csv: 1 of 3 annot_ids have no prediction"):
        merge_vcr_predictions([q2a, fewer])


@pytest.mark.parametrize("text, message", [
    ("annot_id,answer_0,answer_1,answer_2,answer_3\nval-0,0.1,0.2,x,0.4\n", r":2: answer_2 'x' is not a number"),
    ("annot_id,answer_0,answer_1,answer_2,answer_3\nval-0,0.1,0.2,0.3\n", ":2: 4 fields, the header has 5"),
    ("annot_id,answer_0,answer_1,answer_2,answer_3\nval-0,1,2,3,4\n\nval-0,1,2,3,4\n",
     ":4: annot_id 'val-0' again \\(first on line 2\\)"),
    ("annot_id,answer_0,answer_1,answer_2,answer_3\nval-0,1,nan,3,4\n", ":2: answer_1 is nan"),
    ("annot_id,answer_0,answer_1,answer_2\n", ":1: .*answer columns incomplete \\(has 3 of 4\\)"),
    ("id,answer_0,answer_1,answer_2,answer_3\n", ":1: .*unknown column 'id'; no annot_id column"),
    ("annot_id\nval-0\n", ":1: .*neither answer_\\* nor rationale"),
    ("", ": empty"),
])
def test_bad_csv_fails_with_its_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=r"bad\.csv" + message):
        read_vcr_csv(path)


def test_evaluate_vcr_against_the_published_val_file(vcr_root: Path, tmp_path: Path) -> None:
    val = vcr_root / "val.jsonl"  # its labels: val-0 (1, 2), val-1 (0, 3), val-2 (3, 0)
    answers = {"val-0": 1, "val-1": 0, "val-2": 0}  # val-2 wrong
    # val-1's rationale wrong; val-2's labelled rationale chosen only given its wrong predicted answer
    rationales = {"val-0": {1: 2}, "val-1": {0: 1}, "val-2": {0: 0, 3: 1}}
    predictions = {i: prediction(answers[i], rationales[i]) for i in answers}
    full = tmp_path / "full.csv"
    write_vcr_csv(full, predictions)
    assert evaluate_vcr(val, full) == {"q2a": 66.67, "qa2r": 33.33, "q2ar": 33.33}
    # separate runs: PREDICTIONS scored against this file's labels get only val-2's rationale right
    assert evaluate_vcr(val, list(write_runs(tmp_path))) == {"q2a": 0.0, "qa2r": 33.33, "q2ar": 0.0}

    extra, fewer = tmp_path / "extra.csv", tmp_path / "fewer.csv"
    write_vcr_csv(extra, {**predictions, "val-7": prediction(0, {})})
    write_vcr_csv(fewer, {i: predictions[i] for i in ("val-0", "val-1")})
    with pytest.raises(DataError, match=r"extra\.csv: 1 predictions name unknown annot_ids \(first: 'val-7'\)"):
        evaluate_vcr(val, extra)
    with pytest.raises(DataError, match=r"fewer\.csv: 1 of 3 annot_ids have no prediction \(first: 'val-2'\)"):
        evaluate_vcr(val, [fewer])
    with pytest.raises(DataError, match=r"test\.jsonl:1: 'answer_label'"):
        evaluate_vcr(vcr_root / "test.jsonl", full)
