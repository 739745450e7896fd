"""Visual entailment (SNLI-VE, Xie et al. 2019): does the image (the premise) entail the hypothesis,
contradict it, or neither? `[CLS] hypothesis [SEP] [IMG]… [END]`, three classes from the pooled
[CLS], trained with cross-entropy and scored by accuracy; predictions as [{"pair_id", "label"}],
which `vlbert evaluate snli-ve` scores. Its annotation items (`train.data.annotations.EntailmentPair`),
one list per image (`vlbert data prepare snli-ve`): "snli_ve": [{"pair_id", "hypothesis", "label"}];
an unlabelled pair's label is null.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from train.data.annotations import ENTAILMENT_LABELS, AnnotationFile
from train.data.datasets import AnnotatedDataset, Sample, pair_sample
from train.evaluation.snli_ve import pair_scores, score_snli_ve, write_snli_ve_predictions
from train.tasks.base import Evaluator, Task, TaskData, scored, union, unscored
from vlbert.losses import IGNORE_INDEX
from vlbert.modeling import VLBertForSequenceClassification


class VisualEntailment(AnnotatedDataset):
    """A pair's sample: the image's RoIs and the hypothesis; target the index of its label in
    ENTAILMENT_LABELS (the loss ignores an unlabelled pair)."""

    KIND = "snli_ve"

    def sample(self, index: int) -> Sample:
        annotation, pair = self.item(index)
        label = IGNORE_INDEX if pair.label is None else ENTAILMENT_LABELS.index(pair.label)
        return pair_sample(self.tokenizer, self.max_length, self.regions[annotation.image_id], annotation.file,
                           self.word_pieces(pair.hypothesis).ids, {"labels": label}, pair.pair_id)


class EntailmentAccuracy(Evaluator):
    """The top label right, against always giving the split's most frequent gold label."""

    metric = "snli_ve_accuracy"
    merged = {"predicted": union}

    def __init__(self, data: TaskData, dataset: VisualEntailment) -> None:
        pairs = (dataset.item(index)[1] for index in range(len(dataset)))
        self.truth = {pair.pair_id: pair.label for pair in pairs if pair.label is not None}
        self.predicted: dict[str, str] = {}

    def add(self, samples, inputs, output) -> None:
        for sample, top in zip(samples, output.logits.argmax(1).tolist()):
            self.predicted[sample.item_id] = ENTAILMENT_LABELS[top]

    def _predicted_truth(self) -> dict[str, str]:
        """The gold labels of the predicted pairs (an unlabelled pair has none)."""
        return {pair_id: self.truth[pair_id] for pair_id in self.predicted if pair_id in self.truth}

    def result(self) -> dict[str, Any]:
        truth = self._predicted_truth()
        if not truth:
            return unscored(self.metric, len(self.predicted))
        right = sum(pair_scores(truth, self.predicted).values())
        most_frequent = Counter(truth.values()).most_common(1)[0][1]
        return {**scored(self.metric, right, most_frequent, len(truth)), "official": score_snli_ve(truth, self.predicted)}

    def write(self, path: Path) -> None:
        write_snli_ve_predictions(path, self.predicted)

    def item_scores(self) -> dict[str, float]:
        return pair_scores(self._predicted_truth(), self.predicted)


def _dataset(data: TaskData, options: Any, annotations: AnnotationFile, seed: int, training: bool):
    return VisualEntailment(annotations, data.regions, data.tokenizer, data.max_length, seed=seed)


TASK = Task("snli_ve", VLBertForSequenceClassification, _dataset, EntailmentAccuracy,
            "SNLI-VE visual entailment: entailment, neutral or contradiction of a hypothesis by the image", ".json",
            model_config=lambda data, options: {"num_labels": len(ENTAILMENT_LABELS),
                                                "label_names": list(ENTAILMENT_LABELS)})
