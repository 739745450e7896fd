"""VQA v2 accuracy as the official evaluation computes it (GT-Vision-Lab/VQA,
PythonEvaluationTools/vqaEvaluation/vqaEval.py, a Python 2 script), and the results file its
evaluation server accepts: a JSON list [{"question_id": int, "answer": str}, ...].

Per question: the prediction and the human answers lose tabs, newlines and outer whitespace; only
when the humans do not all agree are all of them and the prediction normalised (punctuation, number
words, articles, contractions: `train.evaluation.vqa_answers.process_answer`), so a prediction typed
differently from unanimous answers scores 0. Accuracy = the mean over the answers left out one at a
time of min(1, matches among the others / 3) (a lone answer, which the official formula cannot
score, counts as right when equal once normalised). Overall, per answer type and per question type:
the mean over questions x 100, rounded to 2 decimals half away from zero (Python 2's round(); a
Python 3 port would round exact ties to even).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from train.data.files import DataError, read_json
from train.data.sources.vqa2 import read_annotations, read_questions
from train.evaluation.predictions import check_prediction_ids
from train.evaluation.vqa_answers import clean_answer, leave_one_out_accuracy, normalize_answer, process_answer
from vlbert.utils.atomic import write_atomically

DECIMALS = Decimal("0.01")


@dataclass(frozen=True)
class VqaTruth:
    """A question's human answers (raw, as published) and its types."""

    answers: list[str]
    answer_type: str
    question_type: str


def question_accuracy(answers: list[str], prediction: str) -> float:
    """The official accuracy (0-1) of `prediction` against the raw human `answers`."""
    if len(answers) == 1:
        # One answer alone (the demo world's case; VQA v2 always has ten): the official formula counts
        # matches among the other answers, so it would score every prediction 0. Right when equal once
        # normalised instead, as answer_scores gives a lone answer 1.0.
        return float(normalize_answer(answers[0]) == normalize_answer(prediction))
    answers = [clean_answer(answer) for answer in answers]
    prediction = clean_answer(prediction)
    if len(set(answers)) > 1:
        answers = [process_answer(answer) for answer in answers]
        prediction = process_answer(prediction)
    return leave_one_out_accuracy(answers, prediction)


def score_vqa(ground_truth: dict[int, VqaTruth], predictions: dict[int, str]) -> dict[str, Any]:
    """{"overall", "perAnswerType": {type: %}, "perQuestionType": {type: %}} in percent, 2 decimals.
    `predictions` must answer every question of `ground_truth` (whose order is the order summed in,
    as the official code sums in annotation-file order)."""
    if not ground_truth:
        raise ValueError("score_vqa: no questions to score")
    overall: list[float] = []
    by_answer_type: defaultdict[str, list[float]] = defaultdict(list)
    by_question_type: defaultdict[str, list[float]] = defaultdict(list)
    for question_id, truth in ground_truth.items():
        accuracy = question_accuracy(truth.answers, predictions[question_id])
        overall.append(accuracy)
        by_answer_type[truth.answer_type].append(accuracy)
        by_question_type[truth.question_type].append(accuracy)
    return {"overall": _percent(overall),
            "perAnswerType": {kind: _percent(values) for kind, values in by_answer_type.items()},
            "perQuestionType": {kind: _percent(values) for kind, values in by_question_type.items()}}


def _percent(accuracies: list[float]) -> float:
    total = 0.0
    for accuracy in accuracies:  # left to right like Python 2's sum(); Python 3.12's sum() compensates
        total += accuracy
    # Python 2's round(): half away from zero, on the float's exact value
    return float(Decimal(100 * total / len(accuracies)).quantize(DECIMALS, rounding=ROUND_HALF_UP))


def evaluate_vqa2(questions: str | Path, annotations: str | Path, predictions: str | Path) -> dict[str, Any]:
    """Scores a results file against a published questions file and its annotations file (score_vqa's
    dict). DataError for a questions file without questions, a results file that is not a list of
    {"question_id": int, "answer": str}, or whose question_ids are repeated, missing or not in the
    questions file."""
    questions, annotations, predictions = Path(questions), Path(annotations), Path(predictions)
    question_ids = [question["question_id"] for question in read_questions(questions)]
    if not question_ids:
        raise DataError(f'{questions}: its "questions" list is empty: nothing to score')
    truth = read_annotations(annotations)
    unannotated = [question_id for question_id in question_ids if question_id not in truth]
    if unannotated:
        raise DataError(f"{annotations}: {len(unannotated)} questions of {questions} have no annotation "
                        f"(first: {unannotated[0]})")
    answers = read_vqa_predictions(predictions)
    check_prediction_ids(question_ids, [question_id for question_id, _ in answers], "question_id", predictions)
    asked = set(question_ids)
    ground_truth = {question_id: VqaTruth(annotation.answers, annotation.answer_type, annotation.question_type)
                    for question_id, annotation in truth.items() if question_id in asked}
    return score_vqa(ground_truth, dict(answers))


def read_vqa_predictions(path: Path) -> list[tuple[int, str]]:
    """(question_id, answer) of every item of a results file, in its order."""
    items = read_json(path)
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of {{\"question_id\": int, \"answer\": str}} objects")
    answers = []
    for index, item in enumerate(items):
        question_id = item.get("question_id") if isinstance(item, dict) else None
        answer = item.get("answer") if isinstance(item, dict) else None
        if not isinstance(question_id, int) or isinstance(question_id, bool) or not isinstance(answer, str):
            raise DataError(f"{path}: item {index} is {item!r}, expected {{\"question_id\": int, \"answer\": str}}")
        answers.append((question_id, answer))
    return answers


def write_vqa_predictions(path: str | Path, predictions: dict[int, str]) -> None:
    """The results file the evaluation server takes: a list sorted by question_id, written whole."""
    write_atomically(path, json.dumps([{"question_id": question_id, "answer": predictions[question_id]}
                                       for question_id in sorted(predictions)]))
