"""What every task's samples are made of (train.tasks: each task's own dataset), and the datasets'
shared machinery: seeded sampling, annotation items, damaged records.

Datasets hold an AnnotationFile's item index (NumPy arrays) and parse an annotation line when a
sample needs it, so forked DataLoader workers share the index instead of copying Python objects.

Every random choice of a sample (masked words, masked RoIs, the cached pixel-masked variant, a
mismatched caption) is drawn from a generator seeded by (seed, epoch, index), so a sample is the
same in every worker, process and resumed run.

A sample whose FeatureStore record is damaged comes back as a DamagedSample marker instead of an
exception: an error raised in a DataLoader worker would reach the trainer as a multi-line
re-raise, and the trainer's policy decides whether the run fails or skips the sample.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from extract.store.schema import DamagedRecordError
from train.data.annotations import ITEM_KINDS, AnnotationFile, ImageAnnotation
from train.data.files import DataError
from train.data.regions import RegionBank, Regions
from vlbert.tokenization import TextSequence, WordPieceMemo, build_caption_sequence


@dataclass
class Sample:
    sequence: TextSequence
    regions: Regions | None = None  # None: a text-only sample
    image_file: str | None = None  # relative to the images root: end-to-end stages load the pixels
    masked_regions: np.ndarray | None = None  # (N,) bool: [IMG] replaced by the masked-RoI embedding
    targets: dict[str, np.ndarray | int] = field(default_factory=dict)  # one value per sample
    region_targets: dict[str, np.ndarray] = field(default_factory=dict)  # (N, ...) per RoI
    choices: list[TextSequence] | None = None  # multiple choice: one sequence per candidate
    item_id: Any = None  # the annotation item's id (question_id, sent_id, ...) for prediction files
    image: np.ndarray | None = None  # end-to-end stages: the decoded pixels (train.end2end.WithImages)


@dataclass
class SampleGroup:
    """Samples scored together by one loss (a caption's positive pair and its negatives): a batch of
    B groups of G samples holds B × G model inputs and (B, G) targets."""

    samples: list[Sample]


@dataclass
class DamagedSample:
    """In place of a sample whose FeatureStore record is damaged."""

    image_id: str
    message: str


class SeededDataset(Dataset):
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.epoch = 0

    def __getitem__(self, index: int) -> Sample | SampleGroup | DamagedSample:
        try:
            return self.sample(index)
        except DamagedRecordError as exc:
            return DamagedSample(exc.image_id, str(exc))

    def sample(self, index: int) -> Sample | SampleGroup:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def rng(self, index: int) -> random.Random:
        return random.Random(f"{self.seed}/{self.epoch}/{index}")


class AnnotatedDataset(SeededDataset):
    """Samples from the items of one kind (`KIND`) of an annotation file, whose images the store holds.
    Its texts are tokenized by `word_pieces`, once each per process."""

    KIND = ""
    MAX_DRAWS = 100  # redraws of a negative candidate that turns out to be a positive

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 seed: int = 0) -> None:
        super().__init__(seed)
        self.annotations, self.regions, self.tokenizer, self.max_length = annotations, regions, tokenizer, max_length
        self.items = annotations.items(self.KIND)
        self.word_pieces = WordPieceMemo(tokenizer)

    def __len__(self) -> int:
        return len(self.items)

    def item(self, index: int):
        """(the image's annotation, the item) of sample `index`."""
        return self.annotations.item(self.items[index], self.KIND)

    def sample_lengths(self) -> np.ndarray:
        """Each sample's length as length-aware batches order them: its image's elements (the whole
        image and its RoIs, from the store's record headers) and the words of its item's first text
        (a caption, a question, an expression). An estimate (word pieces and truncation come when the
        sample is made) read in one pass; a damaged record counts no regions (its sample meets the
        damaged-record policy when made)."""
        regions: dict[str, int] = {}
        texts = ITEM_KINDS[self.KIND].texts
        lengths = np.empty(len(self.items), np.int64)
        for index in range(len(self.items)):
            annotation, item = self.item(index)
            if annotation.image_id not in regions:
                try:
                    regions[annotation.image_id] = self.regions.count(annotation.image_id)
                except DamagedRecordError:
                    regions[annotation.image_id] = 0
            lengths[index] = regions[annotation.image_id] + len(next(iter(texts([item])), "").split())
        return lengths

    def other_caption(self, rng: random.Random, image: ImageAnnotation) -> str:
        """A caption of another image that is not word for word one of `image`'s (a duplicate, such as a
        count caption two images share, would be a matching pair labelled as a mismatch)."""
        for _ in range(self.MAX_DRAWS):
            other, caption = self.item(rng.randrange(len(self.items)))
            if other.image_id != image.image_id and caption not in image.captions:
                return caption
        raise DataError(f"{self.annotations.path}: found no caption of another image that differs from "
                        f"{image.image_id}'s captions in {self.MAX_DRAWS} draws")


def published_id(published: int | None, index: int) -> int:
    """The item's published id; the demo world's items go by their position."""
    return index if published is None else published


def pair_sample(tokenizer, max_length: int, regions: Regions, file: str, caption: list[int],
                targets: dict[str, int], item_id: Any) -> Sample:
    """`[CLS] caption [SEP] [IMG]… [END]` for an image–text pair; `caption` as word pieces."""
    sequence = build_caption_sequence(tokenizer, caption, len(regions), max_length)
    return Sample(sequence, regions.truncated(sequence.num_regions), file, targets=targets, item_id=item_id)
