"""The speed paths on a CUDA device: batches prefetched on a side stream equal those copied in the
step's stream, a training step never makes the host wait for the device, and a compiled step (also
replayed as CUDA graphs) trains as the eager one. Skipped where torch sees no CUDA device."""

from dataclasses import replace

import pytest
import torch

from tests.helpers.models import NO_DROPOUT
from tests.helpers.worlds import copy_world, run_config
from train.data.annotations import AnnotationFile
from train.data.regions import RegionBank
from train.engine.batches import EpochBatches, StageStreams
from train.engine.config import StageConfig
from train.engine.distributed import World
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from train.tasks import TASKS
from train.tasks.base import TaskData
from vlbert.tokenization import load_tokenizer

pytestmark = pytest.mark.cuda

VQA = StageConfig("vqa", "vqa", steps=6, batch_size=4, base_lr=5e-4, num_workers=0, log_every=6)
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("speed-cuda"))


def test_prefetched_batches_equal_batches_copied_in_the_step_stream(world):
    tokenizer = load_tokenizer(world / "vocab")
    bank = RegionBank(str(world / "cache"))
    data = TaskData(bank, tokenizer, 48, AnnotationFile(world / "world" / "train.jsonl", keep=bank.__contains__))
    dataset = TASKS["vqa"].dataset(data, VQA.options, data.train, 7, True)
    streams = [(dataset, EpochBatches(len(dataset), 3, 7, World()))]
    ahead = StageStreams.at(streams, 0).batches(2, tokenizer.pad_token_id, CUDA, prefetch=True)
    in_step = StageStreams.at(streams, 0).batches(0, tokenizer.pad_token_id, CUDA, prefetch=False)
    for _ in range(6):
        one, other = next(ahead), next(in_step)
        assert one.inputs.keys() == other.inputs.keys() and one.pixels == other.pixels
        for name, value in one.inputs.items():
            assert value.device.type == "cuda" and torch.equal(value, other.inputs[name]), name
        assert one.inputs["appearance"].dtype == torch.float32  # widened on the device


def test_a_training_step_never_waits_for_the_device(world):
    """Steps 2 to 5 (between logging points) under CUDA's sync debug mode "error": any host sync
    (a tensor's value read, a blocking copy) raises; the losses still come to the host at step 6."""
    run = run_config(world, "no-syncs", [replace(VQA, precision="bf16" if torch.cuda.is_bf16_supported() else "fp32")],
                     device="cuda")
    trainer = Trainer(run)
    original, calls = trainer._optimiser_step, {"n": 0}

    def watched(*args, **kwargs):
        calls["n"] += 1
        if not 2 <= calls["n"] <= 5:
            return original(*args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return original(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    trainer._optimiser_step = watched
    trainer.fit()
    assert calls["n"] == 6 and len([r for r in RunFolder(world / "no-syncs").metrics() if "step" in r]) == 6
    assert RunFolder(world / "no-syncs").speed()["vqa"]["optimizer_kernel"] == "fused"


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_stage_trains_like_the_eager_one(world, mode):
    """torch.compile's code for the step, and in reduce-overhead mode its forward and backward replayed
    as CUDA graphs."""
    losses = {}
    for compiled in (False, True):
        out = f"compiled-{mode}-{compiled}"
        stage = replace(VQA, compile=True, compile_mode=mode) if compiled else VQA
        run = run_config(world, out, [stage], device="cuda")
        run.model.update(NO_DROPOUT)
        Trainer(run).fit()
        losses[compiled] = [r["loss"] for r in RunFolder(world / out).metrics() if "step" in r]
    assert losses[True] == pytest.approx(losses[False], rel=1e-3)
