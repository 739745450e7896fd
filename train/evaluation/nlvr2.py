"""NLVR2's two metrics (Suhr et al. 2019): accuracy, the share of statements whose predicted truth
value is their label; and consistency, the share of distinct statements right on every image pair
they are paired with. A distinct statement is its (split, set id, sentence id), the identifier
split-setid-pairid-sentenceid without its pair id, as the official script (lil-lab/nlvr,
nlvr2/eval/metrics.py) groups them: NLVR2 pairs each sentence written for a set with several of the
set's image pairs, and the same text under two sentence ids is two statements. Both in percent with 2 decimals.
Predictions file: the leaderboard's CSV, one line `identifier,True` or `identifier,False` per
statement of the split.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from train.data.files import DataError, read_text, shown
from train.data.sources.nlvr2 import LABELS, read_statements
from train.evaluation.predictions import check_prediction_ids
from vlbert.utils.atomic import write_atomically


def statement_group(identifier: str) -> tuple[str, str, str]:
    """The distinct statement that an item states: (split, set id, sentence id) of its identifier,
    split-setid-pairid-sentenceid (`train.data.sources.nlvr2` checks that form)."""
    split, set_id, _, sentence_id = identifier.split("-")
    return split, set_id, sentence_id


def statement_scores(truth: dict[str, bool], predictions: dict[str, bool]) -> dict[str, float]:
    """identifier → 1.0 when its prediction is its label, else 0.0, for every statement of `truth`."""
    return {identifier: float(predictions[identifier] == label) for identifier, label in truth.items()}


def score_nlvr2(truth: dict[str, bool], predictions: dict[str, bool]) -> dict[str, Any]:
    """{"accuracy": %, "consistency": %, "count", "statements"} of `predictions` (identifier → truth
    value, one for every statement of `truth`, identifier → label); "statements" counts the distinct
    ones."""
    if not truth:
        raise ValueError("score_nlvr2: no statements to score")
    scores = statement_scores(truth, predictions)
    groups = consistent(scores)
    return {"accuracy": _percent(list(scores.values())), "consistency": _percent(groups), "count": len(scores),
            "statements": len(groups)}


def consistent(scores: dict[str, float]) -> list[float]:
    """1.0 for each distinct statement of `scores` (identifier → 0/1) right on every pair, else 0.0."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for identifier, score in scores.items():
        groups[statement_group(identifier)].append(score)
    return [min(group) for group in groups.values()]


def _percent(scores: list[float]) -> float:
    return round(100.0 * sum(scores) / len(scores), 2)


def evaluate_nlvr2(annotations: str | Path, predictions: str | Path) -> dict[str, Any]:
    """`score_nlvr2` of a predictions file against a published <split>.json. DataError for a file
    without labelled statements, a malformed predictions file, and identifiers repeated, missing or
    unknown."""
    annotations, predictions = Path(annotations), Path(predictions)
    statements = [s for s in read_statements(annotations) if s.label is not None]
    if not statements:
        raise DataError(f"{annotations}: holds no labelled statement: nothing to score")
    given = read_nlvr2_predictions(predictions)
    check_prediction_ids([s.identifier for s in statements], [identifier for identifier, _ in given], "identifier",
                         predictions)
    return score_nlvr2({s.identifier: s.label for s in statements}, dict(given))


def read_nlvr2_predictions(path: Path) -> list[tuple[str, bool]]:
    """(identifier, truth value) of every line, in file order; DataError naming a malformed line."""
    predictions = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        identifier, _, value = line.strip().partition(",")
        if not identifier or value not in LABELS:
            raise DataError(f"{path}:{number}: {shown(line)}, expected identifier,True or identifier,False")
        predictions.append((identifier, LABELS[value]))
    return predictions


def write_nlvr2_predictions(path: str | Path, predictions: dict[str, bool]) -> None:
    """`predictions` (identifier → truth value) as the leaderboard's CSV, by identifier, replaced
    whole or not at all."""
    write_atomically(path, "".join(f"{identifier},{predictions[identifier]}\n" for identifier in sorted(predictions)))
