"""The encoder's layers in this library's implementation (`use_encoder_layers("fused")`: the query, key
and value projections one GEMM) give transformers' BertEncoder's outputs within 1e-6 in fp32 on the CPU,
forward and backward, hold and save the same state dict, and the switch draws no random numbers."""

import copy

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.models import make_batch, tiny
from vlbert.modeling import (FusedBertLayers, TransformersBertLayers, VLBertForMultipleChoice, VLBertForPreTraining,
                             VLBertForQuestionAnswering, load_pretrained)


def fused_copy(model):
    fused = copy.deepcopy(model)
    fused.use_encoder_layers("fused")
    return fused


def separate_gradients(model) -> dict[str, torch.Tensor]:
    """The parameters' gradients under the state dict's names: a fused projection's as its three parts."""
    gradients = {}
    for name, parameter in model.named_parameters():
        if ".qkv." in name:
            prefix, kind = name.split(".qkv.")
            gradients.update({f"{prefix}.{part}.{kind}": grad for part, grad in
                              zip(("query", "key", "value"), parameter.grad.chunk(3))})
        elif parameter.grad is not None:
            gradients[name] = parameter.grad
    return gradients


@pytest.mark.parametrize("multiple", [1, 16])
def test_fused_layers_give_transformers_outputs_attentions_and_gradients(multiple):
    """Eval: hidden states and attention probabilities within 1e-6 (sequences padded or not); training
    with dropout: the same loss (the same random draws) and gradients within 1e-6 of their scale."""
    torch.manual_seed(0)
    model = VLBertForQuestionAnswering(tiny(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    model.pad_sequences_to(multiple)
    fused = fused_copy(model)
    assert isinstance(fused.vlbert.encoder.bert, FusedBertLayers) and fused.vlbert.encoder.layers == "fused"
    batch = make_batch(model.config)
    labels = {"answer_positions": batch["text_mask"].sum(1) - 2, "labels": torch.rand(4, model.config.num_answers)}
    with torch.no_grad():
        plain_output = model.eval().vlbert(**batch, output_attentions=True)
        fused_output = fused.eval().vlbert(**batch, output_attentions=True)
        assert torch.allclose(fused.vlbert(**batch).last_hidden_state, model.vlbert(**batch).last_hidden_state,
                              atol=1e-6, rtol=0)
    assert torch.allclose(fused_output.last_hidden_state, plain_output.last_hidden_state, atol=1e-6, rtol=0)
    assert len(fused_output.attentions) == model.config.num_hidden_layers
    for theirs, ours in zip(plain_output.attentions, fused_output.attentions):
        assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-6, rtol=0)

    losses = []
    for each in (model, fused):
        torch.manual_seed(1)
        loss = each.train()(**batch, **labels).loss
        loss.backward()
        losses.append(loss)
    assert torch.allclose(losses[1], losses[0], atol=1e-6, rtol=0)
    plain_gradients, fused_gradients = separate_gradients(model), separate_gradients(fused)
    assert fused_gradients.keys() == plain_gradients.keys()
    for name, gradient in plain_gradients.items():
        scale = gradient.abs().max().item()
        assert (fused_gradients[name] - gradient).abs().max().item() <= 1e-6 * max(scale, 1.0), name


def test_fused_layers_hold_and_save_transformers_state_dict(tmp_path):
    """The same names in the same order, the same values; a saved model's weight file is byte for byte
    the one the transformers layers save, and loads back into either; and back to transformers' layers,
    the same state again. The switch keeps the training mode and draws no random numbers."""
    torch.manual_seed(0)
    model = VLBertForPreTraining(tiny()).train()
    state = model.state_dict()
    random_state = torch.get_rng_state()
    fused = fused_copy(model)
    assert torch.equal(torch.get_rng_state(), random_state) and fused.vlbert.encoder.bert.training
    fused_state = fused.state_dict()
    assert list(fused_state) == list(state) and all(torch.equal(fused_state[name], state[name]) for name in state)
    assert any(".qkv." in name for name, _ in fused.named_parameters())
    assert all(parameter.requires_grad for parameter in fused.parameters())

    model.save_pretrained(tmp_path / "plain")
    fused.save_pretrained(tmp_path / "fused")
    saved = [(tmp_path / folder / "model.safetensors").read_bytes() for folder in ("plain", "fused")]
    assert saved[1] == saved[0]
    loaded = load_pretrained(tmp_path / "fused")
    assert isinstance(loaded.vlbert.encoder.bert, TransformersBertLayers)
    loaded.use_encoder_layers("fused")
    loaded.load_state_dict(load_file(tmp_path / "plain" / "model.safetensors"), strict=True)
    assert all(torch.equal(loaded.state_dict()[name], state[name]) for name in state)

    fused.use_encoder_layers("transformers")
    assert isinstance(fused.vlbert.encoder.bert, TransformersBertLayers)
    assert all(torch.equal(fused.state_dict()[name], state[name]) for name in state)


def test_every_encoder_of_a_multiple_choice_model_switches_and_an_unknown_implementation_is_refused():
    torch.manual_seed(0)
    model = VLBertForMultipleChoice(tiny(with_pooler=True))
    model.use_encoder_layers("fused")
    assert all(type(module.bert) is FusedBertLayers for module in model.modules() if hasattr(module, "use_layers"))
    with pytest.raises(ValueError, match="^encoder layers 'flash': expected one of transformers, fused$"):
        model.use_encoder_layers("flash")
