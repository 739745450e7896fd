"""Synthetic image directories for tests, benchmarks and demos (no data sets on these machines)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def synthetic_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """(H, W, 3) uint8: noise with a few flat rectangles, so detector outputs vary across regions."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    for _ in range(3):
        y, x = rng.integers(0, max(1, height // 2)), rng.integers(0, max(1, width // 2))
        image[y : y + height // 3, x : x + width // 3] = rng.integers(0, 256, size=3, dtype=np.uint8)
    return image


def write_synthetic_images(root: str | Path, count: int, min_side: int = 64, max_side: int = 128,
                           seed: int = 0, subdir_every: int = 4) -> list[Path]:
    """`count` PNG images of varied sizes under `root` (every `subdir_every`-th in a subfolder)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        height, width = (int(s) for s in rng.integers(min_side, max_side + 1, size=2))
        folder = root / "nested" if subdir_every and i % subdir_every == subdir_every - 1 else root
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"image{i:04d}.png"
        Image.fromarray(synthetic_image(height, width, seed=seed * 100_003 + i)).save(path)
        paths.append(path)
    return paths
