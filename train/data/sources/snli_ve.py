"""SNLI-VE (visual entailment, Xie et al. 2019) as published with necla-ml/SNLI-VE: SNLI's hypotheses
with the Flickr30K image that their premise caption describes as the premise.

Layout read:
    --root    snli_ve_train.jsonl, snli_ve_dev.jsonl, snli_ve_test.jsonl, one pair a line:
              {"Flickr30K_ID": "2248275918", "pairID": "2248275918.jpg#1r1e", "sentence2": the
               hypothesis, "gold_label": "entailment" | "neutral" | "contradiction", "sentence1": the
               premise caption, "captionID", ...}   (sentence1 is not read: the image is the premise)
    --images  the folder holding flickr30k_images/<Flickr30K_ID>.jpg; default --root, where the
              SNLI-VE repository's data/ folder puts them. (The Flickr30K archive unpacks as
              flickr30k-images/: link or rename it.)

Written: one record per image, in order of its first pair ({"file", "image_id": Flickr30K_ID,
"snli_ve": [{"pair_id", "hypothesis", "label"}]}, pairs in file order). Items are pairs; all three
splits are labelled. A pair whose image is missing is skipped and counted (skipped.jsonl names its
Flickr30K_ID), as is one labelled "-" (SNLI's mark for annotators who did not agree, which the
published files leave out). A line that is not a pair, and a pairID that appears twice in a file
(`vlbert evaluate snli-ve` needs each once), fail the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from train.data.annotations import ENTAILMENT_LABELS
from train.data.files import DataError, read_lines_once_each, shown, string_fields
from train.data.prepare import Preparation, Source

SPLITS = ("train", "dev", "test")
PAIRS_FILE = "snli_ve_{split}.jsonl"
IMAGES_FOLDER = "flickr30k_images"
NO_CONSENSUS = "-"  # SNLI's gold_label where no label had a majority
FIELDS = ("Flickr30K_ID", "pairID", "sentence2", "gold_label")


@dataclass(frozen=True, slots=True)
class EntailmentLine:
    """The fields of a published line that the task reads."""

    image_id: str  # Flickr30K_ID
    pair_id: str
    hypothesis: str
    label: str  # one of ENTAILMENT_LABELS, or NO_CONSENSUS


def parse_line(value: Any, path: Path, line: int) -> EntailmentLine:
    """The pair on `line` of `path`; DataError naming the line when it is not one."""
    value = string_fields(value, FIELDS, path, line)
    label = value["gold_label"]
    if label not in (*ENTAILMENT_LABELS, NO_CONSENSUS):
        raise DataError(f"{path}:{line}: 'gold_label' is {shown(label)}, expected one of "
                        f"{', '.join(ENTAILMENT_LABELS)}")
    return EntailmentLine(value["Flickr30K_ID"], value["pairID"], value["sentence2"], label)


def read_pairs(path: Path) -> Iterator[EntailmentLine]:
    """Every pair of a published file, in its order, streamed; DataError for a bad line or a pairID
    seen before."""
    return read_lines_once_each(path, parse_line, lambda pair: pair.pair_id, "pairID",
                                "; `vlbert evaluate snli-ve` needs each once")


def image_file(image_id: str) -> str:
    """A pair's image relative to the images root."""
    return f"{IMAGES_FOLDER}/{image_id}.jpg"


def prepare(preparation: Preparation) -> None:
    root = preparation.root
    for split in preparation.present({split: root / PAIRS_FILE.format(split=split) for split in SPLITS}):
        with preparation.split(split) as writer:
            images: dict[str, list[dict[str, str]]] = {}  # Flickr30K_ID → its pairs, in order of first appearance
            for pair in preparation.progress(read_pairs(root / PAIRS_FILE.format(split=split)), split):
                if pair.label == NO_CONSENSUS:
                    writer.skip(pair.pair_id, "gold_label '-': the annotators did not agree on a label")
                    continue
                images.setdefault(pair.image_id, []).append(
                    {"pair_id": pair.pair_id, "hypothesis": pair.hypothesis, "label": pair.label})
            writer.extra["images"] = 0
            for image_id, pairs in images.items():
                file = writer.find_image(image_id, image_file(image_id), len(pairs))
                if file is not None:
                    writer.add({"file": file, "image_id": image_id, "snli_ve": pairs}, len(pairs))
                    writer.extra["images"] += 1


SOURCE = Source("snli-ve", SPLITS, prepare, about="SNLI-VE: snli_ve_{train,dev,test}.jsonl under --root, images "
                                                  "flickr30k_images/<Flickr30K_ID>.jpg",
                image_names=f"{IMAGES_FOLDER}/<Flickr30K_ID>")
