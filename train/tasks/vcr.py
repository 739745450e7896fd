"""VCR (Q→A and QA→R) as VL-BERT fine-tunes it, scored as the leaderboard does."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from train.data.annotations import AnnotationFile, Token
from train.data.datasets import AnnotatedDataset, Sample
from train.data.regions import RegionBank
from train.evaluation.vcr import VcrPrediction, write_vcr_csv
from train.tasks.base import Task, TaskData
from train.tasks.choice import ChoiceAccuracy
from vlbert.modeling import VLBertForMultipleChoice
from vlbert.tokenization import Segment, WordPieceMemo, build_choice_sequences


class VisualCommonsense(AnnotatedDataset):
    """VCR, as VL-BERT fine-tunes it: Q→A scores `[CLS] question [SEP] answer [SEP]` for the four
    answers; QA→R scores `[CLS] question answer [SEP] rationale [SEP]` for the four rationales,
    the answer being the right one in training. Words tagged with an object take that object's RoI
    feature (its given box, after the whole-image box).

    `conditioned_on_every_answer` (QA→R evaluation): four samples per annotation, one per answer,
    as the leaderboard's Q→AR needs the rationale chosen given the predicted answer.
    """

    KIND = "vcr"
    STEPS = ("q2a", "qa2r")

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 step: str, conditioned_on_every_answer: bool = False, seed: int = 0) -> None:
        if step not in self.STEPS:
            raise ValueError(f"step={step!r}: expected one of {self.STEPS}")
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.step, self.every_answer = step, conditioned_on_every_answer and step == "qa2r"
        self.answers_per_item = 4 if self.every_answer else 1

    def __len__(self) -> int:
        return len(self.items) * self.answers_per_item

    def sample(self, index: int) -> Sample:
        annotation, item = self.item(index // self.answers_per_item)
        regions = self.regions[annotation.image_id]
        context = _tagged_pieces(self.word_pieces, item.question)
        if self.step == "q2a":
            conditioned, candidates, label = None, item.answer_choices, item.answer_label
        else:
            conditioned = index % 4 if self.every_answer else item.answer_label
            context = _joined(context, _tagged_pieces(self.word_pieces, item.answer_choices[conditioned]))
            candidates, label = item.rationale_choices, item.rationale_label
        sequences = build_choice_sequences(self.tokenizer, context,
                                           [_tagged_pieces(self.word_pieces, c) for c in candidates], len(regions),
                                           self.max_length)
        return Sample(sequences[0], regions.truncated(sequences[0].num_regions), annotation.file,
                      targets={"labels": -100 if label is None else label}, choices=sequences,
                      item_id=(item.annot_id, conditioned))


def _tagged_pieces(word_pieces: WordPieceMemo, tokens: list[Token]) -> Segment:
    """Word pieces of tagged tokens; a tagged word's pieces point at its object's RoI (index + 1:
    the whole-image box comes first), other words at the whole image."""
    pieces = word_pieces(tuple(token if isinstance(token, str) else token[0] for token in tokens))
    boxes = [0 if isinstance(token, str) else token[1] + 1 for token in tokens]
    return Segment(pieces.ids, box_index=[boxes[w] for w in pieces.word_index])


def _joined(first: Segment, second: Segment) -> Segment:
    return Segment(first.ids + second.ids, box_index=first.box_index + second.box_index)


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


def _dataset(step: str):
    def dataset(data: TaskData, options: Any, annotations: AnnotationFile, seed: int, training: bool):
        return VisualCommonsense(annotations, data.regions, data.tokenizer, data.max_length, step,
                                 conditioned_on_every_answer=not training, seed=seed)
    return dataset


TASKS = (Task("vcr_q2a", VLBertForMultipleChoice, _dataset("q2a"), CommonsenseAccuracy,
              "VCR Q→A: four answers to a question", ".csv"),
         Task("vcr_qa2r", VLBertForMultipleChoice, _dataset("qa2r"), CommonsenseAccuracy,
              "VCR QA→R: four rationales given the question and answer", ".csv"))
