"""Item scores files with and without groups (written, read back, averaged over seeds), and VQA's evaluator
giving each scored question's answer type as its group."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from train.data.annotations import AnnotationFile, AnswerVocabulary
from train.data.files import DataError
from train.evaluation.item_scores import ItemGroups, ItemScores, averaged_over_seeds
from train.tasks.vqa import AnswerAccuracy, QuestionAnswering


def test_item_scores_with_groups_round_trip(tmp_path):
    written = ItemScores("vqa_accuracy", {"1": 1.0, "2": 0.3, "3": 0.0}, ItemGroups("answer type", {"1": "colour",
                                                                                                  "3": "count"}))
    written.write(tmp_path / "item_scores" / "val.json")
    assert ItemScores.read(tmp_path / "item_scores" / "val.json") == written


def test_item_scores_without_groups_are_written_and_read_as_before(tmp_path):
    written = ItemScores("refexp_accuracy", {"a": 1.0, "b": 0.0})
    written.write(tmp_path / "val.json")
    old = json.dumps({"metric": "refexp_accuracy", "items": {"a": 1.0, "b": 0.0}})  # the format before groups
    assert (tmp_path / "val.json").read_text() == old
    assert ItemScores.read(tmp_path / "val.json") == written and written.groups is None


@pytest.mark.parametrize("document, problem", [
    ([1, 2], "not item scores"), ({"metric": "m", "items": {"a": "right"}}, "not item scores"),
    ({"metric": "m", "items": {"a": 1.0}, "groups": {"items": {"a": "colour"}}}, '"groups" is not'),
    ({"metric": "m", "items": {"a": 1.0}, "groups": {"name": "answer type", "items": {"a": 3}}}, '"groups" is not')])
def test_item_scores_that_are_not_say_which_file(tmp_path, document, problem):
    path = tmp_path / "val.json"
    path.write_text(json.dumps(document))
    with pytest.raises(DataError, match=f"{path}: {problem}"):
        ItemScores.read(path)


def test_groups_averaged_over_seeds_follow_the_items_every_seed_scored_and_grouped_alike():
    grouping = ItemGroups("answer type", {"1": "colour", "2": "count", "3": "shape"})
    seeds = [ItemScores("m", {"1": 1.0, "2": 0.0, "3": 1.0, "4": 1.0}, grouping),
             ItemScores("m", {"1": 0.0, "2": 1.0, "4": 0.0},
                        ItemGroups("answer type", {"1": "colour", "2": "shape", "4": "count"}))]
    averaged = averaged_over_seeds(seeds)
    assert averaged.items == {"1": 0.5, "2": 0.5, "4": 0.5}
    assert averaged.groups == ItemGroups("answer type", {"1": "colour"})  # 2 grouped apart, 4 not in seed 0's
    assert averaged_over_seeds([seeds[0], ItemScores("m", seeds[1].items)]).groups is None
    other = ItemScores("m", seeds[1].items, ItemGroups("question type", seeds[1].groups.items))
    assert averaged_over_seeds([seeds[0], other]).groups is None


def test_vqa_gives_each_scored_question_its_answer_type(tmp_path):
    questions = [{"question_id": 10, "question": "what colour?", "answers": ["red"] * 10, "answer_type": "colour"},
                 {"question_id": 11, "question": "how many?", "answers": ["2"] * 10, "answer_type": "count"},
                 {"question_id": 12, "question": "what shape?", "answers": ["cube"] * 10},  # no answer type
                 {"question_id": 13, "question": "which?", "answers": [], "answer_type": "colour"}]  # unscored
    path = tmp_path / "val.jsonl"
    path.write_text(json.dumps({"file": "a.png", "vqa": questions}) + "\n")
    answers = AnswerVocabulary(["red", "2", "cube"])
    dataset = QuestionAnswering(AnnotationFile(path), None, None, 16, answers)
    evaluator = AnswerAccuracy(None, dataset)
    logits = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    evaluator.add([SimpleNamespace(item_id=q) for q in (10, 11, 12, 13)], {}, SimpleNamespace(logits=logits))
    assert evaluator.item_scores() == {"10": 1.0, "11": 0.0, "12": 1.0}
    assert evaluator.item_groups() == ItemGroups("answer type", {"10": "colour", "11": "count"})
    evaluator.predicted = {12: "cube"}  # only a question without an answer type scored: no groups
    assert evaluator.item_groups() is None
