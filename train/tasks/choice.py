"""The demo world's multiple choice: a question's answer among distractors drawn from other answers."""

from __future__ import annotations

import json
import operator
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from train.data.annotations import AnnotationFile, answers_by_type
from train.data.datasets import AnnotatedDataset, Sample, published_id
from train.data.regions import RegionBank
from train.tasks.base import Evaluator, Task, TaskData, scored, union, unscored
from vlbert.modeling import VLBertForMultipleChoice
from vlbert.tokenization import Segment, build_choice_sequences
from vlbert.utils.atomic import write_atomically


@dataclass
class ChoiceOptions:
    SETTINGS: ClassVar[str] = "multiple-choice options"

    num_choices: int = 4  # candidates per question


class MultipleChoice(AnnotatedDataset):
    """The demo world's Q→A: `[CLS] question [SEP] candidate [SEP]` for each candidate, one right.

    Candidates are the annotated answer and `num_choices - 1` other training answers of the same
    answer type (any type where too few), drawn once per item, so evaluation is stable.
    """

    KIND = "vqa"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 answers_by_type: dict[str | None, list[str]], num_choices: int = 4, seed: int = 0) -> None:
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.answers_by_type, self.num_choices = answers_by_type, num_choices

    def candidates(self, index: int) -> tuple[list[str], int]:
        _, question = self.item(index)
        answer, kind = question.answers[0], question.answer_type
        rng = random.Random(f"{self.seed}/choices/{index}")
        same_type = [a for a in self.answers_by_type.get(kind, []) if a != answer]
        others = [a for a in sorted({a for group in self.answers_by_type.values() for a in group})
                  if a != answer and a not in same_type]
        wanted = self.num_choices - 1
        distractors = rng.sample(same_type, min(wanted, len(same_type)))
        distractors += rng.sample(others, min(wanted - len(distractors), len(others)))
        candidates = distractors + [answer]
        rng.shuffle(candidates)
        return candidates, candidates.index(answer)

    def sample(self, index: int) -> Sample:
        annotation, question = self.item(index)
        candidates, label = self.candidates(index)
        regions = self.regions[annotation.image_id]
        pieces = [self.word_pieces(text).ids for text in candidates]
        sequences = build_choice_sequences(self.tokenizer, Segment(self.word_pieces(question.question).ids),
                                           [Segment(ids) for ids in pieces], len(regions), self.max_length)
        return Sample(sequences[0], regions.truncated(sequences[0].num_regions), annotation.file,
                      targets={"labels": label}, choices=sequences, item_id=published_id(question.question_id, index))


class ChoiceAccuracy(Evaluator):
    """Multiple choice: the top candidate right, against always picking the most frequent right
    position. The demo world's questions write [{"question_id", "choice"}]; VCR steps write the
    leaderboard CSV's columns of their step."""

    metric = "choice_accuracy"
    merged = {"positions": operator.add, "scores": union, "right": union}

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
            return unscored(self.metric, len(self.scores))
        return scored(self.metric, sum(self.right.values()), self.positions.most_common(1)[0][1], len(self.right))

    def item_scores(self) -> dict[str, float]:
        return dict(self.right)

    def write(self, path: Path) -> None:
        rows = [{"question_id": item, "choice": max(range(len(s)), key=s.__getitem__)} for item, s in self.scores.items()]
        write_atomically(path, json.dumps(sorted(rows, key=lambda row: row["question_id"])))


def _dataset(data: TaskData, options: ChoiceOptions, annotations: AnnotationFile, seed: int, training: bool):
    distractors = data.shared("answers by type", lambda: answers_by_type(data.train))
    return MultipleChoice(annotations, data.regions, data.tokenizer, data.max_length, distractors,
                          num_choices=options.num_choices, seed=seed)


TASK = Task("choice", VLBertForMultipleChoice, _dataset, ChoiceAccuracy,
            "the demo world's multiple-choice questions (distractors drawn from other answers)", ".json",
            options=ChoiceOptions)
