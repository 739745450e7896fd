"""Referring expressions (RefCOCO, RefCOCO+, RefCOCOg): the referred RoI among the image's."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from train.data.annotations import AnnotationFile
from train.data.datasets import AnnotatedDataset, Sample, published_id
from train.evaluation.refer import box_ious, pairwise_iou, score_refer, write_refer_predictions
from train.tasks.base import Evaluator, Task, TaskData, union
from vlbert.modeling import VLBertForReferringExpressions
from vlbert.tokenization import build_caption_sequence


class ReferringExpressions(AnnotatedDataset):
    """An expression and every RoI scored; RoIs with IoU ≥ 0.5 to the referred box are positives."""

    KIND = "refs"

    def sample(self, index: int) -> Sample:
        annotation, ref = self.item(index)
        regions = self.regions[annotation.image_id]
        sequence = build_caption_sequence(self.tokenizer, self.word_pieces(ref.text).ids, len(regions),
                                          self.max_length)
        regions = regions.truncated(sequence.num_regions)
        iou = box_ious(regions.boxes, [ref.box])[:, 0]
        iou[0] = 0.0  # the whole-image box is never the answer
        return Sample(sequence, regions, annotation.file,
                      region_targets={"labels": (iou >= 0.5).astype(np.float32), "iou": iou},
                      item_id=published_id(ref.sent_id, index))


class GroundingAccuracy(Evaluator):
    """Referring expressions: the top RoI's box with IoU ≥ 0.5 to the referred box, against a
    uniformly drawn RoI; predictions as [{"sent_id", "box"}]."""

    metric = "refexp_accuracy"
    merged = {"predicted": union, "chance": operator.add}

    def __init__(self, data: TaskData, dataset: ReferringExpressions) -> None:
        self.truth = {}
        for index in range(len(dataset)):
            _, ref = dataset.item(index)
            self.truth[index if ref.sent_id is None else ref.sent_id] = ref.box
        self.predicted: dict[int, list[float]] = {}
        self.chance = 0.0

    def add(self, samples, inputs, output) -> None:
        candidates = inputs["box_mask"].clone()
        candidates[:, 0] = False  # the whole-image box is not a candidate
        top = output.logits.masked_fill(~candidates, float("-inf")).argmax(1)
        boxes = inputs["boxes"][torch.arange(len(top)), top]
        for sample, box in zip(samples, boxes.tolist()):
            self.predicted[sample.item_id] = box
        positives = ((inputs["iou"] >= 0.5) & candidates).sum(1).float()
        self.chance += float((positives / candidates.sum(1).clamp(min=1)).sum())

    def result(self) -> dict[str, Any]:
        scored = score_refer({i: self.truth[i] for i in self.predicted}, self.predicted)
        count = scored["count"]
        return {"metric": self.metric, "value": round(scored["accuracy"] / 100, 4),
                "chance": round(self.chance / max(count, 1), 4), "samples": count}

    def write(self, path: Path) -> None:
        write_refer_predictions(path, self.predicted)

    def item_scores(self) -> dict[str, float]:
        ids = list(self.predicted)
        iou = pairwise_iou(np.asarray([self.predicted[i] for i in ids], float).reshape(-1, 4),
                           np.asarray([self.truth[i] for i in ids], float).reshape(-1, 4))
        return {str(i): float(hit) for i, hit in zip(ids, iou >= 0.5)}


def _dataset(data: TaskData, options: Any, annotations: AnnotationFile, seed: int, training: bool):
    return ReferringExpressions(annotations, data.regions, data.tokenizer, data.max_length, seed=seed)


TASK = Task("refexp", VLBertForReferringExpressions, _dataset, GroundingAccuracy,
            "referring expressions (RefCOCO, RefCOCO+, RefCOCOg): the referred RoI", ".json")
