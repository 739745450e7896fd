"""Image–text retrieval: a matching score per (image, caption) pair, trained as ranking with
sampled and hard negatives, scored by Recall@1/5/10 both ways."""

from __future__ import annotations

import json
import operator
import random
import re
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from train.data.annotations import AnnotationFile, ImageAnnotation
from train.data.datasets import AnnotatedDataset, Sample, SampleGroup, pair_sample
from train.data.files import DataError
from train.data.regions import RegionBank, Regions
from train.evaluation.retrieval import RetrievalRanks, folds, protocol_recalls, retrieval_ranks
from train.tasks.base import Evaluator, Task, TaskData, filled, unscored
from vlbert.modeling import VLBertForImageTextMatching
from vlbert.tokenization import word_pieces
from vlbert.utils.atomic import write_atomically
from vlbert.utils.typed_config import at_least


@dataclass
class RetrievalOptions:
    """How a retrieval stage scores pairs, draws its training negatives, and groups its test images."""

    SETTINGS: ClassVar[str] = "retrieval options"

    # matching: a matching head (new, or the checkpoint's own); relationship: the pre-training
    # sentence–image relationship head (`relationship: true`), its matching probability's log-odds as
    # the score: what zero-shot retrieval (`steps: 0`) ranks by, as Unicoder-VL's first row
    score: Literal["matching", "relationship"] = "matching"
    negatives: int = field(default=3, metadata=at_least(1))  # per direction, in each training group
    # of them, drawn hard: the most word-overlapping of `hard_pool` candidates (0: all uniform, as
    # Unicoder-VL samples them)
    hard_negatives: int = field(default=1, metadata=at_least(0))
    hard_pool: int = field(default=16, metadata=at_least(2))
    # > 0: evaluation also reports the mean over folds of this many consecutive images (COCO 1K: 1000
    # on the 5K Karpathy test split), beside the whole split (COCO 5K)
    fold_images: int = field(default=0, metadata=at_least(0))

    def __post_init__(self) -> None:
        if self.hard_negatives > self.negatives:
            raise ValueError(f"hard_negatives {self.hard_negatives} is more than negatives {self.negatives}")


RELATIONSHIP_HEAD = {"relationship_head.": "options.score: relationship ranks pairs by the pre-trained relationship "
                                           "head, which a pre-training stage with options: {relationship: true} trains"}


def caption_words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


def caption_similarity(caption: str, image: ImageAnnotation) -> float:
    """How well `caption` describes `image` by words alone: the highest Jaccard overlap of its word
    set with one of the image's captions (what mines hard negatives without a model)."""
    words = caption_words(caption)
    return max((len(words & other) / max(len(words | other), 1) for other in map(caption_words, image.captions)),
               default=0.0)


class RetrievalPairs(AnnotatedDataset):
    """Image–text matching as ranking, as Unicoder-VL fine-tunes retrieval: sample i is caption i's
    group of `1 + 2 × negatives` pairs, scored together: the caption with its own image (label 1),
    then `negatives` captions of other images with its image (image→text), then the caption with
    `negatives` other images (text→image), all labelled 0. Unicoder-VL samples 3 negatives in each
    matching task and trains on the one the model scores highest (the matching head's triplet loss).

    Of each task's negatives the first `hard_negatives` are drawn hard: the most similar of
    `hard_pool` uniformly drawn candidates by `caption_similarity`, so that the model's hardest is
    chosen among more informative candidates than uniform draws give. A negative never shares its
    image with the positive, nor is a caption word for word equal to one of the positive image's
    captions (a duplicate caption would be a positive labelled 0).
    """

    KIND = "captions"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 negatives: int = 3, hard_negatives: int = 1, hard_pool: int = 16, seed: int = 0) -> None:
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        if negatives < 1:
            raise ValueError(f"negatives {negatives}: a ranking needs at least one per task")
        self.negatives, self.hard_negatives, self.hard_pool = negatives, hard_negatives, hard_pool
        self.lines = np.unique(self.items[:, 0])
        if len(self.lines) < 2:
            raise DataError(f"{annotations.path}: retrieval needs captions of at least two images, "
                            f"found {len(self.lines)}")

    @property
    def group_size(self) -> int:
        return 1 + 2 * self.negatives

    def sample(self, index: int) -> SampleGroup:
        rng = self.rng(index)
        image, caption = self.item(index)
        pairs = [(image, caption)]
        for rank in range(self.negatives):
            draws = self.hard_pool if rank < self.hard_negatives else 1
            pairs.append((image, self._negative(draws, lambda: self.other_caption(rng, image),
                                                lambda text: caption_similarity(text, image))))
        for rank in range(self.negatives):
            draws = self.hard_pool if rank < self.hard_negatives else 1
            pairs.append((self._negative(draws, lambda: self._other_image(rng, image, caption),
                                         lambda other: caption_similarity(caption, other)), caption))
        return SampleGroup([
            pair_sample(self.tokenizer, self.max_length, self.regions[pair_image.image_id], pair_image.file,
                        self.word_pieces(pair_caption).ids, {"labels": int(slot == 0)}, (index, slot))
            for slot, (pair_image, pair_caption) in enumerate(pairs)])

    def _negative(self, draws: int, draw, similarity):
        """The most similar of `draws` candidates (the first on ties; one draw: a uniform negative)."""
        return max((draw() for _ in range(draws)), key=similarity) if draws > 1 else draw()

    def _other_image(self, rng: random.Random, image: ImageAnnotation, caption: str) -> ImageAnnotation:
        for _ in range(self.MAX_DRAWS):
            other = self.annotations[int(self.lines[rng.randrange(len(self.lines))])]
            if other.image_id != image.image_id and caption not in other.captions:
                return other
        raise DataError(f"{self.annotations.path}: found no other image without the caption {caption!r} "
                        f"in {self.MAX_DRAWS} draws")


class RetrievalCandidates(AnnotatedDataset):
    """Every (image, caption) pair of a split, image by image: sample `i × C + c` pairs image `i`
    with caption `c` (item id `(i, c)`). Captions are tokenized once; with `cache_images` an image's
    regions are read from the store once for its C consecutive pairs instead of once per pair. Images
    and captions keep the annotation file's order, which the folds of `fold_images` follow."""

    KIND = "captions"

    def __init__(self, annotations: AnnotationFile, regions: RegionBank, tokenizer, max_length: int,
                 cache_images: bool = True, fold_images: int = 0, seed: int = 0) -> None:
        """`fold_images`: > 0, the evaluation also ranks within folds of this many consecutive images."""
        super().__init__(annotations, regions, tokenizer, max_length, seed)
        self.fold_images = fold_images
        lines = np.unique(self.items[:, 0])
        self.images = [annotations[int(line)] for line in lines]
        self.captions = [caption for image in self.images for caption in image.captions]
        self.caption_image = np.repeat(np.arange(len(self.images)), [len(image.captions) for image in self.images])
        self.pieces = [word_pieces(tokenizer, caption).ids for caption in self.captions]
        self.cache_images = cache_images
        self._cached: tuple[int, Regions] | None = None

    def __len__(self) -> int:
        return len(self.images) * len(self.captions)

    def caption_id(self, caption: int) -> str:
        """`<image_id>#<position among the image's captions>`."""
        image = int(self.caption_image[caption])
        first = int(np.searchsorted(self.caption_image, image))
        return f"{self.images[image].image_id}#{caption - first}"

    def _regions(self, image: int) -> Regions:
        if self._cached is None or self._cached[0] != image or not self.cache_images:
            self._cached = (image, self.regions[self.images[image].image_id])
        return self._cached[1]

    def sample(self, index: int) -> Sample:
        image, caption = divmod(index, len(self.captions))
        return pair_sample(self.tokenizer, self.max_length, self._regions(image), self.images[image].file,
                           self.pieces[caption], {"labels": int(self.caption_image[caption] == image)},
                           (image, caption))


class RetrievalRecall(Evaluator):
    """Image–text retrieval: every (image, caption) pair scored by the model, then Recall@1/5/10 both
    ways. `value` is text→image R@1 (each caption's query: 1 when its image ranks first), the item
    scores being those per-caption hits, so their mean is `value`; all six recalls with their 95%
    bootstrap intervals over queries, their mean, their chance levels and the scoring rate (pairs/s,
    data reading included) come along, and with the dataset's `fold_images` the same within folds
    (`folds`). Predictions: each query's right match, its rank and the top 10."""

    metric = "t2i_recall@1"
    merged = {"pairs": operator.add, "seconds": max}

    def __init__(self, data: TaskData, dataset: RetrievalCandidates) -> None:
        self.dataset = dataset
        self.scores = np.full((len(dataset.images), len(dataset.captions)), np.nan, np.float32)
        self.pairs, self.started, self.seconds = 0, time.perf_counter(), 0.0

    def state(self) -> dict[str, Any]:
        """With the rows this shard scored (a rank's slice of the pairs is a run of image rows), not
        the whole matrix: rank 0 receives each row about once (COCO 5k on 8 GPUs: 0.5 GB, not 4)."""
        scored = np.flatnonzero(~np.isnan(self.scores).all(axis=1))
        first, end = (int(scored[0]), int(scored[-1]) + 1) if len(scored) else (0, 0)
        return {**super().state(), "rows": (first, self.scores[first:end])}

    def merge(self, states: list[dict[str, Any]]) -> None:
        """Each shard's rows into the matrix; a row that two slices share takes each one's scores."""
        super().merge(states)
        for first, rows in (state["rows"] for state in states):
            block = self.scores[first : first + len(rows)]
            block[...] = filled(block, rows)

    def add(self, samples, inputs, output) -> None:
        images, captions = zip(*(sample.item_id for sample in samples))
        self.scores[list(images), list(captions)] = output.logits.float().cpu().numpy()
        self.pairs += len(samples)
        self.seconds = time.perf_counter() - self.started

    @cached_property
    def ranks(self) -> RetrievalRanks:
        return retrieval_ranks(self.scores, self.dataset.caption_image)

    def result(self) -> dict[str, Any]:
        if not self.pairs:
            return unscored(self.metric, 0)
        whole = protocol_recalls([(self.scores, self.dataset.caption_image)])
        found = whole["recalls"]
        result = {"metric": self.metric, "value": found["t2i_r1"], "chance": whole["chance_recalls"]["t2i_r1"],
                  "samples": len(self.dataset.captions), "images": len(self.dataset.images), **whole,
                  "mean_recall": round(float(np.mean(list(found.values()))), 4),
                  "pairs": self.pairs, "pairs_per_s": round(self.pairs / max(self.seconds, 1e-9), 1)}
        if self.dataset.fold_images:
            result["folds"] = self._fold_result(self.dataset.fold_images)
        return result

    def _fold_result(self, fold_images: int) -> dict[str, Any]:
        """The mean over folds of `fold_images` images (no recalls where the split has no full fold)."""
        parts = folds(self.scores, self.dataset.caption_image, fold_images)
        result = {"fold_images": fold_images, "folds": len(parts),
                  "images_in_no_fold": len(self.dataset.images) - len(parts) * fold_images}
        return {**result, **protocol_recalls(parts)} if parts else result

    def item_scores(self) -> dict[str, float]:
        ranks = self.ranks.text_to_image
        return {self.dataset.caption_id(c): float(ranks[c] == 0) for c in range(len(ranks))}

    def write(self, path: Path) -> None:
        images = [image.image_id for image in self.dataset.images]
        scores = np.nan_to_num(self.scores, nan=-np.inf)
        text_to_image = [{"caption": self.dataset.caption_id(c), "image": images[self.dataset.caption_image[c]],
                          "rank": int(self.ranks.text_to_image[c]),
                          "top10": [images[i] for i in np.argsort(-scores[:, c], kind="stable")[:10]]}
                         for c in range(scores.shape[1])]
        image_to_text = [{"image": images[i], "rank": int(self.ranks.image_to_text[i]),
                          "top10": [self.dataset.caption_id(c) for c in np.argsort(-scores[i], kind="stable")[:10]]}
                         for i in range(len(images))]
        write_atomically(path, json.dumps({"text_to_image": text_to_image, "image_to_text": image_to_text}))


def _dataset(data: TaskData, options: RetrievalOptions, annotations: AnnotationFile, seed: int, training: bool):
    if training:
        return RetrievalPairs(annotations, data.regions, data.tokenizer, data.max_length, options.negatives,
                              options.hard_negatives, options.hard_pool, seed=seed)
    return RetrievalCandidates(annotations, data.regions, data.tokenizer, data.max_length,
                               fold_images=options.fold_images, seed=seed)


TASK = Task("retrieval", VLBertForImageTextMatching, _dataset, RetrievalRecall,
            "image–text retrieval: a matching score per pair with sampled and hard negatives; Recall@1/5/10",
            ".json", options=RetrievalOptions,
            model_config=lambda data, options: {"with_relationship_head": options.score == "relationship"},
            pretrained_heads=lambda options: RELATIONSHIP_HEAD if options.score == "relationship" else {})
