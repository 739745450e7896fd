"""A NaN or infinite loss stops the stage in one line naming the run folder, the stage and the step;
the last good checkpoint stays, and nothing of the diverged model is saved (no checkpoint, no final
model, no evaluation, no metrics line)."""

from dataclasses import replace

import pytest
import torch
import yaml
from click.testing import CliRunner
from safetensors.torch import load_file

from pipelines.cli import main
from tests.helpers.worlds import copy_world, run_config
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import NonFiniteLossError, Trainer
from train.tasks import TASKS

VQA = StageConfig("vqa", "vqa", steps=4, batch_size=2, base_lr=5e-4, checkpoint_every=1)


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("nonfinite"))


def test_a_diverging_learning_rate_stops_the_stage_in_one_line_keeping_the_last_checkpoint(world, tmp_path):
    """base_lr 1e30 moves every weight by about 1e30 × the total batch in the first step: the second
    step's loss is no longer finite."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(world, "diverged", [replace(VQA, base_lr=1e30)]).to_dict()))
    result = CliRunner().invoke(main, ["train", str(config)])
    folder = RunFolder(world / "diverged")
    stage = folder.stage(0, "vqa")
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()[-1:]
    assert line.startswith(f"Error: {folder.root}: stage vqa: the loss is ") and " at step 2; training stopped, " \
        "saving nothing of it (its last checkpoint, checkpoint-1, is kept)" in line, result.output
    assert "Traceback" not in result.output
    assert [path.name for path in stage.checkpoints()] == ["checkpoint-1"] and not stage.done
    assert not stage.evaluation_file.exists() and not stage.temporaries()
    assert all(torch.isfinite(t).all() for t in load_file(stage.checkpoint(1) / "model.safetensors").values())
    assert [record["step"] for record in folder.metrics()] == [1]


def test_a_nan_before_any_checkpoint_saves_nothing(world, monkeypatch):
    vqa = TASKS["vqa"]

    def nan_loss(model, inputs, options):
        losses = vqa.loss(model, inputs, options)
        return {**losses, "loss": losses["loss"] * float("nan")}

    monkeypatch.setitem(TASKS, "vqa", replace(vqa, loss=nan_loss))
    with pytest.raises(NonFiniteLossError) as stopped:
        Trainer(run_config(world, "nan", [VQA])).fit()
    folder = RunFolder(world / "nan")
    assert str(stopped.value) == (f"{folder.root}: stage vqa: the loss is nan at step 1; training stopped, saving "
                                  "nothing of it: a lower base_lr or clip_grad_norm may avoid it (a changed config "
                                  "needs --restart)")
    assert stopped.value.exit_status == 1
    assert folder.stage(0, "vqa").checkpoints() == [] and not folder.stage(0, "vqa").done
