"""NLVR2 (Natural Language for Visual Reasoning for Real, Suhr et al. 2019) as published with
lil-lab/nlvr: statements about a pair of photographs, each true or false of its pair.

Layout read:
    --root    train.json, dev.json, test1.json, one statement a line:
              {"identifier": "dev-850-0-0" (split-setid-pairid-sentenceid), "sentence": the statement,
               "label": "True" | "False", "left_url", "right_url", "synset", "query", "writer",
               "validation", ...}   (a line without "label" is read as unlabelled)
    --images  the folder holding <split>/<pair>-img0.png and <pair>-img1.png, where <pair> is the
              identifier without its last "-N" (dev-850-0-0 → dev-850-0-img0.png, dev-850-0-img1.png);
              an image is found by name in <split>/ or any folder directly under it (the official
              download puts train's images in train/0 … train/99). Default --root.

Written: two records per image pair, in order of its first statement: the left image's, holding
the pair's statements ({"file", "image_id": <pair>-img0, "nlvr2": [{"identifier", "sentence",
"label": true | false | null, "right": the right image's file}]}), then the right image's, with no
items, so that extraction reads both. Items are statements. A statement whose pair misses an image
is skipped and counted (skipped.jsonl names its identifier). A line that is not a statement, and an
identifier that appears twice in a file, fail the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from train.data.files import DataError, read_lines_once_each, shown, string_fields
from train.data.prepare import Preparation, Source

SPLITS = ("train", "dev", "test1")
STATEMENTS_FILE = "{split}.json"
LABELS = {"True": True, "False": False}
FIELDS = ("identifier", "sentence")


@dataclass(frozen=True, slots=True)
class StatementLine:
    """The fields of a published line that the task reads."""

    identifier: str
    sentence: str
    label: bool | None  # None: the line has no label

    @property
    def pair(self) -> str:
        """The image pair's name: the identifier without its sentence id (dev-850-0-0 → dev-850-0)."""
        return self.identifier.rsplit("-", 1)[0]

    def image(self, side: int) -> str:
        """The stem of the pair's left (0) or right (1) image."""
        return f"{self.pair}-img{side}"


def parse_line(value: Any, path: Path, line: int) -> StatementLine:
    """The statement on `line` of `path`; DataError naming the line when it is not one."""
    value = string_fields(value, FIELDS, path, line)
    identifier = value["identifier"]
    parts = identifier.split("-")
    if len(parts) != 4 or not all(part.isdigit() for part in parts[1:]):
        raise DataError(f"{path}:{line}: 'identifier' is {shown(identifier)}, expected split-setid-pairid-sentenceid "
                        "(e.g. dev-850-0-0)")
    label = value.get("label")
    if label is not None and label not in LABELS:
        raise DataError(f"{path}:{line}: 'label' is {shown(label)}, expected \"True\" or \"False\"")
    return StatementLine(identifier, value["sentence"], None if label is None else LABELS[label])


def read_statements(path: Path) -> Iterator[StatementLine]:
    """Every statement of a published file, in its order, streamed; DataError for a bad line or an
    identifier seen before."""
    return read_lines_once_each(path, parse_line, lambda statement: statement.identifier, "identifier")


def split_images(preparation: Preparation, split: str) -> dict[str, str]:
    """Every image of a split's folder and of the folders directly under it: its stem → its file
    relative to the images root. DataError when two of them share a name: which one a statement
    means would be a guess."""
    try:
        with os.scandir(preparation.images / split) as entries:
            folders = [split] + sorted(f"{split}/{entry.name}" for entry in entries if entry.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return {}
    images: dict[str, str] = {}
    for folder in folders:
        for stem, name in preparation.finder.stems(folder).items():
            if stem in images:
                raise DataError(f"{preparation.images}: {images[stem]} and {folder}/{name}: two images named {stem}; "
                                "keep one")
            images[stem] = f"{folder}/{name}"
    return images


def prepare(preparation: Preparation) -> None:
    root = preparation.root
    for split in preparation.present({split: root / STATEMENTS_FILE.format(split=split) for split in SPLITS}):
        with preparation.split(split) as writer:
            pairs: dict[str, list[StatementLine]] = {}  # image pair → its statements, in order of first appearance
            for statement in preparation.progress(read_statements(root / STATEMENTS_FILE.format(split=split)), split):
                pairs.setdefault(statement.pair, []).append(statement)
            images = split_images(preparation, split)
            writer.extra["image_pairs"] = 0
            for pair, statements in pairs.items():
                left, right = (images.get(statements[0].image(side)) for side in (0, 1))
                if left is None or right is None:
                    missing = f"{split}/[*/]{statements[0].image(0 if left is None else 1)}"
                    writer.skip_missing_image(pair, missing, len(statements))
                    continue
                items = [{"identifier": s.identifier, "sentence": s.sentence, "label": s.label, "right": right}
                         for s in statements]
                writer.add({"file": left, "image_id": statements[0].image(0), "nlvr2": items}, len(items))
                writer.add({"file": right, "image_id": statements[0].image(1)}, 0)
                writer.extra["image_pairs"] += 1


SOURCE = Source("nlvr2", SPLITS, prepare, about="NLVR2: {train,dev,test1}.json under --root, images "
                                                "<split>/[<folder>/]<pair>-img{0,1}",
                image_names="<split>/[<folder>/]<identifier without its last -N>-img{0,1}")
