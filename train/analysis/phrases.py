"""Phrases with the box each names, read from annotation formats that have them: what the grounding
analysis scores. `PHRASE_READERS` maps a format name to its reader (a path → phrases).

- `refs`: the project's annotation file (`train.data.annotations`); each referring expression is
  one phrase, the whole text, and its `box`.
- `flickr30k-entities`: Flickr30K Entities (Plummer et al. 2015) as published: pass its split file
  (`val.txt`, one image id a line) in the folder that holds `Sentences/` and `Annotations/`. Each
  bracketed entity of a caption (`[/EN#18/people A man]`) with boxes is a phrase of that caption; an
  entity with several boxes is scored against their union (the merged-boxes protocol). Images are
  `flickr30k-images/<id>.jpg`, as the Karpathy-split reader names them, so the store key is
  `flickr30k-images/<id>`.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from train.data.annotations import read_annotations
from train.data.files import DataError, read_text, shown

# The shortest sequence that still scores a phrase: [CLS], one word piece, [SEP], the whole-image
# box (never a candidate), one RoI, [END].
MIN_LENGTH = 6

@dataclass
class Phrase:
    item_id: str
    image_id: str  # the FeatureStore key
    file: str  # relative to the images root
    text: str  # what the model reads
    span: tuple[int, int]  # the phrase's characters in `text`
    box: list[float]  # x1, y1, x2, y2 in pixels

    @property
    def phrase(self) -> str:
        return self.text[self.span[0]:self.span[1]]


def annotation_phrases(path: str | Path) -> list[Phrase]:
    """Every referring expression of an annotation file, whole, as a phrase."""
    phrases = []
    for annotation in read_annotations(path):
        for position, ref in enumerate(annotation.refs):
            item_id = f"{annotation.image_id}/{position}" if ref.sent_id is None else str(ref.sent_id)
            phrases.append(Phrase(item_id, annotation.image_id, annotation.file, ref.text, (0, len(ref.text)), ref.box))
    return phrases


CORNERS = ("xmin", "ymin", "xmax", "ymax")  # a <bndbox>'s children
ENTITY = re.compile(r"\[/EN#(\d+)(?:/[^\s\]]+)* ([^\]]*)\]")


def entity_sentence(line: str) -> tuple[str, list[tuple[int, int, str]]]:
    """A Flickr30K Entities sentence line → (the plain text, [(start, end, entity id)] of its phrases)."""
    text, spans, last = "", [], 0
    for match in ENTITY.finditer(line):
        text += line[last:match.start()]
        spans.append((len(text), len(text) + len(match.group(2)), match.group(1)))
        text += match.group(2)
        last = match.end()
    return text + line[last:], spans


def entity_boxes(path: Path) -> dict[str, list[float]]:
    """Entity id → its box (the union of its boxes) from a Flickr30K Entities Annotations/<id>.xml;
    entities without a box (scene, not visual) are absent."""
    boxes: dict[str, list[list[float]]] = {}
    try:
        objects = list(ElementTree.parse(path).getroot().iter("object"))
    except ElementTree.ParseError as exc:
        raise DataError(f"{path}: not a Flickr30K Entities annotation ({exc})") from None
    for element in objects:
        box = element.find("bndbox")
        if box is None:
            continue
        corners = _corners(box, path)
        for name in element.findall("name"):
            boxes.setdefault((name.text or "").strip(), []).append(corners)
    return {entity: [min(b[0] for b in group), min(b[1] for b in group), max(b[2] for b in group),
                     max(b[3] for b in group)] for entity, group in boxes.items()}


def _corners(box: ElementTree.Element, path: Path) -> list[float]:
    texts = [box.findtext(name) for name in CORNERS]
    try:
        corners = [float(text) for text in texts]
    except (TypeError, ValueError):  # a corner missing, or not a number
        corners = []
    if len(corners) != len(CORNERS) or not all(map(math.isfinite, corners)):
        raise DataError(f"{path}: a <bndbox> needs the numbers {', '.join(CORNERS)}, found {shown(texts)}")
    return corners


IMAGE_ID = re.compile(r"\d+")  # a Flickr30K image's file name without .jpg


def split_image_ids(split_file: Path) -> list[str]:
    """The image ids of a Flickr30K Entities split file, one a line; DataError naming the first line
    that holds something else (an annotation file given with the wrong --format, say)."""
    lines = read_text(split_file).splitlines()
    for number, line in enumerate(lines, 1):
        if line.strip() and not IMAGE_ID.fullmatch(line.strip()):
            raise DataError(f"{split_file}:{number}: {shown(line)} is not a Flickr30K image id; the "
                            "flickr30k-entities format reads a split file (val.txt: one image id a line)")
    return [line.strip() for line in lines if line.strip()]


@dataclass
class Caption:
    """One caption line of a Flickr30K Entities Sentences file, with its bracketed entities."""

    image_id: str  # the Flickr30K image id
    number: int  # the line's index in Sentences/<id>.txt, from 0
    text: str  # without the brackets
    entities: list[tuple[tuple[int, int], list[float] | None]]  # (characters in `text`, box or None: no box)

    @property
    def store_key(self) -> str:
        return f"flickr30k-images/{self.image_id}"

    @property
    def file(self) -> str:
        return f"flickr30k-images/{self.image_id}.jpg"


def flickr30k_entities_captions(split_file: str | Path) -> list[Caption]:
    """Every caption of the split's images (blank lines are none), in the order of the split file and
    of each image's Sentences lines: the order in which parses of the captions are given."""
    split_file = Path(split_file)
    root = split_file.parent
    captions = []
    for image_id in split_image_ids(split_file):
        sentences, annotations = root / "Sentences" / f"{image_id}.txt", root / "Annotations" / f"{image_id}.xml"
        if not (sentences.is_file() and annotations.is_file()):
            raise DataError(f"{split_file}: image {image_id} has no Sentences/{image_id}.txt or "
                            f"Annotations/{image_id}.xml under {root}")
        boxes = entity_boxes(annotations)
        for number, line in enumerate(read_text(sentences).splitlines()):
            if not line.strip():
                continue
            text, spans = entity_sentence(line.strip())
            captions.append(Caption(image_id, number, text,
                                    [((start, end), boxes.get(entity)) for start, end, entity in spans]))
    return captions


def flickr30k_entities_phrases(split_file: str | Path) -> list[Phrase]:
    """Every boxed entity phrase of the split's captions."""
    return [Phrase(f"{caption.image_id}/{caption.number}/{k}", caption.store_key, caption.file, caption.text,
                   span, box)
            for caption in flickr30k_entities_captions(split_file)
            for k, (span, box) in enumerate(caption.entities) if box is not None]


PHRASE_READERS: dict[str, Callable[[str | Path], list[Phrase]]] = {
    "refs": annotation_phrases,
    "flickr30k-entities": flickr30k_entities_phrases,
}
