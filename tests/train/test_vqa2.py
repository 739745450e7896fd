"""VQA v2: preparing the published files, the official answer processing and accuracy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.sources.vqa2 import SOURCE
from train.evaluation.vqa2 import VqaTruth, evaluate_vqa2, question_accuracy, score_vqa, write_vqa_predictions
from train.evaluation.vqa_answers import answer_scores, normalize_answer


def question(question_id: int, image_id: int) -> dict[str, Any]:
    return {"image_id": image_id, "question": f"question {question_id}?", "question_id": question_id}


def annotation(question_id: int, image_id: int, answers: list[str], chosen: str, answer_type: str = "other",
               question_type: str = "what is") -> dict[str, Any]:
    return {"question_id": question_id, "image_id": image_id, "question_type": question_type,
            "answer_type": answer_type, "multiple_choice_answer": chosen,
            "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": n} for n, a in enumerate(answers, 1)]}


def write_questions(root: Path, split: str, questions: list[dict[str, Any]]) -> Path:
    path = root / f"v2_OpenEnded_mscoco_{split}_questions.json"
    path.write_text(json.dumps({"info": {}, "task_type": "Open-Ended", "data_type": "mscoco", "license": {},
                                "data_subtype": split, "questions": questions}))
    return path


def write_annotations(root: Path, split: str, annotations: list[dict[str, Any]]) -> Path:
    path = root / f"v2_mscoco_{split}_annotations.json"
    path.write_text(json.dumps({"info": {}, "license": {}, "data_type": "mscoco", "data_subtype": split,
                                "annotations": annotations}))
    return path


def write_image(images: Path, folder: str, image_id: int) -> None:
    path = images / folder / f"COCO_{folder}_{image_id:012d}.jpg"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (90, 30, 200)).save(path)


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path]:
    """train2014, val2014 and test-dev2015 as published (test2015 absent); val2014's image 7 missing."""
    root, images = tmp_path / "vqa", tmp_path / "coco"
    root.mkdir()
    write_questions(root, "train2014", [question(92, 9), question(91, 9), question(50, 5), question(60, 5)])
    write_annotations(root, "train2014", [  # 60 has no annotation, 777 no question
        annotation(91, 9, ["yes"] * 10, "yes", "yes/no", "is the"),
        annotation(92, 9, ["two"] * 6 + ["2"] * 4, "Two", "number", "how many"),
        annotation(50, 5, ["the dog"] * 10, "the dog"),
        annotation(777, 5, ["cat"] * 10, "cat")])
    write_questions(root, "val2014", [question(12, 7), question(11, 3), question(10, 3)])
    write_annotations(root, "val2014", [annotation(10, 3, ["2"] * 10, "2", "number", "how many"),
                                        annotation(11, 3, ["Yes."] * 10, "Yes.", "yes/no", "is the"),
                                        annotation(12, 7, ["cat"] * 10, "cat")])
    write_questions(root, "test-dev2015", [question(1001, 4)])
    for folder, image_id in (("train2014", 9), ("train2014", 5), ("val2014", 3), ("test2015", 4)):
        write_image(images, folder, image_id)
    return root, images


def read_split(out: Path, split: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]


def test_prepare_writes_the_schema_from_the_published_files(published, tmp_path):
    root, images = published
    out, logs = tmp_path / "out", []
    summary = prepare_dataset(SOURCE, root, out, images=images, log=logs.append, min_answer_count=2)

    assert summary == {
        "source": "vqa2", "absent": ["test2015"], "answers": 2, "min_answer_count": 2,
        "splits": {"train2014": {"items": 3, "skipped": 1, "missing_images": 0, "annotations_without_question": 1},
                   "val2014": {"items": 2, "skipped": 1, "missing_images": 1, "annotations_without_question": 0},
                   "test-dev2015": {"items": 1, "skipped": 0, "missing_images": 0}}}
    assert json.loads((out / "summary.json").read_text()) == summary
    assert "vqa2: found train2014, val2014, test-dev2015; not present: test2015" in logs
    assert read_split(out, "train2014") == [
        {"file": "train2014/COCO_train2014_000000000005.jpg", "image_id": 5, "vqa": [
            {"question_id": 50, "question": "question 50?", "answers": ["the dog"] * 10, "answer_type": "other",
             "question_type": "what is"}]},
        {"file": "train2014/COCO_train2014_000000000009.jpg", "image_id": 9, "vqa": [
            {"question_id": 91, "question": "question 91?", "answers": ["yes"] * 10, "answer_type": "yes/no",
             "question_type": "is the"},
            {"question_id": 92, "question": "question 92?", "answers": ["two"] * 6 + ["2"] * 4,
             "answer_type": "number", "question_type": "how many"}]}]
    assert [q["question_id"] for record in read_split(out, "val2014") for q in record["vqa"]] == [10, 11]
    assert read_split(out, "test-dev2015") == [{"file": "test2015/COCO_test2015_000000000004.jpg", "image_id": 4,
                                                "vqa": [{"question_id": 1001, "question": "question 1001?"}]}]
    assert (out / "images.txt").read_text().splitlines() == [
        "train2014/COCO_train2014_000000000005.jpg", "train2014/COCO_train2014_000000000009.jpg",
        "val2014/COCO_val2014_000000000003.jpg", "test2015/COCO_test2015_000000000004.jpg"]
    # "Two" and "2" are one answer, "yes" and "Yes." too; "dog" and "cat" are seen once each
    assert (out / "answers.txt").read_text() == "2\nyes\n"
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(s["split"], s["id"]) for s in skipped] == [("train2014", 60), ("val2014", [12])]
    assert skipped[1]["reason"] == (f"no image found as {images / 'val2014/COCO_val2014_000000000007'}"
                                    ".{jpg,jpeg,png,bmp,webp,tif,tiff,gif}")


@pytest.mark.parametrize(("min_count", "answers"), [(None, ""), (1, "2\nyes\ncat\ndog\n")])
def test_answer_vocabulary_keeps_answers_seen_min_count_times(published, tmp_path, min_count, answers):
    # the missing image's question (12, "cat") still counts: the vocabulary does not depend on the images
    root, images = published
    options = {} if min_count is None else {"min_answer_count": min_count}
    summary = prepare_dataset(SOURCE, root, tmp_path / "out", images=images, log=lambda line: None, **options)
    assert (tmp_path / "out" / "answers.txt").read_text() == answers
    assert summary["min_answer_count"] == (9 if min_count is None else min_count)


def test_a_larger_missing_share_than_max_missing_fails(published, tmp_path):
    root, images = published
    with pytest.raises(DataError, match=r"vqa2 val2014: 1 of 3 items \(33.3%\) have no image"):
        prepare_dataset(SOURCE, root, tmp_path / "out", images=images, max_missing=0.2, log=lambda line: None)


def test_questions_without_their_annotations_file_fail(published, tmp_path):
    root, images = published
    (root / "v2_mscoco_val2014_annotations.json").unlink()
    with pytest.raises(DataError, match=r"questions without annotations: .*v2_mscoco_val2014_annotations.json"):
        prepare_dataset(SOURCE, root, tmp_path / "out", images=images, log=lambda line: None)
    assert not (tmp_path / "out" / "summary.json").exists()


def test_malformed_json_names_line_and_column(published, tmp_path):
    root, images = published
    (root / "v2_OpenEnded_mscoco_test-dev2015_questions.json").write_text('{"questions": [\n  {"image_id": 4,,}]}')
    with pytest.raises(DataError, match=r"test-dev2015_questions.json: invalid JSON at line 2, column 18"):
        prepare_dataset(SOURCE, root, tmp_path / "out", images=images, log=lambda line: None)


@pytest.mark.parametrize(("item", "problem"), [
    ({"image_id": 4, "question_id": 1002}, r"questions\[1\] \(question_id 1002\): 'question' must be str"),
    ({"image_id": "4", "question": "?", "question_id": 1002}, r"questions\[1\] \(question_id 1002\): 'image_id'"),
    ({"image_id": 4, "question": "?", "question_id": 1001}, r"questions\[1\]: question_id 1001 appears twice")])
def test_malformed_questions_name_the_item(published, tmp_path, item, problem):
    root, images = published
    write_questions(root, "test-dev2015", [question(1001, 4), item])
    with pytest.raises(DataError, match=problem):
        prepare_dataset(SOURCE, root, tmp_path / "out", images=images, log=lambda line: None)


def test_annotations_without_answers_name_the_question(published, tmp_path):
    root, images = published
    write_annotations(root, "val2014", [{**annotation(10, 3, [], "2"), "answers": []}])
    with pytest.raises(DataError, match=r"annotations\[0\] \(question_id 10\): 'answers' must be a non-empty"):
        prepare_dataset(SOURCE, root, tmp_path / "out", images=images, log=lambda line: None)


@pytest.mark.parametrize(("raw", "normalized"), [
    ("Two", "2"), ("none", "0"), ("ten dogs", "10 dogs"), ("one-way", "1 way"),  # number words
    ("the dog", "dog"), ("A cat and an apple", "cat and apple"),  # articles
    ("black/white", "black white"), ("yes!", "yes"), ("left - right", "left right"),  # a mark inside a word
    ("red- t-shirt", "red tshirt"),  # is a space, unless the same mark stands next to a space somewhere
    ("dont", "don't"), ("isnt", "isn't"), ("Im", "im"),  # contractions; the table's "Im" never applies
    ("1,000", "1000"), ("1,000 t-shirt", "1000 tshirt"), ("yes,no", "yes no"),  # digit-comma-digit drops every mark
    ("3.5", "3.5"), ("3.", "3"), ("mr. smith", "mr smith"), (".5", ".5"),  # periods before a digit stay
    ("  Yes\n", "yes"), ("red\tball", "red ball")])
def test_normalize_answer_follows_the_official_rules(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_at_most_32_periods_are_removed_as_in_the_official_code():
    assert normalize_answer("a." * 33 + "b.") == "a" * 32 + "a.b."


@pytest.mark.parametrize(("answers", "prediction", "accuracy"), [
    (["yes"] * 10, "yes", 1.0),
    (["yes"] * 10, " yes\n", 1.0),  # whitespace always goes
    (["yes"] * 10, "Yes", 0.0),  # unanimous answers are compared as typed
    (["yes"] * 10, "yes.", 0.0),
    (["yes"] * 9 + [" yes"], "Yes", 0.0),  # unanimous once whitespace is gone
    (["yes"] * 9 + ["no"], "Yes.", 1.0),  # disagreeing answers: everything normalised
    (["2"] * 3 + ["3"] * 7, "two", 0.9),  # (3 * 2/3 + 7 * 1) / 10
    (["red"] + ["blue"] * 9, "red", 0.3),  # (1 * 0 + 9 * 1/3) / 10
    (["red"] * 2 + ["blue"] * 8, "red", 0.6),  # (2 * 1/3 + 8 * 2/3) / 10
    (["red"] + ["blue"] * 9, "green", 0.0),
    (["Two"], "2", 1.0),  # a lone answer (the demo world): equal once normalised
    (["red"], "blue", 0.0)])
def test_question_accuracy(answers, prediction, accuracy):
    assert question_accuracy(answers, prediction) == pytest.approx(accuracy)


def test_answer_scores_are_the_official_soft_scores():
    assert answer_scores(["yes"] * 10) == {"yes": 1.0}
    assert answer_scores(["x"] + ["y"] * 2 + ["z"] * 7) == pytest.approx({"x": 0.3, "y": 0.6, "z": 1.0})
    assert answer_scores(["Two"] * 2 + ["2"] + ["red"] * 7) == pytest.approx({"2": 0.9, "red": 1.0})
    assert answer_scores(["A Dog"]) == {"dog": 1.0}


GROUND_TRUTH = {
    1: VqaTruth(["yes"] * 10, "yes/no", "is the"),
    2: VqaTruth(["2"] * 3 + ["3"] * 7, "number", "how many"),
    3: VqaTruth(["red"] + ["blue"] * 9, "other", "what color"),
    4: VqaTruth(["no"] * 10, "yes/no", "is the")}
PREDICTIONS = {1: "yes", 2: "two", 3: "red", 4: "yes"}  # accuracies 1, 0.9, 0.3, 0
SCORES = {"overall": 55.0, "perAnswerType": {"yes/no": 50.0, "number": 90.0, "other": 30.0},
          "perQuestionType": {"is the": 50.0, "how many": 90.0, "what color": 30.0}}


def test_score_vqa_breaks_accuracy_down_by_type():
    assert score_vqa(GROUND_TRUTH, PREDICTIONS) == SCORES


def test_score_vqa_rounds_like_python_2():
    # 1 of 32 right: 3.125 exactly, which Python 2's round() takes away from zero (Python 3's to 3.12)
    truth = {n: VqaTruth(["yes"] * 10, "yes/no", "is the") for n in range(32)}
    assert score_vqa(truth, {n: "yes" if n == 0 else "no" for n in range(32)})["overall"] == 3.13
    # 1 of 3 right: 33.333...
    assert score_vqa(dict(list(truth.items())[:3]), {0: "yes", 1: "no", 2: "no"})["overall"] == 33.33


def write_evaluation_files(root: Path) -> tuple[Path, Path]:
    annotations = [annotation(n, 100 + n, truth.answers, truth.answers[0], truth.answer_type, truth.question_type)
                   for n, truth in GROUND_TRUTH.items()]
    return (write_questions(root, "val2014", [question(n, 100 + n) for n in GROUND_TRUTH]),
            write_annotations(root, "val2014", annotations))


def test_evaluate_vqa2_scores_a_results_file(tmp_path):
    questions, annotations = write_evaluation_files(tmp_path)
    results = tmp_path / "results.json"
    write_vqa_predictions(results, {4: "yes", 2: "two", 3: "red", 1: "yes"})
    assert [item["question_id"] for item in json.loads(results.read_text())] == [1, 2, 3, 4]
    assert evaluate_vqa2(questions, annotations, results) == SCORES


@pytest.mark.parametrize(("results", "problem"), [
    ([{"question_id": 1, "answer": "yes"}, {"question_id": 2, "answer": "2"}, {"question_id": 3, "answer": "red"},
      {"question_id": 9, "answer": "no"}],
     r"1 of 4 question_ids have no prediction \(first: 4\); 1 predictions name unknown question_ids \(first: 9\)"),
    ([{"question_id": n, "answer": "yes"} for n in (1, 2, 3, 4, 4)], r"1 question_ids predicted more than once"),
    ({"1": "yes"}, r"expected a JSON list"),
    ([{"question_id": 1}], r"item 0 is \{'question_id': 1\}, expected"),
    ([{"question_id": "1", "answer": "yes"}], r"item 0 is")])
def test_evaluate_vqa2_refuses_bad_results(tmp_path, results, problem):
    questions, annotations = write_evaluation_files(tmp_path)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    with pytest.raises(DataError, match=problem):
        evaluate_vqa2(questions, annotations, path)
