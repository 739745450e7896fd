"""Image–text retrieval's ranking maths: each query's rank of its right match, Recall@K both ways,
and the recalls of a random ranking."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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


def recalls(ranks: RetrievalRanks) -> dict[str, float]:
    """Recall@K (share of queries whose right match ranks in the top K) of both directions."""
    return {f"{name}_r{k}": round(float((direction < k).mean()), 4)
            for name, direction in (("i2t", ranks.image_to_text), ("t2i", ranks.text_to_image)) for k in RECALL_AT}


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
