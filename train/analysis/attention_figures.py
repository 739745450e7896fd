"""The pictures of one sample's attention (a `SampleAttention`, which train/analysis/attention.py
measures): a grid of layers × heads, each a heat map of words (rows) × regions (columns); and for
one word, the same grid of its image with the regions shaded by that word's attention (VisualBERT's
Figure 3)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.patches import Rectangle

from train.analysis.figures import plt, save_figure, shade_regions

PANEL_MAX_INCHES = 4.0


@dataclass
class SampleAttention:
    """One sample's words, regions and attention, with what its pictures show."""

    item: int
    kind: str
    image_id: str
    text: str
    words: list[str]
    regions: list[str]  # "whole image", then each RoI's label ("red 0.71 square 0.93")
    classes: list[str]  # "whole image", then each RoI's top class
    boxes: np.ndarray  # (N, 4) in image pixels, the whole-image box first
    image_size: tuple[int, int]  # (width, height)
    attention: np.ndarray  # (layers, heads, words, N)
    box: list[float] | None  # a referring expression's annotated box

    def record(self) -> dict[str, Any]:
        return {"item": self.item, "kind": self.kind, "image_id": self.image_id, "text": self.text,
                "words": self.words, "regions": [{"label": label, "box": [round(float(v), 1) for v in box]}
                                                 for label, box in zip(self.regions, self.boxes)],
                "attention": np.round(self.attention, 4).tolist()}


def _grid(layers: int, heads: int, width: float, height: float):
    return plt.subplots(layers, heads, figsize=(0.6 + width * heads, 1.0 + height * layers), squeeze=False,
                        layout="constrained")


def draw_word_region_grid(sample: SampleAttention, path: Path) -> Path:
    """Every layer's (rows, from 1) and head's (columns) attention from each word to each region, on
    one colour scale (0 to the largest value), words labelled on the first column, regions on the
    last row."""
    layers, heads, words, regions = sample.attention.shape
    width = min(PANEL_MAX_INCHES, 0.8 + 0.14 * regions)
    height = min(PANEL_MAX_INCHES, 0.6 + 0.14 * words)
    figure, axes = _grid(layers, heads, width, height + 0.9 / layers)
    top = max(float(sample.attention.max()), 1e-12)
    for layer in range(layers):
        for head in range(heads):
            panel = axes[layer, head]
            image = panel.imshow(sample.attention[layer, head], vmin=0.0, vmax=top, cmap="viridis", aspect="auto")
            panel.set_title(f"layer {layer + 1} head {head + 1}", fontsize=7)
            panel.set_yticks(range(words), sample.words if head == 0 else [""] * words, fontsize=6)
            labels = [f"{k} {name}" for k, name in enumerate(sample.classes)]
            panel.set_xticks(range(regions), labels if layer == layers - 1 else [""] * regions, rotation=90,
                             fontsize=5)
    figure.suptitle(f'"{sample.text}" ({sample.kind} item {sample.item}, image {sample.image_id})\nattention '
                    "probability from each word (rows) to each region (columns: 0 the whole image, then the RoIs "
                    "best first)", fontsize=8)
    figure.colorbar(image, ax=axes, shrink=0.6)
    return save_figure(figure, path)


def draw_word_regions(sample: SampleAttention, word: int, pixels: np.ndarray | None, path: Path) -> Path:
    """For each layer and head, the image (grey where `pixels` is None) with every RoI shaded by the
    attention `word` gives it, relative to the most attended RoI; the whole image's share in the
    panel's title, a referring expression's annotated box in green."""
    layers, heads = sample.attention.shape[:2]
    image_width, image_height = sample.image_size
    canvas = np.full((image_height, image_width, 3), 200, np.uint8) if pixels is None else pixels
    side = 2.4
    figure, axes = _grid(layers, heads, side, side * image_height / max(image_width, 1) + 0.3)
    for layer in range(layers):
        for head in range(heads):
            panel = axes[layer, head]
            weights = sample.attention[layer, head, word]
            panel.imshow(canvas, extent=(0, image_width, image_height, 0))
            shade_regions(panel, sample.boxes[1:], weights[1:], fontsize=4)
            if sample.box is not None:
                x1, y1, x2, y2 = sample.box
                panel.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="lime", linewidth=1.2))
            panel.set_xlim(0, image_width)
            panel.set_ylim(image_height, 0)
            panel.axis("off")
            panel.set_title(f"L{layer + 1} H{head + 1}: image {weights.sum():.2f}, whole {weights[0]:.2f}",
                            fontsize=6)
    figure.suptitle(f'"{sample.words[word]}" in "{sample.text}" ({sample.kind} item {sample.item})\n'
                    "red: each RoI shaded by the word's attention, relative to the most attended RoI of the panel; "
                    "title: the word's attention to all regions and to the whole-image box"
                    + ("; green: the annotated box" if sample.box is not None else ""), fontsize=7)
    return save_figure(figure, path)
