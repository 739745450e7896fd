"""Referring-expression comprehension accuracy (RefCOCO, RefCOCO+, RefCOCOg): an expression counts as
comprehended when its predicted box overlaps the referred object's ground-truth box with IoU ≥ 0.5,
the criterion of the refer toolkit's evaluation demo and of VL-BERT.

Boxes are continuous pixel coordinates [x1, y1, x2, y2] with area (x2 - x1) · (y2 - y1); the
toolkit's demo and VL-BERT's test script count pixels inclusively instead (width x2 - x1 + 1), which
scores small boxes slightly differently. Predictions file: [{"sent_id": int, "box": [x1, y1, x2, y2]}].
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from train.data.files import DataError, read_json
from train.data.sources.refer import Box, Ref, published_files, read_instances, read_refs
from train.evaluation.predictions import check_prediction_ids
from vlbert.utils.atomic import write_atomically

IOU_THRESHOLD = 0.5


def score_refer(truth: dict[int, Box], predictions: dict[int, Box]) -> dict[str, Any]:
    """{"accuracy": percent of `truth`'s expressions whose predicted box has IoU ≥ 0.5 with the true
    one (2 decimals; 0 when there are none), "count"}; `predictions` must hold every id of `truth`."""
    ids = list(truth)
    if not ids:
        return {"accuracy": 0.0, "count": 0}
    iou = pairwise_iou(np.array([truth[i] for i in ids], np.float64),
                       np.array([predictions[i] for i in ids], np.float64))
    return {"accuracy": round(100.0 * float(np.mean(iou >= IOU_THRESHOLD)), 2), "count": len(ids)}


def pairwise_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of a[i] with b[i], (N, 4) xyxy each; an empty or inverted box has area 0."""
    overlap = np.clip(np.minimum(a[:, 2:], b[:, 2:]) - np.maximum(a[:, :2], b[:, :2]), 0, None).prod(axis=1)
    union = _area(a) + _area(b) - overlap
    return np.divide(overlap, union, out=np.zeros_like(overlap), where=union > 0)


def box_ious(boxes: np.ndarray, targets: list[list[float]]) -> np.ndarray:
    """(N, len(targets)) float32: each of the N xyxy `boxes`' IoU with each target box, bit for bit as
    torchvision's `box_iou` gives it (training's targets were computed so: an inverted box has a
    negative area, an empty union gives NaN), at a fifth of its cost on the few boxes of a sample."""
    a = np.asarray(boxes, np.float32).reshape(-1, 4)[:, None]
    b = np.asarray(targets, np.float32).reshape(-1, 4)[None]
    with np.errstate(all="ignore"):  # as torch: non-finite boxes give non-finite values, without warnings
        # Targets first: where +0 meets -0, torch's max and min give their first argument, NumPy's their second.
        sides = np.minimum(b[..., 2:], a[..., 2:]) - np.maximum(b[..., :2], a[..., :2])
        sides = np.where(sides < 0, np.float32(0), sides)  # torch's clamp(min=0): -0 and NaN kept
        inter = sides[..., 0] * sides[..., 1]
        areas = [(x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1]) for x in (a, b)]
        return inter / (areas[0] + areas[1] - inter)


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[:, 2:] - boxes[:, :2], 0, None).prod(axis=1)


def evaluate_refer(data: str | Path, dataset: str, split: str, predictions: str | Path,
                   split_by: str | None = None) -> dict[str, Any]:
    """`score_refer` of the predictions file against `split` of `dataset` under the refer toolkit's
    DATA folder `data`. Refs whose object is not in instances.json are left out, as the preparation
    leaves them out. DataError for a split the refs file lacks or whose expressions are all unusable,
    a malformed predictions file, and sent_ids repeated, missing or unknown."""
    truth = refer_truth(Path(data), dataset, split, split_by)
    predictions = Path(predictions)
    given = read_refer_predictions(predictions)
    check_prediction_ids(truth, [sent_id for sent_id, _ in given], "sent_id", predictions)
    return score_refer(truth, dict(given))


def refer_truth(data: Path, dataset: str, split: str, split_by: str | None = None) -> dict[int, Box]:
    """sent_id → the referred object's box (xyxy), for every usable expression of `split`; DataError
    saying why when there is none (nothing could be scored)."""
    files = published_files(data, dataset, split_by)
    refs = read_refs(files.refs)
    published = list(dict.fromkeys(ref.split for ref in refs))
    if split not in published:
        raise DataError(f"{files.refs}: no split {split!r}; the file holds {', '.join(published) or 'no refs'}")
    instances = read_instances(files.instances)
    in_split = [(ref, instances.problem(ref)) for ref in refs if ref.split == split]
    truth = {sentence.sent_id: instances.annotations[ref.ann_id].box
             for ref, problem in in_split if problem is None for sentence in ref.sentences}
    if not truth:
        raise DataError(f"{files.refs}: split {split!r} has no expression to score: {_why_unusable(in_split)}")
    return truth


def _why_unusable(refs: list[tuple[Ref, str | None]]) -> str:
    """Why (ref, its problem or None) pairs give no expression: refs that cannot be used, or none with sentences."""
    problems = [problem for _, problem in refs if problem is not None]
    why = [f"{len(problems)} of its {len(refs)} refs cannot be used (first: {problems[0]})"] if problems else []
    if len(problems) < len(refs):
        why.append(f"{len(refs) - len(problems)} of its refs hold no sentences")
    return "; ".join(why)


def read_refer_predictions(path: Path) -> list[tuple[int, Box]]:
    """(sent_id, box) of every prediction, in file order; DataError naming a malformed one."""
    value = read_json(path)
    if not isinstance(value, list):
        raise DataError(f'{path}: expected a list of {{"sent_id", "box"}}, found {type(value).__name__}')
    return [_prediction(item, path, index) for index, item in enumerate(value)]


def _prediction(item: Any, path: Path, index: int) -> tuple[int, Box]:
    sent_id = item.get("sent_id") if isinstance(item, dict) else None
    box = item.get("box") if isinstance(item, dict) else None
    if not isinstance(sent_id, int) or isinstance(sent_id, bool):
        raise DataError(f'{path}: prediction {index}: expected {{"sent_id": int, "box": [x1, y1, x2, y2]}}, '
                        f"found {item!r}")
    if not (isinstance(box, list) and len(box) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)):
        raise DataError(f"{path}: prediction {index} (sent_id {sent_id}): box {box!r} is not four finite numbers "
                        "[x1, y1, x2, y2]")
    return sent_id, [float(v) for v in box]


def write_refer_predictions(path: str | Path, predictions: dict[int, Box]) -> None:
    """`predictions` (sent_id → xyxy box) as a predictions file, by sent_id, replaced whole or not at all."""
    write_atomically(path, json.dumps([{"sent_id": int(sent_id), "box": [float(v) for v in predictions[sent_id]]}
                                       for sent_id in sorted(predictions)]))
