"""A stage's batches: samples drawn in DataLoader workers, collated there, and handed to the device.

A stage reads one or more streams (the task's dataset, and its extra streams such as the text-only corpus),
each with its own seeded order (`EpochBatches`). One DataLoader serves them all for the whole
stage, so its workers start once: its sampler yields, per micro-batch, keys (stream, epoch, index),
and the workers make and collate those samples. Damaged records travel as markers beside the
collated batch, so the stage's damaged-record policy still runs in the training process.

Features stay in the store's float16 through the worker pipes and the pinned host buffer; they
are widened to float32 on the device (`train.data.collate.to_device`), which is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from train.data.collate import collate
from train.data.datasets import DamagedSample, Sample
from train.engine.distributed import World


class EpochBatches:
    """Index batches for one process: a seeded permutation per epoch, sliced per rank, drop-last."""

    def __init__(self, size: int, batch_size: int, seed: int, world: World) -> None:
        self.rank, self.world_size = world.rank, world.size
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.per_epoch = size // (batch_size * self.world_size)
        if self.per_epoch == 0:
            raise ValueError(f"{size} samples cannot fill one batch of {batch_size} on {self.world_size} process(es)")

    def epochs_from(self, batch: int) -> Iterator[tuple[int, list[list[int]]]]:
        """(epoch, its remaining index batches) from the stage's `batch`-th batch on, forever."""
        epoch, offset = divmod(batch, self.per_epoch)
        while True:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 100003 + epoch))
            mine = order[self.rank :: self.world_size].tolist()
            yield epoch, [mine[b * self.batch_size : (b + 1) * self.batch_size] for b in range(offset, self.per_epoch)]
            epoch, offset = epoch + 1, 0

    def keys_from(self, stream: int, batch: int) -> Iterator[list[tuple[int, int, int]]]:
        """The (stream, epoch, index) keys of each batch from the `batch`-th on."""
        for epoch, batches in self.epochs_from(batch):
            for indices in batches:
                yield [(stream, epoch, index) for index in indices]


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

    def pin_memory(self) -> Batch:
        """Called by the DataLoader's pinning thread: tensors into page-locked memory, so that the
        copy to the GPU is asynchronous."""
        if self.inputs is not None:
            self.inputs = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in self.inputs.items()}
        return self


class Collate:
    """Samples → Batch, in the DataLoader's workers (a class: workers may be spawned, not forked).
    `keep_samples`: evaluation's, whose evaluators read each sample's id and targets."""

    def __init__(self, pad_token_id: int, keep_samples: bool = False) -> None:
        self.pad_token_id, self.keep_samples = pad_token_id, keep_samples

    def __call__(self, samples: list) -> Batch:
        damaged = [s for s in samples if isinstance(s, DamagedSample)]
        usable = [s for s in samples if not isinstance(s, DamagedSample)]
        text_only = sum(1 for s in usable if isinstance(s, Sample) and s.regions is None)
        inputs = collate(usable, self.pad_token_id) if usable else None
        kept = [replace(s, regions=None, image=None) if isinstance(s, Sample) else s for s in usable] \
            if self.keep_samples else None
        return Batch(inputs, damaged, len(usable), len(samples) - text_only, kept)


def stage_batches(streams: Sequence[tuple[Dataset, EpochBatches]], batch: int, workers: int, pad_token_id: int,
                  pin_memory: bool) -> Iterator[Batch]:
    """Micro-batches from the stage's `batch`-th on, each one batch of every stream, forever; its
    workers live as long as the iterator (the whole stage)."""
    keys = [order.keys_from(stream, batch) for stream, (_, order) in enumerate(streams)]
    sampler = (sum((next(stream_keys) for stream_keys in keys), []) for _ in iter(int, 1))
    # A generator of its own: the DataLoader would otherwise draw its workers' base seed from the
    # global RNG, which would shift dropout after a resume.
    return iter(DataLoader(Streams([dataset for dataset, _ in streams]), batch_sampler=sampler,
                           collate_fn=Collate(pad_token_id), num_workers=workers, pin_memory=pin_memory,
                           generator=torch.Generator().manual_seed(batch)))


def evaluation_batches(dataset: Dataset, batch_size: int, workers: int, pad_token_id: int,
                       pin_memory: bool) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, collate_fn=Collate(pad_token_id, keep_samples=True),
                      num_workers=workers, pin_memory=pin_memory)
