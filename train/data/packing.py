"""A collated batch's tensors in one block of memory, for its trip from a DataLoader worker.

torch sends each tensor between processes through a file descriptor of its own, each over a new
authenticated socket connection to the sending worker: with a dozen tensors a batch, that was a fifth
of a small pre-training step's time on a busy 2-core machine. Packed, a batch takes one; the receiver's
tensors are views into the block, bitwise the worker's.
"""

from __future__ import annotations

from typing import Any

import torch

from extract.store.schema import Encoded

ALIGNMENT = 64  # bytes: each tensor starts where any dtype's elements may


def packed(inputs: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """(one uint8 block holding every tensor of `inputs`, top level or an `Encoded` value's part, and
    the layout that `unpacked` rebuilds `inputs` from); other values travel in the layout as they are."""
    tensors = [value for value in inputs.values() if torch.is_tensor(value)]
    tensors += [part for value in inputs.values() if isinstance(value, Encoded)
                for part in value.parts.values() if torch.is_tensor(part)]
    offsets, size = {}, 0
    for tensor in tensors:
        offsets[id(tensor)] = size
        size += -(-tensor.nbytes // ALIGNMENT) * ALIGNMENT
    # In shared memory from the start, as torch's default_collate does in workers: sending it copies nothing.
    block = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(size))

    def placed(value: Any) -> Any:
        if not torch.is_tensor(value):
            return value
        start = offsets[id(value)]
        _view(block, start, value.dtype, value.shape).copy_(value)
        return _Placed((start, value.dtype, tuple(value.shape)))

    layout = {name: value.with_parts({k: placed(p) for k, p in value.parts.items()}) if isinstance(value, Encoded)
              else placed(value) for name, value in inputs.items()}
    return block, layout


def unpacked(block: torch.Tensor, layout: dict[str, Any]) -> dict[str, Any]:
    """The inputs that `packed` laid out, their tensors views into `block`."""

    def restored(value: Any) -> Any:
        return _view(block, *value) if isinstance(value, _Placed) else value

    return {name: value.with_parts({k: restored(p) for k, p in value.parts.items()}) if isinstance(value, Encoded)
            else restored(value) for name, value in layout.items()}


class _Placed(tuple):
    """Where a tensor lies in the block: (byte offset, dtype, shape)."""


def _view(block: torch.Tensor, start: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    count = torch.Size(shape).numel()
    return block[start: start + count * dtype.itemsize].view(dtype).view(shape)
