"""Training on a CUDA device: a cached and an end-to-end stage, every precision, and an interrupt
and resume (the optimizer state must land on the GPU). Skipped where torch sees no CUDA device."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.models import NO_DROPOUT
from tests.helpers.worlds import copy_world, interrupt_optimiser_step, run_config
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer

pytestmark = pytest.mark.cuda

VQA = StageConfig("vqa", "vqa", steps=4, batch_size=4, base_lr=5e-4)


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("cuda-runs"))


def losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in RunFolder(out).metrics_file.read_text().splitlines()
            if '"step"' in line]


def final_state(out) -> dict[str, torch.Tensor]:
    return load_file(RunFolder(out).stage(0, "vqa").final / "model.safetensors")


def test_a_cached_stage_trains_on_cuda_as_on_the_cpu(world):
    """fp32 with TF32 off: the GPU's losses and weights follow the CPU's to float32 rounding."""
    for device in ("cpu", "cuda"):
        run = run_config(world, f"cached-{device}", [VQA], device=device)
        run.model.update(NO_DROPOUT)
        Trainer(run).fit()
    assert losses(world / "cached-cuda") == pytest.approx(losses(world / "cached-cpu"), rel=1e-3)
    cpu, cuda = final_state(world / "cached-cpu"), final_state(world / "cached-cuda")
    for name in cpu:
        assert torch.allclose(cpu[name], cuda[name], atol=1e-4, rtol=1e-3), name


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_every_precision_trains_on_cuda_and_is_recorded(world, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    out = world / f"precision-{precision}"
    result = Trainer(run_config(world, out.name, [replace(VQA, precision=precision)], device="cuda")).fit()[0]
    trained = losses(out)
    assert len(trained) == VQA.steps and all(torch.isfinite(torch.tensor(trained)))
    assert result["precision"] == precision
    assert json.loads(RunFolder(out).config_file.read_text())["stages"][0]["precision"] == precision


def test_auto_precision_is_bf16_on_a_gpu_with_native_bfloat16_and_recorded_as_resolved(world):
    resolved = "bf16" if torch.cuda.get_device_capability()[0] >= 8 else "fp32"
    out = world / "precision-auto"
    result = Trainer(run_config(world, out.name, [replace(VQA, precision="auto")], device="cuda")).fit()[0]
    assert result["precision"] == resolved and RunFolder(out).precisions() == {"vqa": resolved}
    assert all(torch.isfinite(torch.tensor(losses(out))))


def test_an_end_to_end_stage_trains_on_cuda(world):
    out = world / "end2end-cuda"
    result = Trainer(run_config(world, out.name, [replace(VQA, visual="end2end", steps=2)], device="cuda")).fit()[0]
    assert result["visual"] == "end2end" and len(losses(out)) == 2
    assert (RunFolder(out).stage(0, "vqa").final / "detector.safetensors").is_file()


def test_an_interrupted_stage_resumes_on_cuda(world, monkeypatch):
    """The optimizer state of a checkpoint loads onto the GPU (it used to stay on the CPU, and the
    first step after a resume failed), and the resumed stage logs what an uninterrupted one does."""
    stage = replace(VQA, steps=5, checkpoint_every=2, precision="fp32")
    straight = run_config(world, "straight-cuda", [stage], device="cuda")
    straight.model.update(NO_DROPOUT)
    Trainer(straight).fit()

    interrupt_optimiser_step(monkeypatch, call=4)
    resumed = run_config(world, "resumed-cuda", [stage], device="cuda")
    resumed.model.update(NO_DROPOUT)
    with pytest.raises(KeyboardInterrupt):
        Trainer(resumed).fit()
    monkeypatch.undo()
    messages = []
    Trainer(resumed, log=messages.append).fit(resume=True)
    assert any(f"resuming from {RunFolder(world / 'resumed-cuda').stage(0, 'vqa').checkpoint(2)}" in message for message in messages)
    assert losses(world / "resumed-cuda") == pytest.approx(losses(world / "straight-cuda"), rel=1e-4)
