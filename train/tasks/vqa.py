"""VQA: answer scores at a [MASK] after the question, trained on the official soft scores and
scored by the official VQA evaluation; the answers scored are `options.answers` (an answers.txt of
`vlbert data prepare vqa2`), or every training answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from train.data.annotations import AnnotationFile, AnswerVocabulary
from train.data.datasets import AnnotatedDataset, Sample, published_id
from train.data.regions import RegionBank
from train.evaluation.item_scores import ItemGroups
from train.evaluation.vqa2 import VqaTruth, question_accuracy, score_vqa, write_vqa_predictions
from train.tasks.base import Evaluator, Task, TaskData, union, unscored
from vlbert.modeling import VLBertForQuestionAnswering
from vlbert.tokenization import build_vqa_sequence
from vlbert.utils.typed_config import EXISTING_PATH


@dataclass
class VqaOptions:
    SETTINGS: ClassVar[str] = "VQA options"

    # The answer vocabulary: an answers.txt of `vlbert data prepare vqa2` (one answer a line, most
    # frequent first); default: the run's previous VQA stage's (Task.carried_options), else every training answer.
    answers: str | None = field(default=None, metadata=EXISTING_PATH)


def answer_vocabulary(data: TaskData, options: VqaOptions) -> AnswerVocabulary:
    """The answers the head scores, read once for the run."""
    if options.answers is None:
        return data.shared("training answers", lambda: AnswerVocabulary.from_annotations(data.train))
    return data.shared(("answers", options.answers), lambda: AnswerVocabulary.from_file(options.answers))


class QuestionAnswering(AnnotatedDataset):
    """`[CLS] question [SEP] [MASK] [SEP]` with the official VQA soft scores over the answer vocabulary."""

    KIND = "vqa"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 answers: AnswerVocabulary, seed: int = 0) -> None:
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.answers = answers

    def sample(self, index: int) -> Sample:
        annotation, question = self.item(index)
        regions = self.regions[annotation.image_id]
        sequence = build_vqa_sequence(self.tokenizer, self.word_pieces(question.question).ids,
                                      len(regions), self.max_length)
        return Sample(sequence, regions.truncated(sequence.num_regions), annotation.file,
                      targets={"labels": self.answers.scores(question.answers)},
                      item_id=published_id(question.question_id, index))


class AnswerAccuracy(Evaluator):
    """VQA: the top answer scored by the official VQA evaluation, against always giving the most
    frequent training answer; predictions as the VQA submission JSON."""

    metric = "vqa_accuracy"
    merged = {"predicted": union}

    def __init__(self, data: TaskData, dataset: QuestionAnswering) -> None:
        self.answers = dataset.answers
        self.truth: dict[int, VqaTruth] = {}
        for index in range(len(dataset)):
            _, question = dataset.item(index)
            if question.answers:
                self.truth[published_id(question.question_id, index)] = VqaTruth(question.answers, question.answer_type or "",
                                                                     question.question_type or "")
        self.predicted: dict[int, str] = {}

    def add(self, samples, inputs, output) -> None:
        for sample, top in zip(samples, output.logits.argmax(1).tolist()):
            self.predicted[sample.item_id] = self.answers.answers[top]

    def result(self) -> dict[str, Any]:
        scored = {qid: answer for qid, answer in self.predicted.items() if qid in self.truth}
        if not scored:
            return unscored(self.metric, len(self.predicted))
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

    def item_groups(self) -> ItemGroups | None:
        """Each scored question's answer type, as the official evaluation breaks its accuracy down
        (a question without one is in no group); None where no scored question has one."""
        types = {str(qid): str(self.truth[qid].answer_type) for qid in self.predicted
                 if qid in self.truth and self.truth[qid].answer_type}
        return ItemGroups("answer type", types) if types else None


def _dataset(data: TaskData, options: VqaOptions, annotations: AnnotationFile, seed: int, training: bool):
    return QuestionAnswering(annotations, data.regions, data.tokenizer, data.max_length,
                             answer_vocabulary(data, options), seed=seed)


def _head(answers: AnswerVocabulary) -> dict[str, Any]:
    """The answer head's size, and its outputs' names (its model folders' id2label)."""
    return {"num_answers": len(answers), "label_names": list(answers.answers)}


TASK = Task("vqa", VLBertForQuestionAnswering, _dataset, AnswerAccuracy, "VQA: answer scores at a [MASK]", ".json",
            options=VqaOptions, model_config=lambda data, options: _head(answer_vocabulary(data, options)),
            read_inputs=answer_vocabulary, carried_options=("answers",))
