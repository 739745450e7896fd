import numpy as np
import pytest
import torch

torch.set_num_threads(2)


def synthetic_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A textured RGB image with a few flat rectangles, so detector outputs vary across regions."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    for _ in range(3):
        y, x = rng.integers(0, max(1, height // 2)), rng.integers(0, max(1, width // 2))
        image[y : y + height // 3, x : x + width // 3] = rng.integers(0, 256, size=3, dtype=np.uint8)
    return image


@pytest.fixture(scope="session")
def tiny_detector():
    from extract import Detector

    return Detector.build("tiny")
