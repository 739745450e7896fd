"""Training examples for the detector: an image and its annotated objects."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DetectionExample:
    image: np.ndarray  # (H, W, 3) uint8 RGB
    boxes: np.ndarray  # (N, 4) float32, xyxy in image pixels
    classes: np.ndarray  # (N,) int64 class indices
    attributes: list[list[int]]  # per object, its attribute indices (possibly none)

    def flipped(self) -> "DetectionExample":
        """The horizontal mirror image, boxes mirrored with it."""
        width = self.image.shape[1]
        boxes = self.boxes.copy()
        boxes[:, [0, 2]] = width - self.boxes[:, [2, 0]]
        return DetectionExample(np.ascontiguousarray(self.image[:, ::-1]), boxes, self.classes, self.attributes)
