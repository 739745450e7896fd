"""The head scores the grounding analyses share (train/analysis/grounding.py's `GroundingTally`, per
relation in syntax.py) and the entity analysis's result, as records: each written as grounding.json
holds it (keys and their order; the figures there are none of left out) and read back from it (the
pipeline's report reads the file). Items are phrases or arcs (`unit`): the key their count goes under."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Best:
    """The most accurate head, layer and head numbered from 1."""

    layer: int
    head: int
    accuracy: float

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "head": self.head, "accuracy": self.accuracy}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Best | None:
        return None if data is None else cls(data["layer"], data["head"], data["accuracy"])


@dataclass(frozen=True)
class AgainstConfidence:
    """The held-out head's paired comparison with the most confident RoI, its outcome and verdict in words."""

    difference: float
    difference_interval: list[float]
    p_value: float
    outcome: str
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return {"difference": self.difference, "difference_interval": self.difference_interval,
                "p_value": self.p_value, "outcome": self.outcome, "verdict": self.verdict}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgainstConfidence:
        return cls(data["difference"], data["difference_interval"], data["p_value"], data["outcome"],
                   data["verdict"])


@dataclass(frozen=True)
class HeldOutBest:
    """The best head chosen on the even-numbered items, scored on the `count` odd-numbered ones, compared
    there with the random RoI and the most confident RoI (None in a result written before that comparison)."""

    layer: int
    head: int
    unit: str
    count: int
    accuracy: float
    interval: list[float]
    random_baseline: float
    difference: float
    difference_interval: list[float]
    p_value: float
    verdict: str
    confidence_baseline: float
    against_confidence: AgainstConfidence | None

    def to_json(self) -> dict[str, Any]:
        written = {"layer": self.layer, "head": self.head, self.unit: self.count, "accuracy": self.accuracy,
                   "interval": self.interval, "random_baseline": self.random_baseline,
                   "difference": self.difference, "difference_interval": self.difference_interval,
                   "p_value": self.p_value, "verdict": self.verdict, "confidence_baseline": self.confidence_baseline}
        if self.against_confidence is not None:
            written["against_confidence"] = self.against_confidence.to_json()
        return written

    @classmethod
    def from_json(cls, data: dict[str, Any], unit: str) -> HeldOutBest:
        against = data.get("against_confidence")
        return cls(data["layer"], data["head"], unit, data[unit], data["accuracy"], data["interval"],
                   data["random_baseline"], data["difference"], data["difference_interval"], data["p_value"],
                   data["verdict"], data["confidence_baseline"],
                   None if against is None else AgainstConfidence.from_json(against))


def held_out_of(data: dict[str, Any], unit: str = "phrases") -> HeldOutBest | None:
    """The held-out best head of a result's JSON (grounding.json, a syntax.json relation), None where it
    has none (fewer than two items, or no head allowed)."""
    held_out = data.get("held_out_best")
    return HeldOutBest.from_json(held_out, unit) if held_out else None


@dataclass(frozen=True)
class Intervals:
    """95% bootstrap intervals over the items: the best head's (none where no head is allowed) and the
    baselines'."""

    level: float
    best: list[float] | None
    random_baseline: list[float]
    confidence_baseline: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, **({} if self.best is None else {"best": self.best}),
                "random_baseline": self.random_baseline, "confidence_baseline": self.confidence_baseline}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Intervals | None:
        return None if data is None else cls(data["level"], data.get("best"), data["random_baseline"],
                                             data["confidence_baseline"])


@dataclass(frozen=True)
class HeadFigures:
    """What every set of head scores says, an entity analysis's or a relation's: the best head, the mean
    over heads, the baselines and, from two items on, the intervals and the held-out best head."""

    best: Best | None
    mean_accuracy: float
    random_baseline: float
    confidence_baseline: float
    intervals: Intervals | None = None
    held_out_best: HeldOutBest | None = None

    def to_json(self) -> dict[str, Any]:
        written = {"best": None if self.best is None else self.best.to_json(), "mean_accuracy": self.mean_accuracy,
                   "random_baseline": self.random_baseline, "confidence_baseline": self.confidence_baseline}
        if self.intervals is not None:
            written["intervals"] = self.intervals.to_json()
        if self.held_out_best is not None:
            written["held_out_best"] = self.held_out_best.to_json()
        return written

    @classmethod
    def from_json(cls, data: dict[str, Any], unit: str) -> HeadFigures:
        return cls(Best.from_json(data["best"]), data["mean_accuracy"], data["random_baseline"],
                   data["confidence_baseline"], Intervals.from_json(data.get("intervals")), held_out_of(data, unit))


@dataclass(frozen=True)
class HeadScores:
    """Every layer's and head's grounding accuracy over `count` items (`unit`), their attention share to
    the RoIs (rows are layers, from layer 1), and the `figures` over them."""

    unit: str
    count: int
    layers: int
    heads: int
    iou_threshold: float
    accuracy: list[list[float]]
    region_attention: list[list[float]]
    figures: HeadFigures

    def to_json(self) -> dict[str, Any]:
        return {self.unit: self.count, "layers": self.layers, "heads": self.heads,
                "iou_threshold": self.iou_threshold, "accuracy": self.accuracy,
                "region_attention": self.region_attention, **self.figures.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any], unit: str = "phrases") -> HeadScores:
        return cls(unit, data[unit], data["layers"], data["heads"], data["iou_threshold"], data["accuracy"],
                   data["region_attention"], HeadFigures.from_json(data, unit))


@dataclass(frozen=True)
class GroundingResult:
    """The entity analysis: its inputs, the head scores over its phrases, the phrases left out (their box
    no box: item id, phrase, box, problem) and the examples drawn; grounding.json holds `to_json()`."""

    model: str
    annotations: str
    format: str
    scores: HeadScores
    left_out: list[dict[str, str]]
    examples: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "annotations": self.annotations, "format": self.format,
                **self.scores.to_json(), "left_out": self.left_out, "examples": self.examples}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroundingResult:
        """The result grounding.json holds."""
        return cls(data["model"], data["annotations"], data["format"], HeadScores.from_json(data),
                   data["left_out"], data["examples"])
