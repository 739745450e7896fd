"""The syntactic grounding analysis's result (train/analysis/syntax.py) as records: a relation's head scores
with the paper's figures beside them, and the whole, each written as syntax.json holds it (keys and their
order) and read back from it (the pipeline's report reads the file)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from train.analysis.grounding_results import HeadFigures, HeldOutBest, held_out_of


@dataclass(frozen=True)
class PaperFigures:
    """The paper's Table 2 row for a relation (its Stanford name): the most confident RoI's accuracy and
    the best head's (%), and that head (layer, head, from 1)."""

    relation: str
    baseline: float
    best: float
    layer: int
    head: int

    def to_json(self) -> dict[str, Any]:
        return {spec.name: getattr(self, spec.name) for spec in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> PaperFigures | None:
        return None if data is None else cls(**{spec.name: data[spec.name] for spec in dataclasses.fields(cls)})


@dataclass(frozen=True)
class RelationScores:
    """A relation's head scores over its `arcs` (each layer's and head's accuracy, rows from layer 1), its
    Stanford names, whether it is among the most common, and the paper's figures where it has them."""

    relation: str
    stanford: list[str]
    top: bool
    arcs: int
    accuracy: list[list[float]]
    figures: HeadFigures
    paper: PaperFigures | None

    def to_json(self) -> dict[str, Any]:
        return {"relation": self.relation, "stanford": self.stanford, "top": self.top, "arcs": self.arcs,
                "accuracy": self.accuracy, **self.figures.to_json(),
                "paper": None if self.paper is None else self.paper.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RelationScores:
        return cls(data["relation"], data["stanford"], data["top"], data["arcs"], data["accuracy"],
                   HeadFigures.from_json(data, "arcs"), PaperFigures.from_json(data["paper"]))


def held_out_by_relation(data: dict[str, Any]) -> dict[str, HeldOutBest | None]:
    """Each relation's held-out best head in a syntax.json (None where it has none), the most common first."""
    return {row["relation"]: held_out_of(row, "arcs") for row in data.get("relations", [])}


@dataclass(frozen=True)
class SyntaxResult:
    """The syntactic analysis: how its captions were parsed, the arcs' count, every head's attention share
    to the RoIs (`active_heads` those above `min_region_attention`, from 1), each relation's scores (the
    most common first), the captions skipped and the entities left out; then its inputs and the figures
    drawn (name → file). syntax.json holds `to_json()`."""

    parser: str
    labels: str
    captions: int
    arcs: int
    layers: int
    heads: int
    iou_threshold: float
    region_attention: list[list[float]]
    min_region_attention: float | None
    active_heads: list[list[int]] | None
    relations: list[RelationScores]
    skipped: list[dict[str, str]]
    left_out: list[dict[str, str]]
    model: str | None = None
    annotations: str | None = None
    parses: str | None = None
    figures: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        written = {spec.name: getattr(self, spec.name) for spec in dataclasses.fields(self)}
        written["relations"] = [row.to_json() for row in self.relations]
        return written

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SyntaxResult:
        """The result syntax.json holds."""
        values = {spec.name: data[spec.name] for spec in dataclasses.fields(cls)}
        return cls(**{**values, "relations": [RelationScores.from_json(row) for row in data["relations"]]})

    def held_out(self) -> dict[str, HeldOutBest | None]:
        """Each relation's held-out best head (None where it has none), the most common first."""
        return {row.relation: row.figures.held_out_best for row in self.relations}
