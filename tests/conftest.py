import pytest
import torch

torch.set_num_threads(2)


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
