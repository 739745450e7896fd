"""A speed path is one record of SPEED_PATHS (train/engine/speed.py): a toy one, registered alone with
nothing else edited, is recorded in run.json after the others and applies to every optimiser step
where its setting is on; off, it is recorded and changes nothing."""

from dataclasses import replace

import pytest
import torch

from tests.helpers.worlds import copy_world, run_config
from train.engine.config import StageConfig
from train.engine.distributed import World
from train.engine.run_folder import RunFolder
from train.engine.speed import SPEED_PATHS, SpeedPath, StageSpeed
from train.engine.trainer import Trainer

VQA = StageConfig("vqa", "vqa", steps=3, batch_size=2, base_lr=5e-4, num_workers=0, log_every=1)
RECORDED = ["workers", "optimizer_kernel", "prefetch", "compile", "length_buckets", "log_every", "features_sent_as",
            "skip_unread_pooler", "fused_encoder_layers"]


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("toy-speed"))


def counting_path(calls: list, setting) -> SpeedPath:
    """A toy speed path of `setting` (stage, device, world, feature dtype → its value) that notes its
    value in `calls` each time a step computes its losses through it."""
    def counted(value, losses):
        def step(inputs):
            calls.append(value)
            return losses(inputs)
        return step
    return SpeedPath("toy", setting, step=counted)


def test_a_registered_speed_path_is_recorded_in_run_json_and_applied_to_each_step(world, monkeypatch):
    calls = []
    monkeypatch.setitem(SPEED_PATHS, "toy", counting_path(calls, lambda stage, *_: f"every {stage.log_every}"))
    Trainer(run_config(world, "toy", [VQA])).fit()
    speed = RunFolder(world / "toy").speed()["vqa"]
    assert list(speed) == [*RECORDED, "toy"] and speed["toy"] == "every 1"
    assert calls == ["every 1"] * VQA.steps


def test_a_speed_path_set_off_is_recorded_and_changes_nothing(monkeypatch):
    calls = []
    monkeypatch.setitem(SPEED_PATHS, "toy", counting_path(calls, lambda *_: False))
    speed = StageSpeed.on(VQA, torch.device("cpu"), World(), "float32")
    losses = lambda inputs: {"loss": torch.tensor(1.0)}  # noqa: E731
    assert speed.record()["toy"] is False and speed.step(losses) is losses and calls == []


def test_the_padding_of_the_paths_that_are_on_is_their_least_common_multiple(monkeypatch):
    monkeypatch.setitem(SPEED_PATHS, "toy", SpeedPath("toy", lambda *_: True, batch_length_multiple=3))
    alone = StageSpeed.on(VQA, torch.device("cpu"), World(), "float32")
    compiled = StageSpeed.on(replace(VQA, compile=True), torch.device("cpu"), World(), "float32")
    assert alone.batch_length_multiple == 3 and compiled.batch_length_multiple == 24
