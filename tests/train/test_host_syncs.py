"""No host sync inside a training step (docs/training.md, "Training fast"): the optimiser steps of
pre-training, VQA and referring expressions read no tensor value on the host, so that on a GPU the
host queues the next step while the device computes; the losses come to the host at the logging
interval only."""

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.host_reads import HostReads
from tests.helpers.models import NO_DROPOUT
from tests.helpers.worlds import copy_world, run_config
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from train.engine.stage_progress import StageProgress
from train.engine.trainer import Trainer
from train.tasks.pretrain import PretrainOptions
from vlbert import losses
from vlbert.modeling import VLBertForPreTraining

STAGES = {
    "pretrain": StageConfig("pretrain", "pretrain", steps=2, batch_size=2, num_workers=0, log_every=2),
    # masked RoIs by feature (the model replaces their appearance; "pixel" reads the cached variants), and
    # the sentence-image relationship head
    "pretrain-feature": StageConfig("pretrain", "pretrain", steps=2, batch_size=2, num_workers=0, log_every=2,
                                    options=PretrainOptions(roi_masking="feature", relationship=True)),
    "vqa": StageConfig("vqa", "vqa", steps=2, batch_size=2, num_workers=0, log_every=2),
    "refexp": StageConfig("refexp", "refexp", steps=2, batch_size=2, num_workers=0, log_every=2),
}


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("syncs"))


def host_reads_in_steps(world: Path, stage: StageConfig, monkeypatch, out: str) -> list[tuple[str, str]]:
    """The host reads of the stage's optimiser steps (forward, backward, clipping, optimiser), the
    making of their batches left out."""
    guard = HostReads()
    step, next_batch = Trainer._optimiser_step, StageProgress.next_batch

    def watched_step(self, *args, **kwargs):
        with guard.counting():
            return step(self, *args, **kwargs)

    def unwatched_batch(self, batches):
        with guard.counting(False):
            return next_batch(self, batches)

    monkeypatch.setattr(Trainer, "_optimiser_step", watched_step)
    monkeypatch.setattr(StageProgress, "next_batch", unwatched_batch)
    trainer = Trainer(run_config(world, out, [stage]))
    with guard.installed(monkeypatch):
        trainer.fit()
    return guard.reads


@pytest.mark.parametrize("name", list(STAGES))
def test_a_training_step_reads_nothing_on_the_host(world, monkeypatch, name):
    reads = host_reads_in_steps(world, STAGES[name], monkeypatch, name)
    assert Counter(reads) == Counter()


def test_the_guard_sees_host_reads(world, monkeypatch):
    """The guard is no check that cannot fail: a loss read every step is seen."""
    original = Trainer._optimiser_step

    def reading_step(self, *args, **kwargs):
        losses = original(self, *args, **kwargs)
        losses["loss"].item()
        bool(losses["loss"] > 0)
        losses["loss"].tolist()
        return losses

    monkeypatch.setattr(Trainer, "_optimiser_step", reading_step)
    reads = host_reads_in_steps(world, STAGES["vqa"], monkeypatch, "reading")
    assert [what for what, _ in reads] == ["_local_scalar_dense", "_local_scalar_dense", "Tensor.tolist"] * 2


def todays_soft_cross_entropy(logits, targets):
    """soft_cross_entropy before the steps lost their host syncs: the predicted rows picked by a mask."""
    logits, targets = logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1, targets.shape[-1]).float()
    predicted = (targets.sum(-1) - 1.0).abs() < 0.1
    if not predicted.any():
        return logits.sum() * 0.0
    return -(targets[predicted] * torch.log_softmax(logits[predicted], -1)).sum(-1).mean()


def todays_grounding_loss(logits, labels, box_mask):
    real = box_mask.bool()
    return F.binary_cross_entropy_with_logits(logits[real].float(), labels[real].float())


def logged_losses(world: Path, stage: StageConfig, out: str) -> list[dict[str, float]]:
    run = run_config(world, out, [stage])
    run.model.update(NO_DROPOUT)
    Trainer(run).fit()
    return [{k: v for k, v in record.items() if k.endswith("loss")} for record in RunFolder(world / out).metrics()
            if "step" in record]


@pytest.mark.parametrize("name", ["pretrain", "pretrain-feature", "refexp"])
def test_steps_without_host_syncs_log_the_losses_of_steps_with_them(world, monkeypatch, name):
    """20 steps each: the losses as the masked words, masked RoIs and real RoIs were picked before
    (by boolean masks, and the masked words found on the device), against today's; VQA's step had
    no host sync to remove."""
    stage = replace(STAGES[name], steps=20, log_every=20)
    today = logged_losses(world, stage, f"{name}-today")
    forward = VLBertForPreTraining.forward
    monkeypatch.setattr(VLBertForPreTraining, "forward",
                        lambda self, mlm_positions=None, **inputs: forward(self, **inputs))
    monkeypatch.setattr(losses, "soft_cross_entropy", todays_soft_cross_entropy)
    monkeypatch.setattr(losses, "grounding_loss", todays_grounding_loss)
    before = logged_losses(world, stage, f"{name}-before")
    assert len(today) == 20 and today[0].keys() == before[0].keys()
    for step_today, step_before in zip(today, before):
        assert step_today == pytest.approx(step_before, rel=1e-5, abs=1e-7)
