"""The fine-tuning and pre-training tasks, one record each: how a stage of the task builds its
dataset and model, and how its evaluation scores predictions and writes them in the format the
benchmark's own tool (`vlbert evaluate`) and leaderboard accept.

A new task is one `Task` in `TASKS`; the trainer, the config check and evaluation know no task by name.
"""

from __future__ import annotations

import inspect
import json
import math
import operator
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cache, cached_property, reduce
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from extract.atomic import write_atomically
from train.data.annotations import AnnotationFile, AnswerVocabulary, answers_by_type
from train.data.datasets import (
    AnnotatedDataset,
    CaptionPretraining,
    MultipleChoice,
    QuestionAnswering,
    ReferringExpressions,
    RetrievalCandidates,
    RetrievalPairs,
    Sample,
    VisualCommonsense,
)
from train.data.regions import RegionBank
from train.evaluation.refer import pairwise_iou, score_refer, write_refer_predictions
from train.evaluation.vcr import VcrPrediction, write_vcr_csv
from train.evaluation.vqa2 import VqaTruth, question_accuracy, score_vqa, write_vqa_predictions
from vlbert.modeling import (
    VLBertForImageTextMatching,
    VLBertForMultipleChoice,
    VLBertForPreTraining,
    VLBertForQuestionAnswering,
    VLBertForReferringExpressions,
    VLBertModel,
    VLBertPreTrainedModel,
)

# Batch entries that are targets: evaluation predicts without them.
TARGETS = frozenset({"labels", "mlm_labels", "region_labels", "relationship_labels"})


@dataclass
class TaskData:
    """What every task's datasets draw on: the store, the tokenizer and the training annotations."""

    regions: RegionBank
    tokenizer: Any
    max_length: int
    train: AnnotationFile
    answers_file: str | None = None  # VQA: answers.txt of `vlbert data prepare vqa2`

    @cached_property
    def answers(self) -> AnswerVocabulary:
        """The VQA answer vocabulary: the prepared answers.txt, or every training answer."""
        if self.answers_file is not None:
            return AnswerVocabulary.from_file(self.answers_file)
        return AnswerVocabulary.from_annotations(self.train)

    @cached_property
    def answers_by_type(self) -> dict[str | None, list[str]]:
        return answers_by_type(self.train)


@dataclass(frozen=True)
class Task:
    name: str
    model: type[VLBertPreTrainedModel]
    # (data, stage settings, annotations, seed, training) → the dataset of a stage or of its evaluation
    dataset: Callable[[TaskData, Any, AnnotationFile, int, bool], AnnotatedDataset]
    evaluator: Callable[[TaskData, AnnotatedDataset], Evaluator]
    about: str
    prediction_suffix: str | None = None  # the predictions file's, where the task writes one

    def uses_answers(self) -> bool:
        return self.model is VLBertForQuestionAnswering


def model_inputs(model: torch.nn.Module, batch: dict[str, Any], targets: bool = True) -> dict[str, Any]:
    """The entries of `batch` that `model.forward` takes (with its `**inputs`: VLBertModel's);
    without the targets when `targets` is False."""
    names = _forward_inputs(type(getattr(model, "module", model)))
    return {k: v for k, v in batch.items() if k in names and (targets or k not in TARGETS)}


@cache
def _forward_inputs(cls: type) -> frozenset[str]:
    """Looked up once per model class: model_inputs runs every training step."""
    parameters = inspect.signature(cls.forward).parameters
    names = set(parameters)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        names |= set(inspect.signature(VLBertModel.forward).parameters)
    return frozenset(names)


# ---- evaluation: one Evaluator per task, fed batch by batch -----------------------------------


def _union(first: dict, second: dict) -> dict:
    return {**first, **second}


def _filled(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Two shards' score matrices, each NaN where the other scored."""
    return np.where(np.isnan(first), second, first)


class Evaluator:
    """Scores a task's outputs batch by batch; `result()` gives {"metric", "value", "chance"} (value
    None where the split has no labels), `write(path)` the predictions file, and `item_scores()`
    each scored item's score (id → 0–1), whose mean is `value`: what paired comparisons and
    bootstrap intervals resample without running the model again.

    `merged` names what `add` accumulates and how two shards' values combine: ranks evaluate
    slices of a split, and rank 0 merges their `state()`s in rank order."""

    metric = ""
    merged: ClassVar[dict[str, Callable[[Any, Any], Any]]] = {}

    def add(self, samples: list[Sample], inputs: dict[str, torch.Tensor], output) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.merged}

    def merge(self, states: list[dict[str, Any]]) -> None:
        """Takes the combined accumulations of every shard's `state()` (this one's among them)."""
        for name, combine in self.merged.items():
            setattr(self, name, reduce(combine, [state[name] for state in states]))

    def result(self) -> dict[str, Any]:
        raise NotImplementedError

    def write(self, path: Path) -> None:
        """The predictions in the benchmark's format (tasks without one write nothing)."""

    def item_scores(self) -> dict[str, float]:
        return {}


class MaskedWordAccuracy(Evaluator):
    """Pre-training: masked words predicted right, against always predicting the most common word."""

    metric = "masked_word_accuracy"
    merged = {"correct": operator.add, "count": operator.add, "words": operator.add}

    def __init__(self, data: TaskData, dataset: AnnotatedDataset) -> None:
        self.correct, self.count, self.words = 0, 0, Counter()

    def add(self, samples, inputs, output) -> None:
        labels = inputs["mlm_labels"]
        chosen = labels != -100
        self.correct += int((output.mlm_logits.argmax(-1)[chosen] == labels[chosen]).sum())
        self.words.update(labels[chosen].tolist())
        self.count += int(chosen.sum())

    def result(self) -> dict[str, Any]:
        chance = self.words.most_common(1)[0][1] if self.words else 0
        return _scores(self.metric, self.correct, chance, self.count)


class AnswerAccuracy(Evaluator):
    """VQA: the top answer scored by the official VQA evaluation, against always giving the most
    frequent training answer; predictions as the VQA submission JSON."""

    metric = "vqa_accuracy"
    merged = {"predicted": _union}

    def __init__(self, data: TaskData, dataset: QuestionAnswering) -> None:
        self.answers = data.answers
        self.truth: dict[int, VqaTruth] = {}
        for index in range(len(dataset)):
            _, question = dataset.item(index)
            if question.answers:
                self.truth[_question_id(question, index)] = VqaTruth(question.answers, question.answer_type or "",
                                                                     question.question_type or "")
        self.predicted: dict[int, str] = {}

    def add(self, samples, inputs, output) -> None:
        for sample, top in zip(samples, output.logits.argmax(1).tolist()):
            self.predicted[sample.item_id] = self.answers.answers[top]

    def result(self) -> dict[str, Any]:
        scored = {qid: answer for qid, answer in self.predicted.items() if qid in self.truth}
        if not scored:
            return _unscored(self.metric, len(self.predicted))
        truth = {qid: self.truth[qid] for qid in scored}
        official = score_vqa(truth, scored)
        chance = score_vqa(truth, {qid: self.answers.answers[0] for qid in scored})["overall"]
        return {"metric": self.metric, "value": round(official["overall"] / 100, 4), "chance": round(chance / 100, 4),
                "samples": len(scored), "official": official}

    def write(self, path: Path) -> None:
        write_vqa_predictions(path, self.predicted)

    def item_scores(self) -> dict[str, float]:
        return {str(qid): question_accuracy(self.truth[qid].answers, answer)
                for qid, answer in self.predicted.items() if qid in self.truth}


class ChoiceAccuracy(Evaluator):
    """Multiple choice: the top candidate right, against always picking the most frequent right
    position. The demo world's questions write [{"question_id", "choice"}]; VCR steps write the
    leaderboard CSV's columns of their step."""

    metric = "choice_accuracy"
    merged = {"positions": operator.add, "scores": _union, "right": _union}

    def __init__(self, data: TaskData, dataset: AnnotatedDataset) -> None:
        self.positions = Counter()
        self.scores: dict[Any, list[float]] = {}
        self.right: dict[str, float] = {}

    def add(self, samples, inputs, output) -> None:
        probabilities = output.logits.float().softmax(1)
        for sample, row in zip(samples, probabilities.tolist()):
            self.scores[sample.item_id] = row
            label = sample.targets["labels"]
            if self._scored(sample) and label >= 0:
                self.right[self._key(sample)] = float(max(range(len(row)), key=row.__getitem__) == label)
                self.positions[label] += 1

    def _scored(self, sample: Sample) -> bool:
        return True

    def _key(self, sample: Sample) -> str:
        return str(sample.item_id)

    def result(self) -> dict[str, Any]:
        if not self.right:
            return _unscored(self.metric, len(self.scores))
        return _scores(self.metric, sum(self.right.values()), self.positions.most_common(1)[0][1], len(self.right))

    def item_scores(self) -> dict[str, float]:
        return dict(self.right)

    def write(self, path: Path) -> None:
        rows = [{"question_id": item, "choice": max(range(len(s)), key=s.__getitem__)} for item, s in self.scores.items()]
        write_atomically(path, json.dumps(sorted(rows, key=lambda row: row["question_id"])))


class CommonsenseAccuracy(ChoiceAccuracy):
    """VCR Q→A or QA→R accuracy (QA→R given the right answer, as VCR reports it); predictions as the
    leaderboard CSV's columns of the step (`vlbert evaluate vcr` merges the two steps' files)."""

    def __init__(self, data: TaskData, dataset: VisualCommonsense) -> None:
        super().__init__(data, dataset)
        self.step = dataset.step
        self.metric = f"vcr_{dataset.step}_accuracy"
        items = (dataset.item(i)[1] for i in range(len(dataset.items)))
        self.answer_labels = {item.annot_id: item.answer_label for item in items}

    def _scored(self, sample: Sample) -> bool:
        annot_id, conditioned = sample.item_id
        return conditioned is None or conditioned == self.answer_labels[annot_id]

    def _key(self, sample: Sample) -> str:
        return sample.item_id[0]

    def write(self, path: Path) -> None:
        predictions: dict[str, VcrPrediction] = defaultdict(VcrPrediction)
        for (annot_id, conditioned), row in self.scores.items():
            if conditioned is None:
                predictions[annot_id].answers = row
            else:
                predictions[annot_id].rationales[conditioned] = row
        write_vcr_csv(path, dict(predictions))


class GroundingAccuracy(Evaluator):
    """Referring expressions: the top RoI's box with IoU ≥ 0.5 to the referred box, against a
    uniformly drawn RoI; predictions as [{"sent_id", "box"}]."""

    metric = "refexp_accuracy"
    merged = {"predicted": _union, "chance": operator.add}

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


RECALL_AT = (1, 5, 10)


@dataclass
class RetrievalRanks:
    """0-based rank of the right match of every query; ties count against it (a wrong candidate
    scoring the same as the right one ranks above it), so a constant scorer never beats chance."""

    image_to_text: np.ndarray  # (images,): the best-ranked of the image's own captions among all captions
    text_to_image: np.ndarray  # (captions,): the caption's image among all images


def retrieval_ranks(scores: np.ndarray, caption_image: np.ndarray) -> RetrievalRanks:
    """Ranks from `scores` (images × captions; NaN: unscored, ranked last) and each caption's image."""
    scores = np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf)
    right = caption_image[None, :] == np.arange(len(scores))[:, None]
    text_truth = scores[caption_image, np.arange(scores.shape[1])]
    text_ranks = ((scores >= text_truth[None, :]) & ~right).sum(0)
    image_truth = np.where(right, scores, -np.inf).max(1)
    image_ranks = ((scores >= image_truth[:, None]) & ~right).sum(1)
    return RetrievalRanks(image_ranks, text_ranks)


def recalls(ranks: RetrievalRanks) -> dict[str, float]:
    """Recall@K (share of queries whose right match ranks in the top K) of both directions."""
    return {f"{name}_r{k}": round(float((direction < k).mean()), 4)
            for name, direction in (("i2t", ranks.image_to_text), ("t2i", ranks.text_to_image)) for k in RECALL_AT}


def chance_recalls(caption_image: np.ndarray, num_images: int) -> dict[str, float]:
    """Recall@K of a uniformly random ranking: K/images for a caption's one image; for an image with
    g of the C captions, the chance that some of its g lands in a random top K."""
    captions = len(caption_image)
    own = np.bincount(caption_image, minlength=num_images)
    result = {}
    for k in RECALL_AT:
        top = min(k, captions)
        missed = [math.comb(captions - g, top) / math.comb(captions, top) for g in own]
        result[f"i2t_r{k}"] = round(1 - float(np.mean(missed)), 4)
    result.update({f"t2i_r{k}": round(min(k, num_images) / num_images, 4) for k in RECALL_AT})
    return result


class RetrievalRecall(Evaluator):
    """Image–text retrieval: every (image, caption) pair scored by the matching head, then
    Recall@1/5/10 both ways. `value` is text→image R@1 (each caption's query: 1 when its image ranks
    first), the item scores being those per-caption hits, so their mean is `value`; all six recalls,
    their mean, their chance levels and the scoring rate (pairs/s, data reading included) come along.
    Predictions: each query's right match, its rank and the top 10."""

    metric = "t2i_recall@1"
    merged = {"scores": _filled, "pairs": operator.add, "seconds": max}

    def __init__(self, data: TaskData, dataset: RetrievalCandidates) -> None:
        self.dataset = dataset
        self.scores = np.full((len(dataset.images), len(dataset.captions)), np.nan, np.float32)
        self.pairs, self.started, self.seconds = 0, time.perf_counter(), 0.0

    def add(self, samples, inputs, output) -> None:
        images, captions = zip(*(sample.item_id for sample in samples))
        self.scores[list(images), list(captions)] = output.logits.float().cpu().numpy()
        self.pairs += len(samples)
        self.seconds = time.perf_counter() - self.started

    @cached_property
    def ranks(self) -> RetrievalRanks:
        return retrieval_ranks(self.scores, self.dataset.caption_image)

    def result(self) -> dict[str, Any]:
        if not self.pairs:
            return _unscored(self.metric, 0)
        found = recalls(self.ranks)
        chance = chance_recalls(self.dataset.caption_image, len(self.dataset.images))
        return {"metric": self.metric, "value": found["t2i_r1"], "chance": chance["t2i_r1"],
                "samples": len(self.dataset.captions), "images": len(self.dataset.images), "recalls": found,
                "mean_recall": round(float(np.mean(list(found.values()))), 4), "chance_recalls": chance,
                "pairs": self.pairs, "pairs_per_s": round(self.pairs / max(self.seconds, 1e-9), 1)}

    def item_scores(self) -> dict[str, float]:
        ranks = self.ranks.text_to_image
        return {self.dataset.caption_id(c): float(ranks[c] == 0) for c in range(len(ranks))}

    def write(self, path: Path) -> None:
        images = [image.image_id for image in self.dataset.images]
        scores = np.nan_to_num(self.scores, nan=-np.inf)
        text_to_image = [{"caption": self.dataset.caption_id(c), "image": images[self.dataset.caption_image[c]],
                          "rank": int(self.ranks.text_to_image[c]),
                          "top10": [images[i] for i in np.argsort(-scores[:, c], kind="stable")[:10]]}
                         for c in range(scores.shape[1])]
        image_to_text = [{"image": images[i], "rank": int(self.ranks.image_to_text[i]),
                          "top10": [self.dataset.caption_id(c) for c in np.argsort(-scores[i], kind="stable")[:10]]}
                         for i in range(len(images))]
        write_atomically(path, json.dumps({"text_to_image": text_to_image, "image_to_text": image_to_text}))


def _question_id(question, index: int) -> int:
    return index if question.question_id is None else question.question_id


def _scores(metric: str, correct: float, chance: float, count: int) -> dict[str, Any]:
    return {"metric": metric, "value": round(correct / max(count, 1), 4), "chance": round(chance / max(count, 1), 4),
            "samples": count}


def _unscored(metric: str, count: int) -> dict[str, Any]:
    """A split without labels (a test split): predictions only."""
    return {"metric": metric, "value": None, "chance": None, "samples": count}


# ---- the tasks ---------------------------------------------------------------------------------


def _pretraining(data: TaskData, stage, annotations: AnnotationFile, seed: int, training: bool):
    return CaptionPretraining(annotations, data.regions, data.tokenizer, data.max_length,
                              roi_masking=stage.roi_masking, relationship=stage.relationship, seed=seed)


def _vqa(data: TaskData, stage, annotations: AnnotationFile, seed: int, training: bool):
    return QuestionAnswering(annotations, data.regions, data.tokenizer, data.max_length, data.answers, seed=seed)


def _choice(data: TaskData, stage, annotations: AnnotationFile, seed: int, training: bool):
    return MultipleChoice(annotations, data.regions, data.tokenizer, data.max_length, data.answers_by_type,
                          num_choices=stage.num_choices, seed=seed)


def _commonsense(step: str):
    def dataset(data: TaskData, stage, annotations: AnnotationFile, seed: int, training: bool):
        return VisualCommonsense(annotations, data.regions, data.tokenizer, data.max_length, step,
                                 conditioned_on_every_answer=not training, seed=seed)
    return dataset


def _retrieval(data: TaskData, stage, annotations: AnnotationFile, seed: int, training: bool):
    if training:
        return RetrievalPairs(annotations, data.regions, data.tokenizer, data.max_length, seed=seed)
    return RetrievalCandidates(annotations, data.regions, data.tokenizer, data.max_length, seed=seed)


def _refexp(data: TaskData, stage, annotations: AnnotationFile, seed: int, training: bool):
    return ReferringExpressions(annotations, data.regions, data.tokenizer, data.max_length, seed=seed)


TASKS: dict[str, Task] = {task.name: task for task in (
    Task("pretrain", VLBertForPreTraining, _pretraining, MaskedWordAccuracy,
         "masked language modelling with visual clues and masked RoI classification on captions"),
    Task("vqa", VLBertForQuestionAnswering, _vqa, AnswerAccuracy, "VQA: answer scores at a [MASK]", ".json"),
    Task("choice", VLBertForMultipleChoice, _choice, ChoiceAccuracy,
         "the demo world's multiple-choice questions (distractors drawn from other answers)", ".json"),
    Task("vcr_q2a", VLBertForMultipleChoice, _commonsense("q2a"), CommonsenseAccuracy,
         "VCR Q→A: four answers to a question", ".csv"),
    Task("vcr_qa2r", VLBertForMultipleChoice, _commonsense("qa2r"), CommonsenseAccuracy,
         "VCR QA→R: four rationales given the question and answer", ".csv"),
    Task("refexp", VLBertForReferringExpressions, _refexp, GroundingAccuracy,
         "referring expressions (RefCOCO, RefCOCO+, RefCOCOg): the referred RoI", ".json"),
    Task("retrieval", VLBertForImageTextMatching, _retrieval, RetrievalRecall,
         "image–text retrieval: a matching score per pair with sampled and hard negatives; Recall@1/5/10", ".json"),
)}
