"""Image–text retrieval's ranking maths: each query's rank of its right match, Recall@K both ways,
the recalls of a random ranking, and the test protocols: the whole split (COCO 5K), or the mean over
folds of consecutive images (COCO 1K: 5 folds of 1,000 images), each recall with its 95% interval."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from train.evaluation.statistics import RESAMPLES, grouped_bootstrap_interval

RECALL_AT = (1, 5, 10)


@dataclass
class RetrievalRanks:
    """0-based rank of the right match of every query; ties count against it (a wrong candidate
    scoring the same as the right one ranks above it), so a constant scorer never beats chance."""

    image_to_text: np.ndarray  # (images,): the best-ranked of the image's own captions among all captions
    text_to_image: np.ndarray  # (captions,): the caption's image among all images


def retrieval_ranks(scores: np.ndarray, caption_image: np.ndarray) -> RetrievalRanks:
    """Ranks from `scores` (images × captions; NaN: unscored, ranked last) and each caption's image."""
    scores = np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf)
    right = caption_image[None, :] == np.arange(len(scores))[:, None]
    text_truth = scores[caption_image, np.arange(scores.shape[1])]
    text_ranks = ((scores >= text_truth[None, :]) & ~right).sum(0)
    image_truth = np.where(right, scores, -np.inf).max(1)
    image_ranks = ((scores >= image_truth[:, None]) & ~right).sum(1)
    return RetrievalRanks(image_ranks, text_ranks)


def recall_hits(ranks: RetrievalRanks) -> dict[str, np.ndarray]:
    """Each query's Recall@K hit (1: its right match ranks in the top K) of both directions."""
    return {f"{name}_r{k}": (direction < k).astype(np.float64)
            for name, direction in (("i2t", ranks.image_to_text), ("t2i", ranks.text_to_image)) for k in RECALL_AT}


def folds(scores: np.ndarray, caption_image: np.ndarray, fold_images: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(scores, caption_image) of each fold of `fold_images` consecutive images with their captions, ranked
    among themselves only: the COCO 1K protocol's 5 folds of the 5K test split, in the split's order. The
    images after the last full fold belong to none."""
    parts = []
    for first in range(0, len(scores) - fold_images + 1, fold_images):
        captions = np.flatnonzero((caption_image >= first) & (caption_image < first + fold_images))
        parts.append((scores[first : first + fold_images][:, captions], caption_image[captions] - first))
    return parts


def protocol_recalls(parts: list[tuple[np.ndarray, np.ndarray]], resamples: int = RESAMPLES) -> dict:
    """A test protocol's results over its parts (the whole split, or its folds): each recall as the mean
    over the parts of the part's recall, its 95% interval (queries resampled within each part), and the
    chance recalls (likewise averaged)."""
    hits = [recall_hits(retrieval_ranks(scores, caption_image)) for scores, caption_image in parts]
    chance = [chance_recalls(caption_image, len(scores)) for scores, caption_image in parts]
    return {"recalls": {name: round(float(np.mean([part[name].mean() for part in hits])), 4) for name in hits[0]},
            "recall_intervals": {name: [round(bound, 4) for bound in grouped_bootstrap_interval(
                                     [part[name] for part in hits], resamples).to_list()] for name in hits[0]},
            "chance_recalls": {name: round(float(np.mean([part[name] for part in chance])), 4) for name in chance[0]}}


def chance_recalls(caption_image: np.ndarray, num_images: int) -> dict[str, float]:
    """Recall@K of a uniformly random ranking: K/images for a caption's one image; for an image with
    g of the C captions, the chance that some of its g lands in a random top K."""
    captions = len(caption_image)
    own = np.bincount(caption_image, minlength=num_images)
    result = {}
    for k in RECALL_AT:
        top = min(k, captions)
        missed = [math.comb(captions - g, top) / math.comb(captions, top) for g in own]
        result[f"i2t_r{k}"] = round(1 - float(np.mean(missed)), 4)
    result.update({f"t2i_r{k}": round(min(k, num_images) / num_images, 4) for k in RECALL_AT})
    return result
