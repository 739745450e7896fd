"""VCR metrics and the leaderboard's predictions CSV.

The leaderboard (visualcommonsense.com) takes one CSV: a header row, then a row per test annotation:
    annot_id, answer_0..answer_3,
    rationale_conditioned_on_a0_0..rationale_conditioned_on_a0_3, ..., rationale_conditioned_on_a3_3
(21 columns: R2C's models/eval_for_leaderboard.py writes it, VL-BERT's vcr/function/test.py lists it).
Values are probabilities or any scores: only their argmax counts. A Q->A run and a QA->R run each write
their own columns (VL-BERT writes annot_id + answer_* and annot_id + rationale_*) and are merged by
annot_id. Metrics (percent, as R2C's eval_q2ar.py counts them):
    q2a   the best-scored answer is the labelled one
    qa2r  given the labelled answer, the best-scored rationale is the labelled one
    q2ar  the answer is right and so is the rationale chosen given that (predicted) answer
A tie goes to the first best choice.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from train.data.files import DataError, iter_jsonl
from train.data.sources.vcr import CHOICES, parse_annotation
from train.evaluation.predictions import SHOWN, check_prediction_ids
from vlbert.utils.atomic import write_atomically

ID_COLUMN = "annot_id"


@dataclass
class VcrPrediction:
    """One annotation's scores: a Q->A run gives `answers`, a QA->R run `rationales` (given each of the
    four answers: all four or none). Any scores: probabilities, logits."""

    answers: Sequence[float] | None = None  # the four answers'
    rationales: dict[int, Sequence[float]] = field(default_factory=dict)  # answer i → the four rationales'


VcrPredictions = dict[str, VcrPrediction]  # annot_id → its scores, in file order


def _put_answers(prediction: VcrPrediction, scores: np.ndarray) -> None:
    prediction.answers = scores


def _put_rationales(prediction: VcrPrediction, scores: np.ndarray) -> None:
    prediction.rationales = dict(enumerate(scores))


@dataclass(frozen=True)
class Part:
    """One run's share of the predictions, and the CSV columns holding it."""

    name: str
    shape: tuple[int, ...]
    columns: tuple[str, ...]  # the scores flattened in row-major order
    scores: Callable[[VcrPrediction], Any]  # array-like of `shape`; None when not given
    put: Callable[[VcrPrediction, np.ndarray], None]


PARTS = (
    Part("answer", (CHOICES,), tuple(f"answer_{j}" for j in range(CHOICES)),
         lambda p: p.answers, _put_answers),
    Part("rationale", (CHOICES, CHOICES),
         tuple(f"rationale_conditioned_on_a{i}_{j}" for i in range(CHOICES) for j in range(CHOICES)),
         lambda p: [p.rationales.get(i) for i in range(CHOICES)] if p.rationales else None, _put_rationales),
)

Scores = dict[str, np.ndarray]  # part name → one annotation's scores of that part


def _best(scores: np.ndarray) -> int:
    return int(np.argmax(scores))  # the first of equal best scores


def _q2ar_hit(scores: Scores, answer: int, rationale: int) -> bool:
    chosen = _best(scores["answer"])
    # When the answer is right the chosen rationale is the one given the labelled answer, so this counts
    # what R2C's eval_q2ar.py counts (answer right and rationale right).
    return chosen == answer and _best(scores["rationale"][chosen]) == rationale


@dataclass(frozen=True)
class Metric:
    needs: tuple[str, ...]  # the parts it reads
    hit: Callable[[Scores, int, int], bool]  # (scores, answer label, rationale label) → right?


METRICS = {
    "q2a": Metric(("answer",), lambda scores, answer, rationale: _best(scores["answer"]) == answer),
    "qa2r": Metric(("rationale",), lambda scores, answer, rationale: _best(scores["rationale"][answer]) == rationale),
    "q2ar": Metric(("answer", "rationale"), _q2ar_hit),
}


def held_scores(predictions: VcrPredictions, source: str | Path = "predictions") -> dict[str, dict[str, np.ndarray]]:
    """Part name → annot_id → its scores as an array, for each part that every prediction holds.
    DataError when some predictions hold a part that others lack, or hold it malformed."""
    held = {}
    for part in PARTS:
        given = {annot_id: part.scores(prediction) for annot_id, prediction in predictions.items()}
        lacking = [annot_id for annot_id, scores in given.items() if scores is None]
        if len(lacking) == len(given):
            continue
        if lacking:
            raise DataError(f"{source}: {len(lacking)} of {len(given)} predictions have no {part.name} scores "
                            f"while the others do (first: {', '.join(map(repr, lacking[:SHOWN]))})")
        held[part.name] = {annot_id: _checked(part, annot_id, scores, source) for annot_id, scores in given.items()}
    return held


def _checked(part: Part, annot_id: str, scores: Any, source: str | Path) -> np.ndarray:
    try:
        array = np.asarray(scores, dtype=float)
    except (TypeError, ValueError):  # ragged, or a conditioned answer missing
        array = np.empty(0)
    if array.shape != part.shape or not np.isfinite(array).all():
        raise DataError(f"{source}: annot_id {annot_id!r}: {part.name} scores {scores!r}, expected "
                        f"{' x '.join(map(str, part.shape))} finite numbers")
    return array


def write_vcr_csv(path: str | Path, predictions: VcrPredictions) -> None:
    """`predictions` as the leaderboard's CSV (the columns of the parts they hold), written whole."""
    held = held_scores(predictions)
    parts = [part for part in PARTS if part.name in held]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow([ID_COLUMN, *(column for part in parts for column in part.columns)])
    for annot_id in predictions:
        writer.writerow([annot_id, *(repr(v) for part in parts for v in held[part.name][annot_id].ravel().tolist())])
    write_atomically(path, text.getvalue())


def read_vcr_csv(path: str | Path) -> VcrPredictions:
    """A leaderboard CSV, whole or one run's columns (in any order); DataError naming the line of
    a bad row, a repeated annot_id, or a header that is not the leaderboard's."""
    path = Path(path)
    predictions: VcrPredictions = {}
    first_line: dict[str, int] = {}
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # a spreadsheet's BOM is not in the header
            rows = csv.reader(f)
            header = next(rows, None)
            if header is None:
                raise DataError(f"{path}: empty, expected a header row starting {ID_COLUMN}")
            position, parts = _header_columns(header, path)
            for row in filter(None, rows):  # blank lines hold no row
                line = rows.line_num
                if len(row) != len(header):
                    raise DataError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
                annot_id = row[position[ID_COLUMN]]
                if annot_id in first_line:
                    raise DataError(f"{path}:{line}: annot_id {annot_id!r} again (first on line "
                                    f"{first_line[annot_id]})")
                first_line[annot_id] = line
                prediction = predictions[annot_id] = VcrPrediction()
                for part in parts:
                    part.put(prediction, np.array([_score(row[position[c]], c, path, line)
                                                   for c in part.columns]).reshape(part.shape))
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return predictions


def _header_columns(header: list[str], path: Path) -> tuple[dict[str, int], list[Part]]:
    """Column → position, and the parts whose columns are all there."""
    position = {column: n for n, column in enumerate(header)}
    known = {ID_COLUMN, *(column for part in PARTS for column in part.columns)}
    problems = [f"column {column!r} repeated" for column in position if header.count(column) > 1]
    problems += [f"unknown column {column!r}" for column in position if column not in known]
    if ID_COLUMN not in position:
        problems.append(f"no {ID_COLUMN} column")
    parts = []
    for part in PARTS:
        given = [column for column in part.columns if column in position]
        if given and len(given) < len(part.columns):
            problems.append(f"{part.name} columns incomplete (has {len(given)} of {len(part.columns)})")
        elif given:
            parts.append(part)
    if not parts and ID_COLUMN in position:
        problems.append("neither answer_* nor rationale_conditioned_on_* columns")
    if problems:
        raise DataError(f"{path}:1: not a VCR leaderboard header: {'; '.join(problems)}")
    return position, parts


def _score(text: str, column: str, path: Path, line: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{path}:{line}: {column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"{path}:{line}: {column} is {text}")
    return value


def merge_vcr_predictions(parts: Sequence[str | Path]) -> VcrPredictions:
    """The CSVs of separate runs (Q->A, QA->R) joined by annot_id into one set of predictions.
    DataError when two files give the same columns or do not predict the same annotations."""
    merged: VcrPredictions = {}
    given_by: dict[str, Path] = {}  # part name → the file that gave it
    for n, path in enumerate(map(Path, parts)):
        predictions = read_vcr_csv(path)
        if n:
            check_prediction_ids(merged, predictions, "annot_id", path)
        held = held_scores(predictions, path)
        for part in (part for part in PARTS if part.name in held):
            if part.name in given_by:
                raise DataError(f"{path}: its {part.name} columns are given by {given_by[part.name]} already")
            given_by[part.name] = path
            for annot_id, scores in held[part.name].items():
                part.put(merged.setdefault(annot_id, VcrPrediction()), scores)
    return merged


def score_vcr(labels: dict[str, tuple[int, int]], predictions: VcrPredictions,
              source: str | Path = "predictions") -> dict[str, float]:
    """Percent right (2 decimals) over `labels` (annot_id → (answer label, rationale label)) for each
    metric whose parts the predictions hold: q2a from answers alone, qa2r from rationales alone,
    q2ar from both. DataError (naming `source`) when the predictions miss or add annot_ids,
    when some hold a part that others lack, or when they hold no part at all."""
    check_prediction_ids(labels, predictions, "annot_id", source)
    if not labels:
        raise DataError(f"{source}: no labelled annotations to score")
    held = held_scores(predictions, source)
    if not held:
        raise DataError(f"{source}: the predictions hold neither answer nor rationale scores")
    metrics = {name: metric for name, metric in METRICS.items() if set(metric.needs) <= set(held)}
    hits = dict.fromkeys(metrics, 0)
    for annot_id, label in labels.items():
        scores = {name: by_id[annot_id] for name, by_id in held.items()}
        for name, metric in metrics.items():
            hits[name] += metric.hit(scores, *label)
    return {name: round(100 * count / len(labels), 2) for name, count in hits.items()}


def read_vcr_labels(path: str | Path) -> dict[str, tuple[int, int]]:
    """annot_id → (answer_label, rationale_label) of a published annotation file (val.jsonl);
    DataError for a malformed line, a repeated annot_id, or a file without annotations."""
    path = Path(path)
    labels: dict[str, tuple[int, int]] = {}
    for line, value in iter_jsonl(path):
        annotation = parse_annotation(value, path, line, labelled=True)
        if annotation.annot_id in labels:
            raise DataError(f"{path}:{line}: annot_id {annotation.annot_id!r} again")
        labels[annotation.annot_id] = (annotation.answer_label, annotation.rationale_label)
    if not labels:
        raise DataError(f"{path}: holds no annotation; expected one labelled VCR annotation (a JSON object) a line")
    return labels


def evaluate_vcr(annotations: str | Path, predictions: str | Path | Sequence[str | Path]) -> dict[str, float]:
    """Scores a leaderboard CSV (or the CSVs of separate Q->A and QA->R runs) against the labels
    of a published annotation file (val.jsonl): {"q2a", "qa2r", "q2ar"} as far as the CSVs allow."""
    labels = read_vcr_labels(annotations)
    paths = [Path(predictions)] if isinstance(predictions, (str, Path)) else [Path(p) for p in predictions]
    return score_vcr(labels, merge_vcr_predictions(paths), ", ".join(map(str, paths)))
