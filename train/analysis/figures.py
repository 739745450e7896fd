"""The grounding analysis's pictures: the layers × heads heat map and one phrase's attention drawn over
its image's boxes (an `Example`, which the analysis keeps for drawing)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on training machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from PIL import Image  # noqa: E402

from train.analysis.phrases import Phrase  # noqa: E402


@dataclass
class Example:
    """One phrase kept for drawing: its box, the image's boxes and every head's attention to them."""

    phrase: Phrase
    image_size: tuple[int, int]
    boxes: np.ndarray  # (N, 4), the candidates only
    attention: np.ndarray  # (layers, heads, N)


def draw_heat_map(accuracy: np.ndarray, result: dict[str, Any], path: Path) -> Path:
    """Accuracy per layer (rows, from 1) and head (columns, from 1), each cell labelled, the
    baselines in the title."""
    layers, heads = accuracy.shape
    figure, axes = plt.subplots(figsize=(1.0 + 0.6 * heads, 1.2 + 0.45 * layers))
    image = axes.imshow(accuracy, vmin=0.0, vmax=1.0, cmap="viridis", origin="lower", aspect="auto")
    for layer in range(layers):
        for head in range(heads):
            value = accuracy[layer, head]
            axes.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7,
                      color="black" if value > 0.6 else "white")
    axes.set_xticks(range(heads), [str(h + 1) for h in range(heads)])
    axes.set_yticks(range(layers), [str(layer + 1) for layer in range(layers)])
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    axes.set_title(f"grounding accuracy, {result['phrases']} phrases\nrandom RoI {result['random_baseline']:.2f}, "
                   f"most confident RoI {result['confidence_baseline']:.2f}", fontsize=8)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    return _save(figure, path)


def draw_example(example: Example, head: tuple[int, int], images: str | Path | None, path: Path) -> Path:
    """The image (from `images`/file; a grey canvas when absent) with every candidate box shaded by the
    attention the phrase gives it in `head` (layer, head: from 0), relative to the most attended one;
    the annotated box in green."""
    phrase = example.phrase
    width, height = example.image_size
    picture = Path(images) / phrase.file if images is not None else None
    if picture is not None and picture.is_file():
        canvas = np.asarray(Image.open(picture).convert("RGB"))
    else:
        canvas = np.full((height, width, 3), 200, np.uint8)
    figure, axes = plt.subplots(figsize=(6, 6 * height / max(width, 1) + 0.6))
    axes.imshow(canvas, extent=(0, width, height, 0))
    weights = example.attention[head]
    strength = weights / max(float(weights.max()), 1e-12)
    for (x1, y1, x2, y2), share, alpha in zip(example.boxes, weights, strength):
        axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, facecolor="red", alpha=0.5 * float(alpha),
                                 edgecolor="red", linewidth=0.8))
        axes.text(x1 + 1, y1 + 1, f"{share:.2f}", color="white", fontsize=6, va="top",
                  bbox={"facecolor": "black", "alpha": 0.5, "pad": 0.5, "linewidth": 0})
    x1, y1, x2, y2 = phrase.box
    axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="lime", linewidth=2))
    axes.set_xlim(0, width)
    axes.set_ylim(height, 0)
    axes.axis("off")
    quoted = f'"{phrase.phrase}"' + (f' in "{phrase.text}"' if phrase.phrase != phrase.text else "")
    axes.set_title(f'{quoted}\nattention, layer {head[0] + 1} head {head[1] + 1} (best head)\n'
                   "red: RoIs shaded by attention; green: annotated box", fontsize=8)
    figure.tight_layout()
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
