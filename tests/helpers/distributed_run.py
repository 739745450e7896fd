"""Run by test_train.py under torchrun (`--module tests.helpers.distributed_run`): one training run
whose processes split each batch."""

import os
import sys
from pathlib import Path

import torch

from tests.helpers.models import NO_DROPOUT
from tests.helpers.worlds import run_config
from train.engine.config import StageConfig
from train.engine.trainer import Trainer


def main(root: str, out: str, batch_size: int, grad_accumulation: int) -> None:
    torch.set_num_threads(1)
    # base_lr is per sample of the total batch, so every variant steps with the same learning rate.
    stage = StageConfig("vqa", "vqa", steps=3, batch_size=batch_size, grad_accumulation=grad_accumulation,
                        base_lr=1e-3 * 4 / (batch_size * grad_accumulation * int(os.environ.get("WORLD_SIZE", 1))))
    run = run_config(Path(root), out, [stage])
    run.model.update(NO_DROPOUT)
    Trainer(run).fit()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
