"""Task annotations: one JSON object per image (the demo world's format, documented in the README).

`file` is the image's path relative to the images root the FeatureStore was extracted from, so its
path without extension is the store key. `captions`, `vqa` ({question, answer} or {question,
answers}, optionally with an `answer_type`) and `refs` ({text, box}) are each optional.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class ImageAnnotation:
    image_id: str  # the FeatureStore key
    file: str
    captions: list[str] = field(default_factory=list)
    questions: list[tuple[str, list[str], str | None]] = field(default_factory=list)  # (question, answers, type)
    refs: list[tuple[str, list[float]]] = field(default_factory=list)  # (expression, xyxy box)


def read_annotations(path: str | Path) -> list[ImageAnnotation]:
    path = Path(path)
    annotations = []
    with path.open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                annotations.append(ImageAnnotation(
                    image_id=Path(record["file"]).with_suffix("").as_posix(),
                    file=record["file"],
                    captions=list(record.get("captions", [])),
                    questions=[(q["question"], list(q["answers"]) if "answers" in q else [q["answer"]],
                                q.get("answer_type")) for q in record.get("vqa", [])],
                    refs=[(r["text"], [float(v) for v in r["box"]]) for r in record.get("refs", [])],
                ))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not an annotation record ({type(exc).__name__}: {exc})") from None
    return annotations


class AnswerVocabulary:
    """Answers seen in training, most frequent first; VQA soft score of an answer = min(1, votes / 3)."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.index = {a: i for i, a in enumerate(self.answers)}

    @classmethod
    def from_annotations(cls, annotations: list[ImageAnnotation]) -> "AnswerVocabulary":
        counts = Counter(a for ann in annotations for _, answers, _ in ann.questions for a in answers)
        return cls([a for a, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))])

    def __len__(self) -> int:
        return len(self.answers)

    def scores(self, answers: list[str]) -> np.ndarray:
        scores = np.zeros(len(self.answers), np.float32)
        for answer, votes in Counter(answers).items():
            if answer in self.index:
                scores[self.index[answer]] = min(1.0, votes / 3.0) if len(answers) > 1 else 1.0
        return scores


def annotation_texts(annotations: list[ImageAnnotation]) -> list[str]:
    """Every text of the annotations: captions, questions, answers and referring expressions."""
    return [text for a in annotations for text in (
        a.captions + [q for q, _, _ in a.questions] + [x for _, answers, _ in a.questions for x in answers]
        + [t for t, _ in a.refs])]


def answers_by_type(annotations: list[ImageAnnotation]) -> dict[str | None, list[str]]:
    """The distinct answers of each answer type, in a stable order (multiple-choice distractors)."""
    groups: dict[str | None, set[str]] = {}
    for a in annotations:
        for _, answers, kind in a.questions:
            groups.setdefault(kind, set()).update(answers)
    return {kind: sorted(answers) for kind, answers in groups.items()}
