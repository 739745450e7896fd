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


def randomized_state(model: torch.nn.Module, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with non-trivial batch-norm statistics, as NumPy arrays (like a .pkl holds)."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, value in model.state_dict().items():
        shape = tuple(value.shape)
        if key.endswith("norm.running_var"):
            array = rng.uniform(0.5, 2.0, shape)
        elif key.endswith(("norm.running_mean", "norm.bias", ".bias")):
            array = rng.normal(0, 0.1, shape)
        elif key.endswith("norm.weight"):
            array = rng.uniform(0.2 if ".conv3." in key else 0.6, 1.2, shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            array = rng.normal(0, (1.0 / fan_in) ** 0.5, shape)
        state[key] = array.astype(np.float32)
    return state


@pytest.fixture(scope="session")
def tiny_detector():
    from extract import Detector

    return Detector.build("tiny")
