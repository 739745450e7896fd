"""Sampling a scene: image size, background and non-overlapping objects with their boxes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.world.shapes import shape_mask
from pipelines.world.vocabulary import BACKGROUNDS, CLASS_NAMES, COLOURS, NAMED_SIZES, SIZE_EXTENTS

# One side is the tiny detector's short side (128), so its input is the image at native size.
IMAGE_SIDES = (128, 160, 192)
SHORT_SIDE = 128
# Free pixels kept between objects, so every box holds one object only.
GAP = 3
PLACEMENT_TRIES = 60
# The most objects a scene may hold: the shipped demo detector was trained on scenes of 1-5.
MAX_OBJECTS = 5


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str  # "small", "medium" or "large"
    x: int  # top-left corner of the square the shape is drawn in
    y: int
    extent: int
    box: tuple[int, int, int, int]  # xyxy in pixels: the tight box of the drawn pixels

    @property
    def attributes(self) -> list[str]:
        return [self.colour] + ([self.size] if self.size in NAMED_SIZES else [])

    @property
    def centre(self) -> tuple[float, float]:
        x1, y1, x2, y2 = self.box
        return (x1 + x2) / 2, (y1 + y2) / 2

    def mask(self) -> np.ndarray:
        return shape_mask(self.shape, self.extent)


@dataclass(frozen=True)
class Scene:
    width: int
    height: int
    background: str
    objects: tuple[SceneObject, ...]


def _tight_box(shape: str, x: int, y: int, extent: int) -> tuple[int, int, int, int]:
    rows, cols = np.nonzero(shape_mask(shape, extent))
    return x + int(cols.min()), y + int(rows.min()), x + int(cols.max()) + 1, y + int(rows.max()) + 1


def _overlaps(x: int, y: int, extent: int, others: list[SceneObject]) -> bool:
    return any(x < o.x + o.extent + GAP and o.x < x + extent + GAP and
               y < o.y + o.extent + GAP and o.y < y + extent + GAP for o in others)


def sample_scene(rng: np.random.Generator, max_objects: int) -> Scene:
    long_side = int(rng.choice(IMAGE_SIDES))
    width, height = (long_side, SHORT_SIDE) if rng.random() < 0.5 else (SHORT_SIDE, long_side)
    objects: list[SceneObject] = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        shape, colour = str(rng.choice(CLASS_NAMES)), str(rng.choice(list(COLOURS)))
        size = str(rng.choice(list(SIZE_EXTENTS)))
        low, high = SIZE_EXTENTS[size]
        extent = int(rng.integers(low, high + 1))
        for _ in range(PLACEMENT_TRIES):
            x, y = int(rng.integers(1, width - extent)), int(rng.integers(1, height - extent))
            if not _overlaps(x, y, extent, objects):
                objects.append(SceneObject(shape, colour, size, x, y, extent, _tight_box(shape, x, y, extent)))
                break
    return Scene(width, height, str(rng.choice(BACKGROUNDS)), tuple(objects))
