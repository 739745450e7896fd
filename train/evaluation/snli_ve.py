"""SNLI-VE accuracy (Xie et al. 2019): the share of pairs whose predicted label (entailment, neutral or
contradiction) is the gold label, in percent with 2 decimals, overall and per gold label. Predictions
file: a JSON list [{"pair_id": str, "label": str}, ...], one per pair of the split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from train.data.annotations import ENTAILMENT_LABELS
from train.data.files import DataError, read_json, shown
from train.data.sources.snli_ve import NO_CONSENSUS, read_pairs
from train.evaluation.predictions import check_prediction_ids
from vlbert.utils.atomic import write_atomically


def pair_scores(truth: dict[str, str], predictions: dict[str, str]) -> dict[str, float]:
    """pair_id → 1.0 when its prediction is its gold label, else 0.0, for every pair of `truth`."""
    return {pair_id: float(predictions[pair_id] == label) for pair_id, label in truth.items()}


def score_snli_ve(truth: dict[str, str], predictions: dict[str, str]) -> dict[str, Any]:
    """{"accuracy": %, "count", "per_label": {label: % of its pairs}} of `predictions` (which must
    label every pair of `truth`, pair_id → gold label)."""
    if not truth:
        raise ValueError("score_snli_ve: no pairs to score")
    scores = pair_scores(truth, predictions)
    per_label = {label: [scores[pair_id] for pair_id, gold in truth.items() if gold == label]
                 for label in ENTAILMENT_LABELS}
    return {"accuracy": _percent(list(scores.values())), "count": len(scores),
            "per_label": {label: _percent(values) for label, values in per_label.items() if values}}


def _percent(scores: list[float]) -> float:
    return round(100.0 * sum(scores) / len(scores), 2)


def evaluate_snli_ve(annotations: str | Path, predictions: str | Path) -> dict[str, Any]:
    """`score_snli_ve` of a predictions file against a published snli_ve_<split>.jsonl (pairs labelled
    "-" left out, as the preparation leaves them out). DataError for a file without pairs, a malformed
    predictions file, and pair_ids repeated, missing or unknown."""
    annotations, predictions = Path(annotations), Path(predictions)
    truth = {pair.pair_id: pair.label for pair in read_pairs(annotations) if pair.label != NO_CONSENSUS}
    if not truth:
        raise DataError(f"{annotations}: holds no labelled pair: nothing to score")
    given = read_snli_ve_predictions(predictions)
    check_prediction_ids(truth, [pair_id for pair_id, _ in given], "pair_id", predictions)
    return score_snli_ve(truth, dict(given))


def read_snli_ve_predictions(path: Path) -> list[tuple[str, str]]:
    """(pair_id, label) of every prediction, in file order; DataError naming a malformed one."""
    items = read_json(path)
    if not isinstance(items, list):
        raise DataError(f'{path}: expected a JSON list of {{"pair_id": str, "label": str}} objects')
    predictions = []
    for index, item in enumerate(items):
        pair_id = item.get("pair_id") if isinstance(item, dict) else None
        label = item.get("label") if isinstance(item, dict) else None
        if not isinstance(pair_id, str) or label not in ENTAILMENT_LABELS:
            raise DataError(f'{path}: item {index} is {shown(item)}, expected {{"pair_id": str, "label": one of '
                            f'{", ".join(ENTAILMENT_LABELS)}}}')
        predictions.append((pair_id, label))
    return predictions


def write_snli_ve_predictions(path: str | Path, predictions: dict[str, str]) -> None:
    """`predictions` (pair_id → label) as a predictions file, by pair_id, replaced whole or not at all."""
    write_atomically(path, json.dumps([{"pair_id": pair_id, "label": predictions[pair_id]}
                                       for pair_id in sorted(predictions)]))
