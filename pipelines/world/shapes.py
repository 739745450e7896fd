"""Pixel masks of the six shape classes, each drawn inside an extent x extent square."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw


def _star(s: float) -> list[tuple[float, float]]:
    outer, inner = s / 2, s / 2 * 0.45
    points = []
    for k in range(10):
        radius = outer if k % 2 == 0 else inner
        angle = -math.pi / 2 + k * math.pi / 5
        points.append((s / 2 + radius * math.cos(angle), s / 2 + radius * math.sin(angle)))
    return points


def _cross(s: float) -> list[tuple[float, float]]:
    a, b = s / 3, 2 * s / 3
    return [(a, 0), (b, 0), (b, a), (s, a), (s, b), (b, b), (b, s), (a, s), (a, b), (0, b), (0, a), (a, a)]


def shape_mask(shape: str, extent: int) -> np.ndarray:
    """(extent, extent) bool mask of `shape`; its tight box is the object's box."""
    canvas = Image.new("L", (extent, extent), 0)
    draw = ImageDraw.Draw(canvas)
    s = extent - 1  # PIL includes both end points of a polygon or an ellipse's bounding box
    if shape == "square":
        draw.rectangle((0, 0, s, s), fill=1)
    elif shape == "circle":
        draw.ellipse((0, 0, s, s), fill=1)
    elif shape == "triangle":
        draw.polygon([(s / 2, 0), (s, s), (0, s)], fill=1)
    elif shape == "diamond":
        draw.polygon([(s / 2, 0), (s, s / 2), (s / 2, s), (0, s / 2)], fill=1)
    elif shape == "star":
        draw.polygon(_star(s), fill=1)
    elif shape == "cross":
        draw.polygon(_cross(s), fill=1)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return np.asarray(canvas, dtype=bool)
