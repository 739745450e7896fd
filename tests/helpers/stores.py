"""Synthetic FeatureStore records, damage to a store's data file, and record-by-record comparison."""

from pathlib import Path

import numpy as np
import pytest

from extract.store import FeatureStore, build_meta
from tests.helpers.store_damage import SHARD_FILE

DIM = 32

# Export formats that drop fields warn about it; tests that mean to drop them silence the warning.
QUIET_LOSSES = pytest.mark.filterwarnings("ignore:.*(imported without|not exported)")


def synthetic_record(image_id: str, num_boxes: int = 5, variants: int = 0) -> dict:
    """A record whose numbers follow from its id, so any process can check what it reads."""
    rng = np.random.default_rng(sum(image_id.encode()))
    features = rng.random((num_boxes, DIM)).astype(np.float16)
    record = {
        "boxes": (rng.random((num_boxes, 4)) * 50).astype(np.float32).cumsum(axis=1),
        "features": features,
        "image_feature": rng.random(DIM).astype(np.float16),
        "objects_id": rng.integers(0, 6, num_boxes), "objects_conf": rng.random(num_boxes).astype(np.float32),
        "class_probs": rng.random((num_boxes, 7)).astype(np.float16),
        "image_h": 80, "image_w": 120, "box_source": "proposals",
    }
    if variants:
        masks = rng.random((variants, num_boxes)) < 0.5
        masks[:, 0] = True
        masked = np.repeat(features[None], variants, axis=0)
        masked[:, 1::2] = rng.random((variants, len(masked[0, 1::2]), DIM))  # rows 0, 2, ... unchanged
        record.update(mask_boxes=masks, masked_features=masked, masked_image_feature=rng.random((variants, DIM)).astype(np.float16))
    return record


def meta(variants: int = 0) -> dict:
    return build_meta(feature_dim=DIM, mode="imported", num_classes=7, has_attributes=False, mask_variants=variants)


def data_file(root: Path) -> Path:
    return root / SHARD_FILE


def flip_bit_in(path: Path, needle: bytes, bit: int = 3) -> None:
    """Flips one bit in the middle of every occurrence of `needle` in the file (pages LMDB copied
    on write keep stale copies; damaging only those would change nothing)."""
    data = bytearray(path.read_bytes())
    offset = data.find(needle)
    assert offset >= 0
    while offset >= 0:
        data[offset + len(needle) // 2] ^= 1 << bit
        offset = data.find(needle, offset + 1)
    path.write_bytes(bytes(data))


def assert_same_records(a: FeatureStore, b: FeatureStore) -> None:
    assert a.keys() == b.keys()
    for key in a:
        ra, rb = a[key], b[key]
        assert ra.keys() == rb.keys(), key
        for name, value in ra.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == rb[name].dtype and np.array_equal(value, rb[name]), (key, name)
            else:
                assert value == rb[name], (key, name)
