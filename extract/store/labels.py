"""A record's labels in the store's words: each box's top class and attribute with their scores, named
from meta.json's vocabulary (BUTD's "red 0.71 square 0.93"), by index where the store has no names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# A name longer than this is cut with "…": a class or attribute is named in a few words, and meta.json
# is anyone's (Pillow refuses to draw a million characters; no picture shows more than a few dozen).
NAME_CHARACTERS = 40


@dataclass(frozen=True)
class Naming:
    """What a store's labels are made of: its class and attribute names (empty: indices)."""

    classes: list[str]
    attributes: list[str]
    has_objects: bool
    has_attributes: bool

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> Naming:
        vocabulary = meta.get("vocabulary") or {}
        return cls(list(vocabulary.get("classes") or []), list(vocabulary.get("attributes") or []),
                   bool(meta.get("objects")), bool(meta.get("attributes")))

    def note(self) -> str | None:
        """What the labels lack, for the picture and the console; None when they have everything."""
        if not self.has_objects:
            return "the store holds no class predictions: boxes are numbered"
        missing = [what for what, names, held in (("class", self.classes, True),
                                                  ("attribute", self.attributes, self.has_attributes))
                   if held and not names]
        return f"the store has no {' or '.join(missing)} names: indices shown" if missing else None

    def label(self, record: Mapping[str, Any], row: int) -> str:
        """The box's top attribute and class with their scores: "red 0.71 square 0.93"."""
        if not self.has_objects:
            return f"box {row}"
        text = f"{self.class_name(record, row)} {record['objects_conf'][row]:.2f}"
        if self.has_attributes:
            attribute = _name(self.attributes, int(record["attrs_id"][row]), "attr")
            text = f"{attribute} {record['attrs_conf'][row]:.2f} {text}"
        return text


    def class_name(self, record: Mapping[str, Any], row: int) -> str:
        """The box's top class ("square", "class 3"; "box 7" without class predictions)."""
        return _name(self.classes, int(record["objects_id"][row]), "class") if self.has_objects else f"box {row}"


def _name(names: list[str], index: int, what: str) -> str:
    if not 0 <= index < len(names):
        return f"{what} {index}"
    name = str(names[index])
    return name if len(name) <= NAME_CHARACTERS else name[:NAME_CHARACTERS - 1] + "…"
