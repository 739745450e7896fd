"""Painting a scene: a muted textured background, then each object in its flat (jittered) colour."""

from __future__ import annotations

import numpy as np

from pipelines.world.scene import Scene
from pipelines.world.vocabulary import COLOURS

COLOUR_JITTER = 12
NOISE_STD = 14.0


def _background(kind: str, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    # Greyish tints (low saturation) so no background reads as one of the object colours.
    base = rng.uniform(85, 185) + rng.uniform(-20, 20, size=3)
    other = rng.uniform(85, 185) + rng.uniform(-20, 20, size=3)
    ys, xs = np.mgrid[0:height, 0:width]
    if kind == "stripes":
        period, angle = rng.integers(8, 20), rng.uniform(0, np.pi)
        weight = ((xs * np.cos(angle) + ys * np.sin(angle)) // (period / 2)) % 2
    elif kind == "checks":
        cell = rng.integers(8, 24)
        weight = (xs // cell + ys // cell) % 2
    elif kind == "gradient":
        angle = rng.uniform(0, 2 * np.pi)
        ramp = xs * np.cos(angle) + ys * np.sin(angle)
        weight = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1.0)
    else:  # "noise": texture from the noise alone
        weight = np.zeros((height, width))
    image = base + (other - base) * weight[..., None].astype(np.float64)
    return image + rng.normal(0, NOISE_STD, size=(height, width, 3))


def render_scene(scene: Scene, rng: np.random.Generator) -> np.ndarray:
    """(H, W, 3) uint8 RGB."""
    image = _background(scene.background, scene.height, scene.width, rng)
    for obj in scene.objects:
        colour = np.array(COLOURS[obj.colour]) + rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1, size=3)
        region = image[obj.y : obj.y + obj.extent, obj.x : obj.x + obj.extent]
        region[obj.mask()] = colour
    return np.clip(image + 0.5, 0, 255).astype(np.uint8)
