"""A stage's counters (samples, tokens, time waiting for data, damaged records) and its steady rate.

The stage's wall time holds its start-up, its first batches, warm-up and compilation. The steady
figures leave those out: they count from the first point at which the host waited for the device
(the end of the first logging interval, when the losses come to the host) to the last, so they
time what the device finished, not what the host had queued.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from train.engine.batches import Batch
from train.engine.damaged import DamagedRecords


@dataclass(frozen=True)
class Mark:
    """The counters at a point where the host had waited for the device."""

    step: int
    seconds: float
    samples: int
    tokens: int
    data_wait: float


@dataclass
class StageProgress:
    """Counters a stage carries over a resume in its checkpoints (the marks start afresh)."""

    started: float  # time.perf_counter() at which the stage would have started, had it never stopped
    samples: int
    damaged: DamagedRecords
    data_wait: float = 0.0  # seconds the training process waited for batches
    tokens: int = 0  # sequence elements trained on, padding left out
    marks: list[Mark] = field(default_factory=list)

    @classmethod
    def from_saved(cls, saved: dict, skip_damaged: bool) -> StageProgress:
        """With the counters a checkpoint saved (`saved()`; {} for a stage starting afresh)."""
        return cls(time.perf_counter() - saved.get("seconds", 0.0), saved.get("samples", 0),
                   DamagedRecords.from_saved(skip_damaged, saved), saved.get("data_wait_s", 0.0),
                   saved.get("tokens", 0))

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def saved(self) -> dict:
        return {"seconds": self.seconds, "samples": self.samples, "data_wait_s": self.data_wait,
                "tokens": self.tokens, **self.damaged.saved()}

    def next_batch(self, batches: Iterator[Batch]) -> Batch:
        waited = time.perf_counter()
        with torch.profiler.record_function("data wait"):
            batch = next(batches)
        self.data_wait += time.perf_counter() - waited
        self.samples += batch.usable
        self.tokens += batch.tokens
        return batch

    def now(self, step: int) -> Mark:
        """The counters now, at optimiser step `step`."""
        return Mark(step, self.seconds, self.samples, self.tokens, self.data_wait)

    def mark(self, step: int) -> None:
        """Call where the host has just waited for the device's work up to `step`."""
        self.marks.append(self.now(step))

    def steady(self, world_size: int) -> dict[str, float | int]:
        """The steady figures (all ranks' samples and tokens, rank 0's waiting), between the first
        and the last mark; none with fewer than two marks."""
        if len(self.marks) < 2 or self.marks[-1].seconds <= self.marks[0].seconds:
            return {}
        first, last = self.marks[0], self.marks[-1]
        seconds = last.seconds - first.seconds
        return {"steady_steps": last.step - first.step,
                "steady_samples_per_s": round((last.samples - first.samples) * world_size / seconds, 2),
                "steady_tokens_per_s": round((last.tokens - first.tokens) * world_size / seconds, 1),
                "steady_data_wait_share": round((last.data_wait - first.data_wait) / seconds, 4)}
