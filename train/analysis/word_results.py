"""The masked-word analysis's result (train/analysis/masked_words.py) as records: the figures over some
masked words, a group of words, and the whole, each written as words.json holds it and read back from
it (the pipeline's report reads the file)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WordFigures:
    """Over some masked words: how many, the accuracy beside the own image and beside another (none
    without a masked word), and, from two masked words on, the paired difference own − another."""

    masked_words: int
    own_image: float | None = None
    another_image: float | None = None
    difference: float | None = None
    interval: list[float] | None = None  # 95%
    p_value: float | None = None
    verdict: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As words.json holds them: the figures there are."""
        return {spec.name: getattr(self, spec.name) for spec in dataclasses.fields(self)
                if getattr(self, spec.name) is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WordFigures:
        return cls(**{spec.name: data.get(spec.name) for spec in dataclasses.fields(cls)})


@dataclass(frozen=True)
class WordGroup:
    """A group of words (e.g. the colour words) and the figures over their masked occurrences."""

    words: list[str]
    figures: WordFigures

    def to_json(self) -> dict[str, Any]:
        return {"words": self.words, **self.figures.to_json()}


@dataclass(frozen=True)
class WordsResult:
    """The masked-word analysis: its inputs, the figures over every masked word, per group of words and
    for each of the most frequent words (in order); words.json holds `to_json()`."""

    model: str
    annotations: str
    captions: int
    conditions: list[str]
    figures: WordFigures
    groups: dict[str, WordGroup]
    by_word: dict[str, WordFigures]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "annotations": self.annotations, "captions": self.captions,
                "conditions": self.conditions, **self.figures.to_json(),
                "groups": {name: group.to_json() for name, group in self.groups.items()},
                "by_word": [{"word": word, **figures.to_json()} for word, figures in self.by_word.items()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WordsResult:
        """The result words.json holds (the pipeline's report reads it)."""
        return cls(data["model"], data["annotations"], data["captions"], data["conditions"],
                   WordFigures.from_json(data),
                   {name: WordGroup(group["words"], WordFigures.from_json(group))
                    for name, group in data["groups"].items()},
                   {row["word"]: WordFigures.from_json(row) for row in data["by_word"]})
