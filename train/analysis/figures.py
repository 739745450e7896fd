"""The attention analyses' pictures: heat maps (layers × heads for grounding, relations × heads for
syntax), the accuracy of each head by layer (VisualBERT's Figure 4) and one phrase's attention drawn
over its image's boxes (an `Example`, which the grounding analysis keeps for drawing)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on training machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from extract.images import DEFAULT_MAX_PIXELS, ImageError, load_image  # noqa: E402
from train.analysis.grounding_results import HeadScores  # noqa: E402
from train.analysis.phrases import Phrase  # noqa: E402
from vlbert.utils.atomic import file_written_whole, made_folder  # noqa: E402


@dataclass
class Example:
    """One phrase kept for drawing: its box, the image's boxes and every head's attention to them."""

    phrase: Phrase
    image_size: tuple[int, int]
    boxes: np.ndarray  # (N, 4), the candidates only
    attention: np.ndarray  # (layers, heads, N)


def draw_heat_map(accuracy: np.ndarray, scores: HeadScores, path: Path) -> Path:
    """Accuracy per layer (rows, from 1) and head (columns, from 1), each cell labelled, the
    baselines in the title."""
    layers, heads = accuracy.shape
    figures = scores.figures
    return draw_table(accuracy, [str(layer + 1) for layer in range(layers)], [str(h + 1) for h in range(heads)],
                      ("head", "layer"), f"grounding accuracy, {scores.count} phrases\nrandom RoI "
                      f"{figures.random_baseline:.2f}, most confident RoI {figures.confidence_baseline:.2f}", path)


def draw_relation_heat_map(accuracy: np.ndarray, relations: list[str], path: Path, title: str) -> Path:
    """Accuracy per relation (rows, top first) and head (columns, layer-head from 1): (relations,
    layers, heads)."""
    _, layers, heads = accuracy.shape
    columns = [f"{layer + 1}-{head + 1}" for layer in range(layers) for head in range(heads)]
    return draw_table(accuracy.reshape(len(relations), -1)[::-1], relations[::-1], columns,
                      ("head (layer-head)", "relation"), title, path)


def draw_table(values: np.ndarray, rows: list[str], columns: list[str], axis_names: tuple[str, str], title: str,
               path: Path) -> Path:
    """A heat map of accuracies (0 to 1), row 0 at the bottom; cells labelled where they are wide
    enough to read (at most 24 columns)."""
    figure, axes = plt.subplots(figsize=(min(1.0 + 0.6 * len(columns), 30.0), 1.2 + 0.45 * len(rows)))
    image = axes.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", origin="lower", aspect="auto")
    if len(columns) <= 24:
        for row in range(len(rows)):
            for column in range(len(columns)):
                value = values[row, column]
                axes.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=7,
                          color="black" if value > 0.6 else "white")
    axes.set_xticks(range(len(columns)), columns, rotation=90 if len(columns) > 24 else 0,
                    fontsize=7 if len(columns) <= 24 else 5)
    axes.set_yticks(range(len(rows)), rows)
    axes.set_xlabel(axis_names[0])
    axes.set_ylabel(axis_names[1])
    axes.set_title(title, fontsize=8)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    return save_figure(figure, path)


def draw_layer_plot(accuracy: np.ndarray, baselines: dict[str, float], title: str, path: Path) -> Path:
    """VisualBERT's Figure 4: each head's accuracy (a dot) by layer (from 1), each baseline a line."""
    layers, heads = accuracy.shape
    figure, axes = plt.subplots(figsize=(max(5.0, 1.5 + 0.45 * layers), 3.5))
    for layer in range(layers):
        axes.scatter(np.full(heads, layer + 1), accuracy[layer], s=12, color="tab:blue",
                     label="a head" if layer == 0 else None)
    for (name, value), style in zip(baselines.items(), ("-", "--", ":")):
        axes.axhline(value, color="tab:red", linestyle=style, linewidth=1, label=f"{name} {value:.2f}")
    axes.set_xticks(range(1, layers + 1))
    axes.set_xlim(0.5, layers + 0.5)
    axes.set_ylim(0.0, 1.0)
    axes.set_xlabel("layer")
    axes.set_ylabel("accuracy")
    axes.set_title(title, fontsize=8)
    axes.legend(fontsize=6, loc="upper left")
    figure.tight_layout()
    return save_figure(figure, path)


def draw_example(example: Example, head: tuple[int, int], images: str | Path | None, path: Path) -> Path:
    """The image (from `images`/file; a grey canvas when absent, unreadable or of more pixels than
    extraction reads, extract.images.DEFAULT_MAX_PIXELS) with every candidate box shaded by the
    attention the phrase gives it in `head` (layer, head: from 0), relative to the most attended one;
    the annotated box in green."""
    phrase = example.phrase
    width, height = example.image_size
    picture = Path(images) / phrase.file if images is not None else None
    try:
        canvas = load_image(picture, DEFAULT_MAX_PIXELS) if picture is not None else None
    except ImageError:
        canvas = None
    if canvas is None:
        canvas = np.full((height, width, 3), 200, np.uint8)
    figure, axes = plt.subplots(figsize=(6, 6 * height / max(width, 1) + 0.6))
    axes.imshow(canvas, extent=(0, width, height, 0))
    shade_regions(axes, example.boxes, example.attention[head])
    x1, y1, x2, y2 = phrase.box
    axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="lime", linewidth=2))
    axes.set_xlim(0, width)
    axes.set_ylim(height, 0)
    axes.axis("off")
    quoted = f'"{phrase.phrase}"' + (f' in "{phrase.text}"' if phrase.phrase != phrase.text else "")
    axes.set_title(f'{quoted}\nattention, layer {head[0] + 1} head {head[1] + 1} (best head)\n'
                   "red: RoIs shaded by attention; green: annotated box", fontsize=8)
    figure.tight_layout()
    return save_figure(figure, path)


def shade_regions(axes, boxes: np.ndarray, weights: np.ndarray, fontsize: float = 6) -> None:
    """Each box (x1, y1, x2, y2) shaded red by its attention weight relative to the largest, and
    labelled with the weight."""
    strength = weights / max(float(weights.max()), 1e-12)
    for (x1, y1, x2, y2), share, alpha in zip(boxes, weights, strength):
        axes.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, facecolor="red", alpha=0.5 * float(alpha),
                                 edgecolor="red", linewidth=0.8))
        axes.text(x1 + 1, y1 + 1, f"{share:.2f}", color="white", fontsize=fontsize, va="top",
                  bbox={"facecolor": "black", "alpha": 0.5, "pad": 0.5, "linewidth": 0})


def save_figure(figure, path: Path) -> Path:
    """The figure in `path`, whole or not at all (a temporary beside it, then renamed)."""
    made_folder(path.parent)
    try:
        with file_written_whole(path) as temporary:
            figure.savefig(temporary, dpi=100, format=path.suffix[1:])
    finally:
        plt.close(figure)
    return path
