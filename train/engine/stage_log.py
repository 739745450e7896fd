"""A stage's training curves: a JSON line per optimiser step and one for its evaluation in the run
folder's metrics file, TensorBoard scalars in the stage's TensorBoard folder (`RunFolder`).

A stage that starts at step S (from a checkpoint, or at 0 after an interruption without one)
first drops what an interrupted attempt logged past S, so every step is logged exactly once: its
metrics lines (and evaluation line) go, and its TensorBoard events are purged by opening
the writer with purge_step=S+1. TensorBoard purges per log directory, hence one per stage.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from extract.atomic import write_atomically, writing
from extract.paths import checked
from train.engine.run_folder import RunFolder, StageFolder


class StageLog:
    def __init__(self, run: RunFolder, folder: StageFolder, stage: str, start: int) -> None:
        """`stage`: the stage's name; `start`: the step it starts from."""
        self.stage = stage
        self.path = path = run.metrics_file
        _drop_entries_after(path, stage, start)
        self.board_folder = board = run.tensorboard(folder)
        self.board = SummaryWriter(str(checked(board)), purge_step=start + 1 if board.exists() else None)
        self.metrics = checked(path).open("a")

    def step(self, step: int, lr: float, losses: dict[str, float], damaged_skipped: int) -> None:
        skipped = {"damaged_skipped": damaged_skipped} if damaged_skipped else {}
        self._write({"stage": self.stage, "step": step, "lr": lr, **losses, **skipped})
        for name, value in losses.items():
            self._scalar(f"{self.stage}/{name}", value, step)

    def evaluation(self, result: dict, step: int) -> None:
        self._write({"stage": self.stage, "eval": result})
        self._scalar(f"{self.stage}/eval_{result['metric']}", result["value"], step)

    def _write(self, record: dict) -> None:
        with writing(self.path):
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()

    def _scalar(self, name: str, value: float, step: int) -> None:
        """A TensorBoard scalar; its writer thread's errors (a full disk) come up here, or at close."""
        with writing(self.board_folder):
            self.board.add_scalar(name, value, step)

    def close(self) -> None:
        try:
            with writing(self.path):
                self.metrics.close()
        finally:
            with writing(self.board_folder):
                self.board.close()

    def __enter__(self) -> StageLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MutedStageLog:
    """The log of processes other than rank 0: rank 0 logs for the run."""

    def step(self, step: int, lr: float, losses: dict[str, float], damaged_skipped: int) -> None:
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
