"""Frozen batch norm folded once per state of its buffers: the numbers of the unfolded formula, and
no stale constants after a checkpoint load or a move to another dtype."""

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from extract import Detector
from extract.modeling.conv import conv2d
from extract.modeling.resnet import ConvNorm
from tests.helpers.detection import random_norm_state, trunk_input
from train.end2end import FROZEN_PREFIXES, EndToEndVisual


def unfolded_forward(self: ConvNorm, x: torch.Tensor, on_subgrids: bool = False) -> torch.Tensor:
    """ConvNorm as it was before folding: the norm's constants recomputed in every forward (the
    dilated res5 layout's convs only)."""
    assert not on_subgrids
    norm = self.norm
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    bias = norm.bias - norm.running_mean * scale
    return conv2d(self, x).mul_(scale.view(1, -1, 1, 1)).add_(bias.view(1, -1, 1, 1))


@pytest.fixture
def detector():
    torch.manual_seed(0)
    detector = Detector.build("tiny")
    detector.load_state_dict(random_norm_state(detector, seed=1), strict=False)
    return detector


def unfolded(module: torch.nn.Module, x: torch.Tensor, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as patch:
        patch.setattr(ConvNorm, "forward", unfolded_forward)
        return module(x)


def test_folded_trunk_is_bitwise_the_unfolded_formula(detector, monkeypatch):
    x = trunk_input()
    first, cached = detector.backbone(x), detector.backbone(x)
    reference = unfolded(detector.backbone, x, monkeypatch)
    assert torch.equal(first, reference) and torch.equal(cached, reference)


def test_folded_trunk_under_bf16_autocast_is_the_unfolded_formula(detector, monkeypatch):
    x = trunk_input()
    detector.backbone(x)  # constants folded outside autocast first: autocast must not reuse them blindly
    with torch.autocast("cpu", dtype=torch.bfloat16):
        folded = detector.backbone(x)
        reference = unfolded(detector.backbone, x, monkeypatch)
    assert folded.dtype == torch.bfloat16 and torch.equal(folded, reference)


@pytest.mark.parametrize("assign", [False, True])
def test_a_loaded_checkpoint_refreshes_the_folded_constants(detector, monkeypatch, assign):
    x = trunk_input()
    before = detector.backbone(x)
    detector.load_state_dict(random_norm_state(detector, seed=2), strict=False, assign=assign)
    after = detector.backbone(x)
    assert not torch.equal(after, before)
    assert torch.equal(after, unfolded(detector.backbone, x, monkeypatch))


def test_a_move_to_float64_refreshes_the_folded_constants(detector, monkeypatch):
    x = trunk_input()
    detector.backbone(x)
    detector.double()
    after = detector.backbone(x.double())
    assert after.dtype == torch.float64
    assert torch.equal(after, unfolded(detector.backbone, x.double(), monkeypatch))


def test_constants_folded_in_inference_mode_serve_a_later_forward_with_gradients(detector):
    x = trunk_input()
    with torch.inference_mode():
        detector.backbone(x)
    detector.backbone(x).sum().backward()
    assert detector.backbone.res3[0].conv1.weight.grad.abs().sum() > 0


def test_a_norm_made_in_inference_mode_is_folded_in_every_forward(monkeypatch):
    with torch.inference_mode():
        conv = ConvNorm(3, 4, 3, padding=1)
        x = torch.randn(1, 3, 8, 8)
        before = conv(x)
        conv.norm.running_var.fill_(4.0)  # inference tensors keep no version counter to see this by
        after = conv(x)
    assert not torch.equal(after, before) and torch.equal(after, unfolded_forward(conv, x))


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_a_folded_conv_runs_only_the_conv_and_the_in_place_scale_and_bias():
    conv = ConvNorm(3, 4, 3, padding=1)
    x = torch.randn(1, 3, 8, 8)
    conv(x)
    with CountOps() as counted:
        conv(x)
    assert counted.ops == Counter(mkldnn_convolution=1, mul_=1, add_=1)


def test_end_to_end_gradients_flow_to_the_trained_convs_as_before_folding(detector, monkeypatch):
    """res3-res5 get the gradients of the unfolded formula, bitwise; the norms hold buffers only."""
    visual = EndToEndVisual(detector, "unused")
    image = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    batch = dict(appearance=torch.zeros(1, 3, detector.cfg.feature_dim),
                 boxes=torch.tensor([[[0.0, 0.0, 128.0, 96.0], [10.0, 10.0, 60.0, 50.0], [40.0, 30.0, 120.0, 90.0]]]),
                 box_mask=torch.ones(1, 3, dtype=torch.bool), masked_regions=torch.tensor([[False, True, False]]),
                 images=[image], image_files=["unused.jpg"])

    def gradients() -> dict[str, torch.Tensor]:
        visual.zero_grad(set_to_none=True)
        visual(batch).pow(2).sum().backward()
        return {name: p.grad.clone() for name, p in visual.named_parameters() if p.grad is not None}

    folded = gradients()
    with monkeypatch.context() as patch:
        patch.setattr(ConvNorm, "forward", unfolded_forward)
        reference = gradients()
    assert folded.keys() == reference.keys()
    assert all(torch.equal(folded[name], reference[name]) for name in folded)
    assert not any(name.removeprefix("detector.").startswith(FROZEN_PREFIXES) for name in folded)
    for stage in ("backbone.res3.", "backbone.res4.", "roi_heads.res5."):
        assert any(name.startswith("detector." + stage) and folded[name].abs().sum() > 0 for name in folded), stage
    assert not any(".norm." in name for name, _ in visual.named_parameters())
    assert all(not b.requires_grad for name, b in visual.named_buffers() if ".norm." in name)
