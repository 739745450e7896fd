"""A stage's training curves: a JSON line per optimiser step and one for its evaluation in the run
folder's metrics file, and the same scalars, with each logging interval's speed and memory, in every
tracking backend the run config's `tracking:` switches on (train.engine.tracking: TensorBoard by default).

A stage that starts at step S (from a checkpoint, or at 0 after an interruption without one)
first drops what an interrupted attempt logged past S from the metrics file, so every step is logged
there exactly once: its metrics lines (and evaluation line) go. TensorBoard purges its own events past
S; W&B and MLflow keep them, and take the repeated steps' values again.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from train.engine.config import TrackingConfig
from train.engine.run_folder import RunFolder, StageFolder
from train.engine.stage_progress import Mark
from train.engine.tracking import TrackedStage, open_trackers
from vlbert.utils.atomic import write_atomically, writing
from vlbert.utils.paths import checked


class StageLog:
    def __init__(self, run: RunFolder, folder: StageFolder, stage: str, start: int, tracking: TrackingConfig,
                 hyperparameters: dict[str, Any]) -> None:
        """`stage`: the stage's name; `start`: the step it starts from; `hyperparameters`: the run config."""
        self.stage = stage
        self.path = path = run.metrics_file
        _drop_entries_after(path, stage, start)
        with ExitStack() as opened:
            self.metrics = checked(path).open("a")
            opened.callback(self._close_metrics)
            self.trackers = open_trackers(TrackedStage(run, folder, stage, start, hyperparameters, tracking), opened)
            self.closing = opened.pop_all()  # the block closes them only where one failed to open

    def step(self, step: int, lr: float, losses: dict[str, float], damaged_skipped: int) -> None:
        """`losses`: the step's losses, and its gradient norm before clipping where it clips."""
        skipped = {"damaged_skipped": damaged_skipped} if damaged_skipped else {}
        self._write({"stage": self.stage, "step": step, "lr": lr, **losses, **skipped})
        self._scalars({**losses, "lr": lr}, step)

    def interval(self, start: Mark, end: Mark, world_size: int, device: torch.device) -> None:
        """The logging interval between two marks of the stage's progress: its samples/s (every rank's),
        the share of its time rank 0 waited for batches, and the device's peak memory so far (CUDA)."""
        seconds = end.seconds - start.seconds
        if seconds <= 0:
            return
        figures = {"samples_per_s": (end.samples - start.samples) * world_size / seconds,
                   "data_wait_share": (end.data_wait - start.data_wait) / seconds}
        if device.type == "cuda":  # the caching allocator's count: no wait for the device
            figures["peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        self._scalars(figures, end.step)

    def evaluation(self, result: dict, step: int) -> None:
        self._write({"stage": self.stage, "eval": result})
        self._scalars({f"eval_{result['metric']}": result["value"]}, step)

    def _write(self, record: dict) -> None:
        with writing(self.path):
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()

    def _scalars(self, values: dict[str, float], step: int) -> None:
        tagged = {f"{self.stage}/{name}": value for name, value in values.items()}
        for tracker in self.trackers:
            tracker.scalars(tagged, step)

    def _close_metrics(self) -> None:
        with writing(self.path):
            self.metrics.close()

    def __enter__(self) -> StageLog:
        return self

    def __exit__(self, *exc) -> None:
        self.closing.__exit__(*exc)  # the trackers hear whether the stage failed


class MutedStageLog:
    """The log of processes other than rank 0: rank 0 logs for the run."""

    def step(self, step: int, lr: float, losses: dict[str, float], damaged_skipped: int) -> None:
        pass

    def interval(self, start: Mark, end: Mark, world_size: int, device: torch.device) -> None:
        pass

    def evaluation(self, result: dict, step: int) -> None:
        pass

    def __enter__(self) -> MutedStageLog:
        return self

    def __exit__(self, *exc) -> None:
        pass


def _drop_entries_after(path: Path, stage: str, start: int) -> None:
    """Removes `stage`'s step lines past `start`, and its evaluation line, from the metrics file, and
    a last line that a full disk or a kill cut short."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.endswith("\n") and not _stale(json.loads(line), stage, start)]
    if len(kept) < len(lines):
        write_atomically(path, "".join(kept))


def _stale(record: dict, stage: str, start: int) -> bool:
    return record.get("stage") == stage and ("eval" in record or record.get("step", 0) > start)
