"""`vlbert evaluate` against what users feed it: inputs with nothing to score, the file at fault named,
deep nesting and huge integers in every JSON input; the score alone on stdout, one error line on stderr."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner, Result

from pipelines.cli import main
from train.evaluation.vcr import PARTS

DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's parser recurses
HUGE = "1" * 5_000  # more digits than int() converts from text


def evaluate(*arguments) -> Result:
    return CliRunner().invoke(main, ["evaluate", *map(str, arguments)])


def assert_refused(result: Result, line: str) -> None:
    """Exit status 2, `line` alone on stderr, and nothing on stdout (which carries only a score)."""
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"Error: {line}\n")


def assert_refused_naming(result: Result, where: str) -> None:
    """As `assert_refused`, for a line whose words after `where` (a file, or file:line) are the reader's."""
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith(f"Error: {where}: ") and result.stderr.count("\n") == 1, result.stderr


# ---- VQA v2: v2_OpenEnded_mscoco_<split>_questions.json, v2_mscoco_<split>_annotations.json -------------

def write_vqa2(root: Path, question_ids: list[int]) -> tuple[Path, Path]:
    questions = root / "v2_OpenEnded_mscoco_val2014_questions.json"
    annotations = root / "v2_mscoco_val2014_annotations.json"
    questions.write_text(json.dumps({"data_subtype": "val2014", "questions": [
        {"question_id": n, "image_id": 100 + n, "question": "Is it red?"} for n in question_ids]}))
    annotations.write_text(json.dumps({"annotations": [
        {"question_id": n, "image_id": 100 + n, "question_type": "is it", "answer_type": "yes/no",
         "multiple_choice_answer": "yes", "answers": [{"answer": "yes", "answer_id": k} for k in range(1, 11)]}
        for n in question_ids]}))
    return questions, annotations


def test_vqa2_scores_go_to_stdout_as_one_json_object(tmp_path):
    questions, annotations = write_vqa2(tmp_path, [1, 2])
    predictions = tmp_path / "results.json"
    predictions.write_text(json.dumps([{"question_id": 1, "answer": "yes"}, {"question_id": 2, "answer": "no"}]))
    result = evaluate("vqa2", "--questions", questions, "--annotations", annotations, "--predictions", predictions)
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.count("\n") == 1 and json.loads(result.stdout)["overall"] == 50.0


def test_vqa2_without_questions_is_one_line_naming_the_questions_file(tmp_path):
    questions, annotations = write_vqa2(tmp_path, [])
    predictions = tmp_path / "results.json"
    predictions.write_text("[]")
    result = evaluate("vqa2", "--questions", questions, "--annotations", annotations, "--predictions", predictions)
    assert_refused(result, f'{questions}: its "questions" list is empty: nothing to score')


# ---- RefCOCO+: the refer toolkit's DATA/refcoco+/{refs(unc).p, instances.json} ---------------------------

def write_refer(data: Path, refs: list[dict]) -> Path:
    """DATA/refcoco+ with image 1 and its annotation 10; the refs file as given. Returns the folder."""
    folder = data / "refcoco+"
    folder.mkdir(parents=True)
    (folder / "instances.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "COCO_train2014_000000000001.jpg", "width": 64, "height": 48}],
        "annotations": [{"id": 10, "image_id": 1, "bbox": [0, 0, 10, 10], "category_id": 1, "area": 100.0}],
        "categories": [{"id": 1, "name": "person"}]}))
    (folder / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    return folder


def ref(ref_id: int, ann_id: int, split: str, sent_ids: list[int]) -> dict:
    return {"ref_id": ref_id, "ann_id": ann_id, "image_id": 1, "split": split, "category_id": 1,
            "sentences": [{"sent_id": s, "sent": "the man", "tokens": ["the", "man"]} for s in sent_ids]}


def test_refer_with_no_usable_expression_in_the_split_says_why_nothing_was_scored(tmp_path):
    # val's only ref names annotation 99, which instances.json does not hold; train's ref is usable.
    folder = write_refer(tmp_path / "DATA", [ref(100, 10, "train", [1000]), ref(101, 99, "val", [1001, 1002])])
    predictions = tmp_path / "val.json"
    predictions.write_text("[]")
    result = evaluate("refcoco+", "--data", tmp_path / "DATA", "--split", "val", "--predictions", predictions)
    assert_refused(result, f"{folder / 'refs(unc).p'}: split 'val' has no expression to score: 1 of its 1 refs "
                           f"cannot be used (first: ref 101: annotation 99 is not in {folder / 'instances.json'})")


def test_refer_with_a_split_whose_refs_hold_no_sentences_says_so(tmp_path):
    folder = write_refer(tmp_path / "DATA", [ref(100, 10, "train", [1000]), ref(101, 10, "val", [])])
    predictions = tmp_path / "val.json"
    predictions.write_text("[]")
    result = evaluate("refcoco+", "--data", tmp_path / "DATA", "--split", "val", "--predictions", predictions)
    assert_refused(result, f"{folder / 'refs(unc).p'}: split 'val' has no expression to score: 1 of its refs hold "
                           "no sentences")


# ---- VCR: val.jsonl as published, the leaderboard CSV ----------------------------------------------------

def leaderboard_header() -> str:
    return ",".join(["annot_id", *(column for part in PARTS for column in part.columns)]) + "\n"


def test_vcr_with_an_empty_annotations_file_names_that_file(tmp_path):
    annotations, predictions = tmp_path / "val.jsonl", tmp_path / "predictions.csv"
    annotations.write_text("")
    predictions.write_text(leaderboard_header())
    result = evaluate("vcr", "--annotations", annotations, "--predictions", predictions)
    assert_refused(result, f"{annotations}: holds no annotation; expected one labelled VCR annotation (a JSON "
                           "object) a line")


# ---- Deep nesting and huge integers, in every JSON input (the shared readers bound them) ------------------

def _vqa2_case(tmp_path: Path, damaged: str) -> tuple[list, Path]:
    questions, annotations = write_vqa2(tmp_path, [1])
    predictions = tmp_path / "results.json"
    predictions.write_text(json.dumps([{"question_id": 1, "answer": "yes"}]))
    files = {"questions": questions, "annotations": annotations, "predictions": predictions}
    return ["vqa2", *(v for name, path in files.items() for v in (f"--{name}", path))], files[damaged]


def _refer_case(tmp_path: Path, damaged: str) -> tuple[list, Path]:
    folder = write_refer(tmp_path / "DATA", [ref(100, 10, "val", [1000])])
    predictions = tmp_path / "val.json"
    predictions.write_text(json.dumps([{"sent_id": 1000, "box": [0, 0, 10, 10]}]))
    files = {"instances": folder / "instances.json", "predictions": predictions}
    return ["refcoco+", "--data", tmp_path / "DATA", "--split", "val", "--predictions", predictions], files[damaged]


# (benchmark, the input damaged) → the command line and that input's path
CASES: dict[tuple[str, str], Callable[[Path], tuple[list, Path]]] = {
    **{("vqa2", name): (lambda tmp_path, name=name: _vqa2_case(tmp_path, name))
       for name in ("questions", "annotations", "predictions")},
    **{("refcoco+", name): (lambda tmp_path, name=name: _refer_case(tmp_path, name))
       for name in ("instances", "predictions")},
}


@pytest.mark.parametrize("value", [DEEP, f'{{"questions": [], "n": {HUGE}}}'], ids=["deep", "huge integer"])
@pytest.mark.parametrize("case", CASES, ids=["/".join(case) for case in CASES])
def test_deeply_nested_json_and_huge_integers_are_one_line_naming_the_file(tmp_path, case, value):
    arguments, damaged = CASES[case](tmp_path)
    damaged.write_text(value)
    assert_refused_naming(evaluate(*arguments), str(damaged))


@pytest.mark.parametrize("value", [DEEP, f'{{"annot_id": {HUGE}}}'], ids=["deep", "huge integer"])
def test_vcr_annotations_nested_deeply_or_with_huge_integers_are_one_line_naming_the_line(tmp_path, value):
    annotations, predictions = tmp_path / "val.jsonl", tmp_path / "predictions.csv"
    annotations.write_text(value + "\n")
    predictions.write_text(leaderboard_header())
    assert_refused_naming(evaluate("vcr", "--annotations", annotations, "--predictions", predictions),
                          f"{annotations}:1")


def test_a_deeply_nested_refs_pickle_is_one_line_naming_the_file(tmp_path):
    folder = write_refer(tmp_path / "DATA", [])
    depth = 100_000  # EMPTY_LIST pushed depth times, then each APPENDed into the one below: no recursion to write
    (folder / "refs(unc).p").write_bytes(b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".")
    predictions = tmp_path / "val.json"
    predictions.write_text("[]")
    result = evaluate("refcoco+", "--data", tmp_path / "DATA", "--split", "val", "--predictions", predictions)
    assert_refused_naming(result, str(folder / "refs(unc).p"))
