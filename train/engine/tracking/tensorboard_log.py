"""TensorBoard: a log directory per stage (`RunFolder.tensorboard`), on unless `tracking.tensorboard: false`.

A stage that starts at step S purges what an interrupted attempt logged past S by opening its writer
with purge_step=S+1; TensorBoard purges per log directory, hence one per stage."""

from __future__ import annotations

import json

from train.engine.tracking.base import TrackedStage, Tracker, register
from vlbert.utils.atomic import writing
from vlbert.utils.paths import checked


@register("tensorboard")
class TensorBoardTracker(Tracker):
    package = "tensorboard"

    def __init__(self, target: TrackedStage) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = board = target.run.tensorboard(target.folder)
        attempted = board.exists()
        self.board = SummaryWriter(str(checked(board)), purge_step=target.start + 1 if attempted else None)
        if not attempted:  # once per stage folder: a resumed attempt has them already
            shown = json.dumps(target.hyperparameters, indent=1)
            with writing(self.folder):  # indented: a code block in TensorBoard's markdown
                self.board.add_text("hyperparameters", "\n".join("    " + line for line in shown.splitlines()), 0)

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Its writer thread's errors (a full disk) come up here, or at close."""
        with writing(self.folder):
            for tag, value in values.items():
                self.board.add_scalar(tag, value, step)

    def close(self, failed: bool) -> None:
        with writing(self.folder):
            self.board.close()
