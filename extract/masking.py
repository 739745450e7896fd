"""Seeded draws of which boxes a masked-pixel variant hides (masked RoI classification targets)."""

from __future__ import annotations

import hashlib

import numpy as np


def draw_masks(image_id: str, num_boxes: int, count: int, prob: float, seed: int) -> np.ndarray:
    """(count, num_boxes) bool: each draw masks each box with probability `prob`, and at least one.

    The generator is seeded from `seed` and the image id only, so an image's draws never depend
    on processing order, batching, sharding or resuming. The whole-image box is not among the
    boxes and is never masked.
    """
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"mask probability {prob}: expected a value in [0, 1]")
    id_hash = int.from_bytes(hashlib.sha256(image_id.encode("utf-8")).digest()[:8], "little")
    rng = np.random.default_rng([seed, id_hash])
    masks = rng.random((count, num_boxes)) < prob
    if num_boxes:
        forced = rng.integers(num_boxes, size=count)
        empty = ~masks.any(axis=1)
        masks[empty, forced[empty]] = True
    return masks
