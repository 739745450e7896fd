"""Each evaluated item's score: the file every evaluation writes (`stages/<i>-<name>/item_scores/<split>.json`)
and the report resamples for its intervals and paired comparisons.

    {"metric": "vqa_accuracy", "items": {item id: score},
     "groups": {"name": "answer type", "items": {item id: group}}}

`groups` is there only where the task sorts its items into groups (VQA: each question's answer
type; an item without one is in no group), so files without it (older runs, other tasks) read as
before: no groups.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from train.data.files import DataError, read_json
from train.evaluation.statistics import average_over_seeds
from vlbert.utils.atomic import made_folder, write_atomically


@dataclass(frozen=True)
class ItemGroups:
    """Items sorted into groups: what a group is (`name`, e.g. "answer type") and each item's group."""

    name: str
    items: dict[str, str]


@dataclass(frozen=True)
class ItemScores:
    metric: str
    items: dict[str, float]
    groups: ItemGroups | None = None

    def write(self, path: Path) -> None:
        document: dict[str, Any] = {"metric": self.metric, "items": self.items}
        if self.groups is not None:
            document["groups"] = {"name": self.groups.name, "items": self.groups.items}
        made_folder(path.parent)
        write_atomically(path, json.dumps(document))

    @classmethod
    def read(cls, path: Path) -> ItemScores:
        """The file at `path`; DataError naming it where it is not item scores as written here."""
        document = read_json(path)
        if not isinstance(document, dict) or not isinstance(document.get("items"), dict) \
                or not all(isinstance(score, (int, float)) for score in document["items"].values()):
            raise DataError(f"{path}: not item scores (expected {{\"metric\", \"items\": {{id: score}}}})")
        groups = document.get("groups")
        if groups is None:
            return cls(document.get("metric", ""), document["items"])
        if not isinstance(groups, dict) or not isinstance(groups.get("name"), str) \
                or not isinstance(groups.get("items"), dict) \
                or not all(isinstance(group, str) for group in groups["items"].values()):
            raise DataError(f"{path}: \"groups\" is not {{\"name\": text, \"items\": {{id: group}}}}")
        return cls(document.get("metric", ""), document["items"], ItemGroups(groups["name"], groups["items"]))


def averaged_over_seeds(seeds: Sequence[ItemScores]) -> ItemScores:
    """Each item's score averaged over the seeds' item scores, on the items every seed evaluated; its
    group where every seed carries the same grouping and puts the item in the same group (no groups
    where one seed carries none)."""
    items = average_over_seeds([seed.items for seed in seeds])
    groupings = [seed.groups for seed in seeds]
    if any(grouping is None for grouping in groupings) or len({grouping.name for grouping in groupings}) > 1:
        return ItemScores(seeds[0].metric, items)
    first, *others = groupings
    groups = {item: group for item, group in first.items.items()
              if item in items and all(other.items.get(item) == group for other in others)}
    return ItemScores(seeds[0].metric, items, ItemGroups(first.name, groups))
