import numpy as np
import pytest
import torch

torch.set_num_threads(2)


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


def image_folder(root, count: int):
    """`root` with `count` synthetic images and one file named like an image that is not one."""
    from extract.synthetic import write_synthetic_images

    write_synthetic_images(root, count)
    (root / "notes.jpg").write_text("not an image")
    return root


@pytest.fixture(scope="session")
def tiny_detector():
    from extract import Detector

    return Detector.build("tiny")


def pytest_collection_modifyitems(config, items):
    """`cuda` tests are skipped where torch sees no CUDA device, so they can sit in every run."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
