"""Batches moved to the training device, the next one while the current step computes (UNITER's
prefetch loader): on CUDA its copy from pinned memory, and the widening of its float16 features,
run on a side stream, so the step's stream never waits for a transfer it could have overlapped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator, TypeVar

import torch
from torch.profiler import record_function

from train.data.collate import pixel_entries, to_device

# train.engine.batches's Batch (which imports this module): a dataclass with `inputs` and `pixels`
Batch = TypeVar("Batch")


def on_device(batches: Iterator[Batch], device: torch.device, ahead: bool) -> Iterator[Batch]:
    """`batches` with their tensors on `device` (the pixel entries apart, `Batch.pixels`); with `ahead`
    on CUDA, each batch's copy starts when the one before it is handed out."""
    if not (ahead and device.type == "cuda"):
        yield from (moved(batch, device) for batch in batches)
        return
    side = torch.cuda.Stream(device)
    pending = _started(next(batches), device, side)
    for batch in batches:
        ready = _ready(pending, device, side)
        pending = _started(batch, device, side)
        yield ready
    yield _ready(pending, device, side)


def moved(batch: Batch, device: torch.device) -> Batch:
    """The batch with its tensors on `device`, in the current stream."""
    if batch.inputs is None:
        return batch
    with record_function("host to device"):
        return replace(batch, inputs=to_device(batch.inputs, device), pixels=pixel_entries(batch.inputs))


def _started(batch: Batch, device: torch.device, side: torch.cuda.Stream) -> Batch:
    # No wait for the step's stream: memory that stream still reads is not reused (`_ready` records
    # it), and the pinned source stays allocated until its copy ends (torch's pinned memory cache).
    with torch.cuda.stream(side):
        return moved(batch, device)


def _ready(batch: Batch, device: torch.device, side: torch.cuda.Stream) -> Batch:
    """The batch for the step's stream: it waits for the copy, and the caching allocator learns
    that the step's stream uses memory the side stream allocated."""
    current = torch.cuda.current_stream(device)
    current.wait_stream(side)
    for value in (batch.inputs or {}).values():
        if torch.is_tensor(value) and value.device.type == "cuda":
            value.record_stream(current)
    return batch
