"""Run by test_world_size_resume.py under torchrun or plain python (`--module
tests.helpers.resumable_run ROOT OUT STOP`): a retrieval stage in OUT, resumed from its latest
checkpoint if it has one; with STOP > 0, interrupted before the STOP-th optimiser step."""

import sys
from pathlib import Path

import torch

from tests.helpers.models import NO_DROPOUT
from tests.helpers.worlds import run_config
from train.engine.config import StageConfig
from train.engine.trainer import Trainer

STAGE = StageConfig("retrieval", "retrieval", steps=4, batch_size=2, checkpoint_every=2, warmup_steps=2,
                    base_lr=1e-3, num_workers=0)


def main(root: str, out: str, stop: int) -> None:
    torch.set_num_threads(1)
    # One item an evaluation batch: an item's score then does not depend on which rank's slice
    # batches it with whom (padding to another length rounds differently, which flips near-ties).
    run = run_config(Path(root), out, [STAGE], eval_batch_size=1)
    run.model.update(NO_DROPOUT)
    if stop:
        original, calls = torch.optim.AdamW.step, {"n": 0}

        def step(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] == stop:
                sys.exit(3)
            return original(self, *args, **kwargs)

        torch.optim.AdamW.step = step
    Trainer(run, log=print).fit(resume=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
