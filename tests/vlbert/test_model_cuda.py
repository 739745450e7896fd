"""On CUDA: the MLM head on the labelled positions only, the folded-norm trunk against the CPU, the
end-to-end stage's one detector call per batch (its CUDA default) against one per image, and the fused
encoder layers against transformers'. float32 with TF32 off throughout but for the fused layers' bf16
case; skipped where torch sees no CUDA device (tests/conftest.py)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from tests.helpers.detection import random_norm_state, trunk_input
from tests.helpers.end2end import assert_batched_matches_per_image, assert_close_to_scale
from tests.helpers.end2end import make_batch as end2end_batch
from tests.helpers.models import make_batch as vlbert_batch
from tests.helpers.models import tiny

from extract import Detector
from train.end2end import EndToEndVisual
from vlbert import VLBertForPreTraining
from vlbert.utils.precision import precision

pytestmark = pytest.mark.cuda

CUDA = torch.device("cuda")


def on_cuda(batch: dict) -> dict:
    return {name: value.to(CUDA) if torch.is_tensor(value) else value for name, value in batch.items()}


def test_mlm_loss_from_the_labelled_positions_matches_every_positions_logits_on_cuda():
    torch.manual_seed(0)
    model = VLBertForPreTraining(tiny()).to(CUDA)
    batch = vlbert_batch(model.config)
    chosen = torch.rand(batch["input_ids"].shape, generator=torch.Generator().manual_seed(5)) < 0.3
    labels = batch["input_ids"].masked_fill(~chosen, -100).to(CUDA)
    batch, labelled = on_cuda(batch), labels != -100
    with precision("fp32").applied(CUDA):
        output = model(**batch, mlm_labels=labels)
        output.mlm_loss.backward()
        gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        every_position = model(**batch).mlm_logits
        reference = F.cross_entropy(every_position[labelled], labels[labelled])
        reference.backward()
    assert output.mlm_logits.shape == (int(labelled.sum()), model.config.vocab_size)
    assert_close_to_scale(output.mlm_logits, every_position[labelled], relative=1e-5)
    torch.testing.assert_close(output.mlm_loss, reference, rtol=1e-5, atol=1e-6)
    assert gradients.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert_close_to_scale(gradients[name], p.grad, relative=1e-4, name=name, absolute=1e-6)


def test_the_folded_norm_trunk_on_cuda_matches_the_cpu():
    """Constants folded on the CPU are folded again on the device after `.to(cuda)`."""
    torch.manual_seed(0)
    detector = Detector.build("tiny")
    detector.load_state_dict(random_norm_state(detector, seed=1), strict=False)
    x = trunk_input()
    with torch.no_grad():
        on_cpu = detector.backbone(x)
        detector.to(CUDA)
        with precision("fp32").applied(CUDA):
            on_device = detector.backbone(x.to(CUDA))
    assert all(t.is_cuda for t in detector.backbone.stem.conv1.folded_norm())
    assert_close_to_scale(on_device.cpu(), on_cpu, relative=1e-5)


def test_end_to_end_one_call_per_batch_matches_one_per_image_on_cuda():
    torch.manual_seed(0)
    detector = Detector.build("tiny", device=CUDA)
    batched_visual = EndToEndVisual(detector, ".")
    assert batched_visual.batches_images()  # the default on CUDA
    with precision("fp32").applied(CUDA):
        assert_batched_matches_per_image(detector, batched_visual, on_cuda(end2end_batch(detector.cfg.feature_dim)),
                                         relative=1e-4)


@pytest.mark.parametrize("arithmetic, relative", [("fp32", 1e-5), ("bf16", 2e-2)])
def test_fused_encoder_layers_on_cuda_match_transformers_layers(arithmetic, relative):
    """The fused query, key and value GEMM and SDPA on the device: the transformers layers' hidden states
    and gradients (fp32: TF32 off; bf16: autocast, to bf16 rounding)."""
    torch.manual_seed(0)
    model = VLBertForPreTraining(tiny()).to(CUDA)
    fused = copy.deepcopy(model)
    fused.use_encoder_layers("fused")
    batch = on_cuda(vlbert_batch(model.config))
    hidden, gradients = [], []
    for each in (model, fused):
        with precision(arithmetic).applied(CUDA):
            state = each.vlbert(**batch).last_hidden_state
            state.float().square().mean().backward()
        hidden.append(state.float())
        gradients.append(each.vlbert.embeddings.word_embeddings.weight.grad)
    assert_close_to_scale(hidden[1], hidden[0], relative=relative)
    assert_close_to_scale(gradients[1], gradients[0], relative=relative)
