"""A batch leaves a DataLoader worker with its tensors in one block (train/data/packing.py): bitwise the
worker's tensors, dtypes and shapes, other values as they were, and one shared storage on arrival."""

import pickle

import numpy as np
import torch
from torch.utils.data import DataLoader

from extract.store.schema import Encoded
from train.data.packing import packed, unpacked
from train.engine.batches import Batch


def batch_inputs(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "appearance": torch.randn(3, 5, 7, generator=generator).half(),  # 210 bytes: the next starts aligned
        "box_mask": torch.rand(3, 5, generator=generator) > 0.5,
        "text_ids": torch.randint(0, 1000, (3, 11), generator=generator),
        "boxes": torch.rand(3, 5, 4, generator=generator).transpose(1, 2),  # not contiguous
        "scale": torch.tensor(0.5),
        "no_positions": torch.zeros(0, 2, dtype=torch.long),
        "region_labels": Encoded("topk", {"ids": torch.randint(0, 9, (3, 5, 2), generator=generator, dtype=torch.int16),
                                          "probs": torch.rand(3, 5, 2, generator=generator),
                                          "kept": np.arange(3)}, width=9),
        "image_files": ["a.png", "b.png", None],
        "images": None,
    }


def assert_same_inputs(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        if torch.is_tensor(value):
            got = actual[name]
            assert got.dtype == value.dtype and got.shape == value.shape and torch.equal(got, value), name
        elif isinstance(value, Encoded):
            assert (actual[name].encoding, actual[name].width) == (value.encoding, value.width)
            assert_same_inputs(actual[name].parts, value.parts)
        elif isinstance(value, np.ndarray):
            assert np.array_equal(actual[name], value), name
        else:
            assert actual[name] == value, name


def tensors_of(inputs: dict) -> list[torch.Tensor]:
    parts = [p for v in inputs.values() for p in (v.parts.values() if isinstance(v, Encoded) else [v])]
    return [p for p in parts if torch.is_tensor(p)]


def test_packed_inputs_unpack_to_the_same_tensors_in_one_block():
    inputs = batch_inputs(0)
    block, layout = packed(inputs)
    assert block.dtype == torch.uint8 and block.dim() == 1
    received = unpacked(*pickle.loads(pickle.dumps((block, layout))))
    assert_same_inputs(received, inputs)
    storages = {t.untyped_storage().data_ptr() for t in tensors_of(received)}
    assert len(storages) == 1


def test_a_pickled_batch_is_the_same_batch():
    batch = Batch(batch_inputs(1), [], 3, 2, tokens=17)
    received = pickle.loads(pickle.dumps(batch))
    assert_same_inputs(received.inputs, batch.inputs)
    assert (received.damaged, received.usable, received.with_images, received.tokens) == ([], 3, 2, 17)
    empty = pickle.loads(pickle.dumps(Batch(None, [], 0, 0)))
    assert empty.inputs is None and empty.usable == 0


def collate_seeds(seeds: list[int]) -> Batch:
    return Batch(batch_inputs(seeds[0]), [], len(seeds), len(seeds))


def test_batches_from_worker_processes_arrive_whole_each_in_one_block():
    loader = DataLoader(range(6), batch_size=2, num_workers=2, collate_fn=collate_seeds)
    batches = list(loader)
    assert len(batches) == 3
    for seed, batch in zip([0, 2, 4], batches):
        assert_same_inputs(batch.inputs, batch_inputs(seed))
        assert len({t.untyped_storage().data_ptr() for t in tensors_of(batch.inputs)}) == 1
