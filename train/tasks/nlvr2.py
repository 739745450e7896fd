"""NLVR2 (Suhr et al. 2019): is a statement true of a pair of images? Each image is encoded with the
statement (`[CLS] statement [SEP] [IMG]… [END]`), the two pooled [CLS] outputs are joined and
classified false or true (`VLBertForPairClassification`), trained with cross-entropy and scored by
accuracy, with consistency (distinct statements right on every pair they are paired with) beside
it; predictions as the leaderboard's CSV (`identifier,True|False`), which `vlbert evaluate nlvr2`
scores. Its annotation items (`train.data.annotations.StatementPair`, `vlbert data prepare
nlvr2`), on the left image's record: "nlvr2": [{"identifier", "sentence", "label", "right"}]; an
unlabelled statement's label is null.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from train.data.annotations import AnnotationFile
from train.data.datasets import AnnotatedDataset, SampleGroup, pair_sample
from train.data.regions import RegionBank
from train.evaluation.nlvr2 import score_nlvr2, statement_scores, write_nlvr2_predictions
from train.tasks.base import Evaluator, Task, TaskData, scored, union, unscored
from vlbert.losses import IGNORE_INDEX
from vlbert.modeling import VLBertForPairClassification


class VisualReasoning(AnnotatedDataset):
    """A statement's sample: a group of two, the statement with the left image's RoIs and with the
    right image's; target its truth value (1 true, 0 false) in both (the loss ignores an unlabelled
    statement). Statements whose right image the store lacks are left out."""

    KIND = "nlvr2"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 seed: int = 0) -> None:
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        # The annotation file leaves out the records of left images that the store lacks; the
        # statements whose right image it lacks are left out here, counted in `missing_right`.
        held = np.array([self.item(index)[1].right_image_id in regions for index in range(len(self.items))], bool)
        self.items, self.missing_right = self.items[held], int((~held).sum())

    def sample(self, index: int) -> SampleGroup:
        annotation, statement = self.item(index)
        label = IGNORE_INDEX if statement.label is None else int(statement.label)
        pieces = self.word_pieces(statement.sentence).ids
        images = ((annotation.image_id, annotation.file), (statement.right_image_id, statement.right))
        return SampleGroup([pair_sample(self.tokenizer, self.max_length, self.regions[image_id], file, pieces,
                                        {"labels": label}, statement.identifier) for image_id, file in images])


class ReasoningAccuracy(Evaluator):
    """The truth value right, against always giving the split's more frequent label; consistency
    (`train.evaluation.nlvr2`) beside it."""

    metric = "nlvr2_accuracy"
    merged = {"predicted": union}

    def __init__(self, data: TaskData, dataset: VisualReasoning) -> None:
        statements = [dataset.item(index)[1] for index in range(len(dataset))]
        self.truth = {s.identifier: s.label for s in statements if s.label is not None}
        self.predicted: dict[str, bool] = {}

    def add(self, samples, inputs, output) -> None:
        for group, top in zip(samples, output.logits.argmax(1).tolist()):
            self.predicted[group.samples[0].item_id] = bool(top)

    def _predicted_truth(self) -> dict[str, bool]:
        """The labels of the predicted statements (an unlabelled one has none)."""
        return {identifier: self.truth[identifier] for identifier in self.predicted if identifier in self.truth}

    def result(self) -> dict[str, Any]:
        truth = self._predicted_truth()
        if not truth:
            return unscored(self.metric, len(self.predicted))
        right = sum(statement_scores(truth, self.predicted).values())
        more_frequent = Counter(truth.values()).most_common(1)[0][1]
        official = score_nlvr2(truth, self.predicted)
        return {**scored(self.metric, right, more_frequent, len(truth)),
                "consistency": round(official["consistency"] / 100, 4), "official": official}

    def write(self, path: Path) -> None:
        write_nlvr2_predictions(path, self.predicted)

    def item_scores(self) -> dict[str, float]:
        return statement_scores(self._predicted_truth(), self.predicted)


def _dataset(data: TaskData, options: Any, annotations: AnnotationFile, seed: int, training: bool):
    return VisualReasoning(annotations, data.regions, data.tokenizer, data.max_length, seed=seed)


TASK = Task("nlvr2", VLBertForPairClassification, _dataset, ReasoningAccuracy,
            "NLVR2 visual reasoning: whether a statement is true of a pair of images", ".csv")
