"""A stage's batches: samples drawn in DataLoader workers, collated there, and handed to the device.

A stage reads one or more streams (the task's dataset, and its extra streams such as the text-only corpus),
each with its own seeded order (`EpochBatches`). One DataLoader serves them all for the whole
stage, so its workers start once: its sampler yields, per micro-batch, keys (stream, epoch, index),
and the workers make and collate those samples. Damaged records travel as markers beside the
collated batch, so the stage's damaged-record policy still runs in the training process.

Features stay in the store's float16 through the worker pipes and the pinned host buffer; they
are widened to float32 on the device (`train.data.collate.to_device`), which is exact. A q8 store's
travel as their 8-bit codes and are decoded there, bitwise as the host would (`decode_on_device`).
The batches reach the training process on its device already (`train.engine.prefetch`). The workers
leave the stop signals to the training process, which ends them after its checkpoint
(`train.engine.stopping`).

`LengthBuckets` orders a stream as UNITER's token-bucket sampler does, at a fixed batch size: each
batch holds samples of similar lengths, so that little of it is padding.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from train.data.collate import collate, decoded_on_host, pinned
from train.data.datasets import DamagedSample, Sample
from train.data.packing import packed, unpacked
from train.engine.distributed import World
from train.engine.prefetch import on_device
from train.engine.stopping import spared_from_stops


Position = tuple[int, int]  # (epoch, samples of the epoch's permutation that earlier batches took)


class EpochBatches:
    """Index batches for one process: a seeded permutation per epoch, drop-last. The ranks take
    turns through it, so that a step of every rank takes the next `batch_size × world size` samples
    of the permutation whatever the world size: a run resumed by another number of processes
    continues from its `position` in the same order."""

    def __init__(self, size: int, batch_size: int, seed: int, world: World) -> None:
        self.rank, self.world_size = world.rank, world.size
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.total = batch_size * self.world_size  # samples per batch of all ranks together
        self.per_epoch = size // self.total
        if self.per_epoch == 0:
            raise ValueError(f"{size} samples cannot fill one batch of {batch_size} on {self.world_size} process(es)")

    def position(self, batch: int, start: Position = (0, 0)) -> Position:
        """Where the `batch`-th batch after `start` begins."""
        epoch, drawn = start
        left = (self.size - drawn) // self.total  # whole batches left in start's epoch
        if batch < left:
            return epoch, drawn + batch * self.total
        later, index = divmod(batch - left, self.per_epoch)
        return epoch + 1 + later, index * self.total

    def epochs_from(self, start: Position) -> Iterator[tuple[int, list[list[int]]]]:
        """(epoch, its remaining index batches) from `start` on, forever."""
        epoch, drawn = start
        while True:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 100003 + epoch))
            mine = order[drawn + self.rank :: self.world_size].tolist()
            batches = (self.size - drawn) // self.total
            yield epoch, [mine[b * self.batch_size : (b + 1) * self.batch_size] for b in range(batches)]
            epoch, drawn = epoch + 1, 0

    def keys_from(self, stream: int, start: Position) -> Iterator[list[tuple[int, int, int]]]:
        """The (stream, epoch, index) keys of each batch from `start` on."""
        for epoch, batches in self.epochs_from(start):
            for indices in batches:
                yield [(stream, epoch, index) for index in indices]


class LengthBuckets(EpochBatches):
    """EpochBatches whose batches each hold samples of similar `lengths` (UNITER's token buckets, at a
    fixed batch size). Each epoch's permutation (its whole batches' samples) is cut into pools of
    POOL_BATCHES batches of all ranks; a pool is sorted by length (ties in permutation order) and
    cut into batches, and the epoch's batches are then shuffled. All of it follows from (seed, epoch),
    so positions, resuming and the ranks' turns are EpochBatches'; a batch of all ranks holds
    neighbours in length, so each rank's share of it does too."""

    POOL_BATCHES = 64

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, world: World) -> None:
        super().__init__(len(lengths), batch_size, seed, world)
        self.lengths = np.asarray(lengths)

    def epochs_from(self, start: Position) -> Iterator[tuple[int, list[list[int]]]]:
        epoch, drawn = start
        while True:
            generator = torch.Generator().manual_seed(self.seed * 100003 + epoch)
            order = torch.randperm(self.size, generator=generator).numpy()[: self.per_epoch * self.total]
            pool = self.total * self.POOL_BATCHES
            batches = []
            for first in range(0, len(order), pool):
                sorted_pool = order[first : first + pool][np.argsort(self.lengths[order[first : first + pool]],
                                                                      kind="stable")]
                batches += [sorted_pool[b : b + self.total] for b in range(0, len(sorted_pool), self.total)]
            shuffled = torch.randperm(len(batches), generator=generator).tolist()
            yield epoch, [batches[b][self.rank :: self.world_size].tolist() for b in shuffled[drawn // self.total :]]
            epoch, drawn = epoch + 1, 0


class Streams(Dataset):
    """The samples of several datasets by (stream, epoch, index); each dataset draws a sample's
    random choices from (seed, epoch, index), so a sample is the same in any worker."""

    def __init__(self, datasets: Sequence[Dataset]) -> None:
        self.datasets = list(datasets)

    def __getitem__(self, key: tuple[int, int, int]):
        stream, epoch, index = key
        dataset = self.datasets[stream]
        dataset.set_epoch(epoch)
        return dataset[index]


@dataclass
class Batch:
    """A collated micro-batch (None when every sample was damaged) and its damaged samples' markers."""

    inputs: dict | None
    damaged: list[DamagedSample]
    usable: int  # samples collated
    with_images: int  # samples that read the store (text-only ones do not), damaged ones included
    samples: list[Sample] | None = None  # evaluation: the collated samples (ids, targets), without features
    tokens: int = 0  # the sequences' elements, padding left out
    pixels: dict[str, list] | None = None  # on the device: the PIXELS entries, which stay on the host

    def pin_memory(self) -> Batch:
        """Called by the DataLoader's pinning thread: tensors into page-locked memory, so that the
        copy to the GPU is asynchronous."""
        if self.inputs is not None:
            self.inputs = {k: pinned(v) for k, v in self.inputs.items()}
        return self

    def __reduce__(self):
        """Pickled (leaving a DataLoader worker) with its tensors in one block (train/data/packing.py)."""
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        if self.inputs is not None:
            values["inputs"] = packed(self.inputs)
        return _received_batch, (values,)


def _received_batch(values: dict) -> Batch:
    if values["inputs"] is not None:
        values["inputs"] = unpacked(*values["inputs"])
    return Batch(**values)


class Collate:
    """Samples → Batch, in the DataLoader's workers (a class: workers may be spawned, not forked).
    `keep_samples`: evaluation's, whose evaluators read each sample's id and targets. Encoded features
    (a q8 store's codes) are decoded on the device, or here with `decode_on_host`."""

    def __init__(self, pad_token_id: int, keep_samples: bool = False, decode_on_host: bool = False,
                 length_multiple: int = 1) -> None:
        self.pad_token_id, self.keep_samples, self.decode_on_host = pad_token_id, keep_samples, decode_on_host
        self.length_multiple = length_multiple

    def __call__(self, samples: list) -> Batch:
        damaged = [s for s in samples if isinstance(s, DamagedSample)]
        usable = [s for s in samples if not isinstance(s, DamagedSample)]
        text_only = sum(1 for s in usable if isinstance(s, Sample) and s.regions is None)
        inputs = collate(usable, self.pad_token_id, self.length_multiple) if usable else None
        if inputs is not None and self.decode_on_host:
            inputs = decoded_on_host(inputs)
        kept = [replace(s, regions=None, image=None) if isinstance(s, Sample) else s for s in usable] \
            if self.keep_samples else None
        return Batch(inputs, damaged, len(usable), len(samples) - text_only, kept,
                     real_elements(inputs) if inputs is not None else 0)


def real_elements(inputs: dict) -> int:
    """The elements of a collated batch's sequences that are no padding: text, RoIs, [END]. The
    RoIs of a sample count once for each of its sequences (a multiple choice's candidates)."""
    text = inputs["text_mask"]
    sequences = text.shape[:-1].numel()
    elements = int(text.sum()) + sequences
    if "box_mask" in inputs:
        elements += int(inputs["box_mask"].sum()) * sequences // len(inputs["box_mask"])
    return elements


@dataclass
class StageStreams:
    """A stage's sample streams (the task's dataset first) with their orders, and where in each order
    the stage's micro-batch `batch` begins."""

    streams: list[tuple[Dataset, EpochBatches]]
    batch: int
    starts: list[Position]

    @classmethod
    def at(cls, streams: list[tuple[Dataset, EpochBatches]], batch: int,
           starts: Sequence[Sequence[int]] | None = None) -> StageStreams:
        """From micro-batch `batch`; at `starts` (a checkpoint's `positions`), or else where this
        world's `batch`-th batch begins."""
        if starts is None:
            return cls(streams, batch, [order.position(batch) for _, order in streams])
        return cls(streams, batch, [(int(epoch), int(drawn)) for epoch, drawn in starts])

    def positions(self, batch: int) -> list[list[int]]:
        """Where each stream's micro-batch `batch` (of the stage) begins, for a checkpoint."""
        return [list(order.position(batch - self.batch, start)) for (_, order), start in zip(self.streams, self.starts)]

    def batches(self, workers: int, pad_token_id: int, device: torch.device, prefetch: bool,
                decode_on_device: bool = True, length_multiple: int = 1) -> Iterator[Batch]:
        """`collated` batches with their tensors on `device` (with `prefetch` on CUDA, each copied there
        while the step before computes); encoded features decoded there unless not `decode_on_device`."""
        collated = self.collated(workers, pad_token_id, device.type == "cuda", not decode_on_device, length_multiple)
        return on_device(collated, device, ahead=prefetch)

    def collated(self, workers: int, pad_token_id: int, pin_memory: bool,
                 decode_on_host: bool = False, length_multiple: int = 1) -> Iterator[Batch]:
        """Micro-batches from the stage's `batch`-th on, each one batch of every stream, forever, as
        the workers collate them (text and RoIs padded to a `length_multiple`); its workers live as
        long as the iterator (the whole stage)."""
        keys = [order.keys_from(stream, start) for stream, ((_, order), start) in enumerate(zip(self.streams, self.starts))]
        sampler = (sum((next(stream_keys) for stream_keys in keys), []) for _ in iter(int, 1))
        # A generator of its own: the DataLoader would otherwise draw its workers' base seed from the
        # global RNG, which would shift dropout after a resume.
        return spared_from_stops(DataLoader(Streams([dataset for dataset, _ in self.streams]), batch_sampler=sampler,
                                            collate_fn=Collate(pad_token_id, decode_on_host=decode_on_host,
                                                               length_multiple=length_multiple),
                                            num_workers=workers, pin_memory=pin_memory,
                                            generator=torch.Generator().manual_seed(self.batch)))


def evaluation_batches(dataset: Dataset, batch_size: int, workers: int, pad_token_id: int,
                       pin_memory: bool) -> Iterator[Batch]:
    return spared_from_stops(DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory,
                                        collate_fn=Collate(pad_token_id, keep_samples=True)))
