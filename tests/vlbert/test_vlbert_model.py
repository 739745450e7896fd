"""VL-BERT model: embeddings layout, invariances, BERT parity, heads, save/load (tiny configs)."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForPreTraining, BertModel

from tests.helpers.models import make_batch, tiny
from vlbert import (
    VLBertForImageTextMatching,
    VLBertForMultipleChoice,
    VLBertForPreTraining,
    VLBertForQuestionAnswering,
    VLBertForReferringExpressions,
    VLBertModel,
    box_geometry_embedding,
    load_pretrained,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return VLBertModel(tiny()).eval()


def test_output_shapes_and_attention_mask(model):
    batch = make_batch(model.config)
    output = model(**batch, output_attentions=True)
    b, t = batch["input_ids"].shape
    n = batch["box_mask"].shape[1]
    assert output.last_hidden_state.shape == (b, t + n + 1, model.config.hidden_size)
    assert output.text_hidden_state.shape == (b, t, model.config.hidden_size)
    assert output.region_hidden_state.shape == (b, n, model.config.hidden_size)
    assert output.pooled_output.shape == (b, model.config.hidden_size)
    expected_mask = torch.cat((batch["text_mask"], batch["box_mask"], torch.ones(b, 1, dtype=torch.bool)), 1)
    assert torch.equal(output.attention_mask, expected_mask)
    assert len(output.attentions) == model.config.num_hidden_layers
    probabilities = output.attentions[0]
    assert probabilities.shape == (b, model.config.num_attention_heads, t + n + 1, t + n + 1)
    assert torch.allclose(probabilities.sum(-1), torch.ones(()), atol=1e-5)
    assert probabilities.masked_select(~expected_mask[:, None, None, :]).abs().max() == 0


def test_attention_probabilities_leave_outputs_unchanged(model):
    batch = make_batch(model.config)
    plain = model(**batch).last_hidden_state
    recorded = model(**batch, output_attentions=True).last_hidden_state
    assert torch.allclose(plain, recorded, atol=1e-5)


def test_half_precision_features_are_accepted(model):
    batch = make_batch(model.config)
    reference = model(**batch).last_hidden_state
    half = model(**dict(batch, appearance=batch["appearance"].half())).last_hidden_state
    assert half.dtype == torch.float32
    assert torch.allclose(half, reference, atol=1e-2)


def test_positions_and_segments(model):
    batch = make_batch(model.config)
    seen = {}
    hooks = [
        model.embeddings.position_embeddings.register_forward_hook(lambda m, i, o: seen.__setitem__("pos", i[0])),
        model.embeddings.token_type_embeddings.register_forward_hook(lambda m, i, o: seen.__setitem__("seg", i[0])),
    ]
    model(**batch)
    for hook in hooks:
        hook.remove()
    t, n = batch["input_ids"].shape[1], batch["box_mask"].shape[1]
    text_lengths = batch["text_mask"].sum(1)
    for row, length in enumerate(text_lengths.tolist()):
        assert seen["pos"][row, :length].tolist() == list(range(length))
        assert seen["pos"][row, t : t + n].tolist() == [length] * n  # every RoI shares one position
        assert seen["pos"][row, t + n].item() == length + 1  # [END] takes the next
    assert torch.equal(seen["seg"][:, :t], batch["token_type_ids"])
    assert (seen["seg"][:, t:] == 2).all()


def test_identical_rois_get_identical_outputs(model):
    batch = make_batch(model.config, region_counts=(5, 5, 5, 5))
    for name in ("appearance", "boxes"):
        batch[name][:, 3] = batch[name][:, 2]
    regions = model(**batch).region_hidden_state
    assert torch.allclose(regions[:, 2], regions[:, 3], atol=1e-6)
    assert not torch.allclose(regions[:, 1], regions[:, 2], atol=1e-3)


def test_permuting_rois_permutes_outputs_and_keeps_text(model):
    batch = make_batch(model.config, region_counts=(5, 5, 5, 5))
    permutation = torch.tensor([3, 0, 4, 2, 1])  # moves the whole-image box to position 1
    permuted = dict(batch)
    for name in ("appearance", "boxes", "box_mask"):
        permuted[name] = batch[name][:, permutation]
    permuted["text_box_index"] = torch.full_like(batch["input_ids"], 1)  # words keep the whole image
    original, shuffled = model(**batch), model(**permuted)
    assert torch.allclose(shuffled.region_hidden_state, original.region_hidden_state[:, permutation], atol=1e-5)
    assert torch.allclose(shuffled.text_hidden_state, original.text_hidden_state, atol=1e-5)
    assert torch.allclose(shuffled.last_hidden_state[:, 0], original.last_hidden_state[:, 0], atol=1e-5)
    assert torch.allclose(shuffled.last_hidden_state[:, -1], original.last_hidden_state[:, -1], atol=1e-5)


def test_text_box_index_selects_a_tagged_objects_feature(model):
    batch = make_batch(model.config, region_counts=(5, 5, 5, 5))
    tagged = dict(batch, text_box_index=torch.zeros_like(batch["input_ids"]))
    tagged["text_box_index"][:, 2] = 3
    untagged, with_tag = model(**batch), model(**tagged)
    assert not torch.allclose(untagged.text_hidden_state[:, 2], with_tag.text_hidden_state[:, 2], atol=1e-4)
    # The tagged word's embedding uses box 3's visual feature: swapping boxes 0 and 3 and pointing
    # the other words at the new position of the whole image gives the same text outputs.
    swap = torch.tensor([3, 1, 2, 0, 4])
    swapped = dict(batch, text_box_index=torch.full_like(batch["input_ids"], 3))
    swapped["text_box_index"][:, 2] = 0
    for name in ("appearance", "boxes"):
        swapped[name] = batch[name][:, swap]
    assert torch.allclose(model(**swapped).text_hidden_state, with_tag.text_hidden_state, atol=1e-5)


def test_text_only_samples_use_the_learned_visual_embedding(model):
    batch = make_batch(model.config)
    text_only = {name: batch[name] for name in ("input_ids", "token_type_ids", "text_mask")}
    alone = model(**text_only)
    assert alone.num_regions == 0 and alone.last_hidden_state.shape[1] == batch["input_ids"].shape[1] + 1
    # In a mixed batch, a row without RoIs is the same text-only sample.
    mixed = dict(batch, box_mask=batch["box_mask"].clone())
    mixed["box_mask"][1] = False
    together = model(**mixed)
    t = batch["input_ids"].shape[1]
    assert torch.allclose(together.text_hidden_state[1], alone.text_hidden_state[1], atol=1e-5)
    assert torch.allclose(together.last_hidden_state[1, -1], alone.last_hidden_state[1, t], atol=1e-5)
    no_regions = dict(
        text_only,
        appearance=torch.zeros(4, 0, model.config.visual_feature_size),
        boxes=torch.zeros(4, 0, 4),
        box_mask=torch.zeros(4, 0, dtype=torch.bool),
        image_size=batch["image_size"],
    )
    assert torch.allclose(model(**no_regions).last_hidden_state, alone.last_hidden_state, atol=1e-6)
    change = torch.randn(model.config.hidden_size)  # not a constant: the LayerNorm would remove it
    with torch.no_grad():
        model.embeddings.text_only_visual.add_(change)
    try:
        assert not torch.allclose(model(**text_only).text_hidden_state, alone.text_hidden_state, atol=1e-3)
    finally:
        with torch.no_grad():
            model.embeddings.text_only_visual.sub_(change)


def test_masked_regions_replace_the_img_token_and_appearance(model):
    batch = make_batch(model.config, region_counts=(5, 5, 5, 5))
    masked = torch.zeros_like(batch["box_mask"])
    masked[:, 2] = True
    masked[:, 0] = True  # the whole image is never feature-masked
    with torch.no_grad():
        model.embeddings.masked_appearance.normal_()
    try:
        by_feature = model(**batch, masked_regions=masked, feature_masking=True)
        # Same as handing the model the masked features and the mean of the visible boxes by hand.
        appearance = batch["appearance"].clone()
        appearance[:, 2] = model.embeddings.masked_appearance
        appearance[:, 0] = batch["appearance"][:, [1, 3, 4]].mean(1)
        by_hand = model(**dict(batch, appearance=appearance), masked_regions=masked)
    finally:
        with torch.no_grad():
            model.embeddings.masked_appearance.zero_()
    assert torch.allclose(by_feature.last_hidden_state, by_hand.last_hidden_state, atol=1e-5)
    unmasked = model(**batch)
    token_only = model(**batch, masked_regions=masked)
    assert not torch.allclose(token_only.region_hidden_state[:, 2], unmasked.region_hidden_state[:, 2], atol=1e-3)


def test_feature_masking_without_masked_rois_averages_the_real_boxes(model):
    batch = make_batch(model.config)  # rows have 5, 3, 4 and 5 real boxes, then padding
    appearance = batch["appearance"].clone()
    for row, count in enumerate(batch["box_mask"].sum(1).tolist()):
        appearance[row, 0] = batch["appearance"][row, 1:count].mean(0)
    by_hand = model(**dict(batch, appearance=appearance))
    assert torch.allclose(model(**batch, feature_masking=True).last_hidden_state, by_hand.last_hidden_state, atol=1e-5)


def test_geometry_embedding_follows_the_reference_formula():
    boxes = torch.tensor([[10.0, 20.0, 50.0, 60.0]])
    size = torch.tensor([[100.0, 200.0]])
    embedding = box_geometry_embedding(boxes, size, frequencies=256, wavelength=1000.0)
    assert embedding.shape == (1, 2048)
    center_x = 30.0 / 100.0 * 100.0
    k = 5
    assert math.isclose(embedding[0, k].item(), math.sin(center_x / 1000 ** (k / 256)), abs_tol=1e-5)
    assert math.isclose(embedding[0, 256 + k].item(), math.cos(center_x / 1000 ** (k / 256)), abs_tol=1e-5)
    height = 40.0 / 200.0 * 100.0
    assert math.isclose(embedding[0, 3 * 512 + k].item(), math.sin(height / 1000 ** (k / 256)), abs_tol=1e-5)
    corner = box_geometry_embedding(boxes, size, frequencies=256, form="corner")
    assert math.isclose(corner[0, 2 * 512].item(), math.sin(50.0), abs_tol=1e-5)  # x2 = 50 % at k = 0


def test_text_only_input_matches_transformers_bert(tmp_path):
    torch.manual_seed(0)
    bert_config = BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=96, type_vocab_size=3,
    )
    BertForPreTraining(bert_config).save_pretrained(tmp_path)
    bert = BertModel.from_pretrained(tmp_path, add_pooling_layer=False).eval()
    model = VLBertModel.from_bert(tmp_path).eval()
    assert model.config.visual_gain_init == 0.0
    batch = make_batch(model.config)
    ids, segments, mask = batch["input_ids"], batch["token_type_ids"], batch["text_mask"]
    ours = model(input_ids=ids, token_type_ids=segments, text_mask=mask)
    # The same elements through BertModel: the words, then [END] (segment 2, position after next).
    lengths = mask.sum(1, keepdim=True)
    embeds = torch.cat((bert.embeddings.word_embeddings(ids), model.embeddings.end_token.expand(len(ids), 1, -1)), 1)
    reference = bert(
        inputs_embeds=embeds,
        token_type_ids=torch.cat((segments, torch.full_like(lengths, 2)), 1),
        position_ids=torch.cat((torch.arange(ids.shape[1]).expand_as(ids), lengths + 1), 1),
        attention_mask=torch.cat((mask, torch.ones_like(lengths, dtype=torch.bool)), 1).long(),
    ).last_hidden_state
    real = ours.attention_mask
    assert torch.allclose(ours.last_hidden_state[real], reference[real], atol=1e-5)


def test_from_bert_initialises_heads_and_new_parameters(tmp_path):
    torch.manual_seed(0)
    bert_config = BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=96,
    )
    bert = BertForPreTraining(bert_config)
    bert.save_pretrained(tmp_path)
    pretraining = VLBertForPreTraining.from_bert(tmp_path, num_detector_classes=11, visual_feature_size=24,
                                                 geometry_frequencies=4)
    vqa = VLBertForQuestionAnswering.from_bert(tmp_path, num_answers=7, visual_feature_size=24, geometry_frequencies=4)
    bert_transform = bert.cls.predictions.transform.dense.weight
    assert torch.equal(pretraining.mlm_head.transform.dense.weight, bert_transform)
    assert torch.equal(vqa.answer_head.transform.dense.weight, bert_transform)
    segments = pretraining.vlbert.embeddings.token_type_embeddings.weight
    assert torch.equal(segments[:2], bert.bert.embeddings.token_type_embeddings.weight)
    assert 0.005 < segments[2].std().item() < 0.05  # segment 2 is new: N(0, 0.02)
    assert (pretraining.vlbert.embeddings.text_visual_norm.weight == 0).all()
    assert (pretraining.vlbert.embeddings.masked_appearance == 0).all()


def test_from_bert_relationship_head_says_matches_where_bert_says_is_next(tmp_path):
    """BERT's next-sentence row 0 is IsNext; the relationship head's label 1 is "the caption matches"."""
    torch.manual_seed(0)
    bert_config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=96)
    bert = BertForPreTraining(bert_config)
    with torch.no_grad():  # a head that is sure of IsNext whatever the input, so an inverted copy cannot pass
        bert.cls.seq_relationship.bias.copy_(torch.tensor([4.0, -4.0]))
    bert.save_pretrained(tmp_path)
    model = VLBertForPreTraining.from_bert(tmp_path, with_relationship_head=True, num_detector_classes=11,
                                           visual_feature_size=24, geometry_frequencies=4)
    pooled = torch.randn(5, 32)
    is_next = bert.cls.seq_relationship(pooled).softmax(-1)[:, 0]
    matches = model.relationship_head(pooled).softmax(-1)[:, 1]
    assert torch.allclose(matches, is_next)
    assert (matches > 0.99).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_forward_and_backward(dtype):
    torch.manual_seed(0)
    model = VLBertForPreTraining(tiny())
    batch = make_batch(model.config)
    labels = batch["input_ids"].masked_fill(torch.rand(batch["input_ids"].shape) > 0.5, -100)
    reference = model(**batch, mlm_labels=labels)
    with torch.autocast("cpu", dtype=dtype):
        output = model(**batch, mlm_labels=labels)
    assert output.mlm_logits.dtype == dtype
    assert torch.isfinite(output.loss)
    assert abs(output.loss.item() - reference.loss.item()) < 0.05 * reference.loss.item()
    output.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("fraction", [0.3, 0.0])
def test_mlm_loss_from_the_labelled_positions_equals_the_loss_over_every_positions_logits(fraction):
    """The head runs on the labelled positions only; loss and gradients are those of logits for
    every position with the unlabelled ones dropped, also when none is labelled (0, not NaN)."""
    torch.manual_seed(0)
    model = VLBertForPreTraining(tiny())
    batch = make_batch(model.config)
    g = torch.Generator().manual_seed(5)
    labels = batch["input_ids"].masked_fill(torch.rand(batch["input_ids"].shape, generator=g) >= fraction, -100)
    labelled = labels != -100
    assert labelled.any() == (fraction > 0)

    output = model(**batch, mlm_labels=labels)
    output.mlm_loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    every_position = model(**batch).mlm_logits
    if labelled.any():
        reference = F.cross_entropy(every_position[labelled], labels[labelled])
    else:
        reference = every_position.sum() * 0.0
    reference.backward()

    assert every_position.shape == (*labels.shape, model.config.vocab_size)
    assert output.mlm_logits.shape == (int(labelled.sum()), model.config.vocab_size)
    torch.testing.assert_close(output.mlm_logits, every_position[labelled])
    torch.testing.assert_close(output.mlm_loss, reference)
    assert gradients.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(gradients[name]).all(), name
            torch.testing.assert_close(gradients[name], p.grad, msg=name)


def _soft_targets(shape, box_mask, seed=1):
    g = torch.Generator().manual_seed(seed)
    targets = torch.softmax(torch.randn(*shape, generator=g) * 3, -1)
    chosen = box_mask.clone()
    chosen[:, 0] = False
    return targets * chosen.unsqueeze(-1)


def _overfit(model, run, steps=30):
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = run(model)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _pretraining_batch(config):
    batch = make_batch(config)
    g = torch.Generator().manual_seed(3)
    mlm_labels = batch["input_ids"].masked_fill(torch.rand(batch["input_ids"].shape, generator=g) > 0.3, -100)
    region_labels = _soft_targets((*batch["box_mask"].shape, config.num_detector_classes), batch["box_mask"])
    return batch, mlm_labels, region_labels


@pytest.mark.parametrize("loss_name", ["mlm_loss", "region_loss", "relationship_loss"])
def test_pretraining_head_losses_decrease(loss_name):
    torch.manual_seed(0)
    model = VLBertForPreTraining(tiny(with_relationship_head=True))
    batch, mlm_labels, region_labels = _pretraining_batch(model.config)
    labels = dict(
        mlm_loss=dict(mlm_labels=mlm_labels),
        region_loss=dict(region_labels=region_labels),
        relationship_loss=dict(relationship_labels=torch.tensor([1, 0, 1, 0])),
    )[loss_name]
    losses = _overfit(model, lambda m: getattr(m(**batch, **labels), loss_name))
    assert losses[-1] < 0.75 * losses[0]


def test_question_answering_loss_decreases():
    torch.manual_seed(0)
    model = VLBertForQuestionAnswering(tiny())
    batch = make_batch(model.config)
    scores = torch.zeros(4, model.config.num_answers)
    scores[torch.arange(4), torch.tensor([1, 3, 5, 1])] = 1.0
    scores[0, 2] = 0.3
    positions = batch["text_mask"].sum(1) - 2
    losses = _overfit(model, lambda m: m(**batch, answer_positions=positions, labels=scores).loss)
    assert losses[-1] < 0.75 * losses[0]


def test_multiple_choice_loss_decreases():
    torch.manual_seed(0)
    model = VLBertForMultipleChoice(tiny())
    batch = make_batch(model.config)
    choices = 3
    g = torch.Generator().manual_seed(5)
    text = {
        "input_ids": torch.randint(5, model.config.vocab_size, (4, choices, 6), generator=g),
        "token_type_ids": torch.zeros(4, choices, 6, dtype=torch.long),
        "text_mask": torch.ones(4, choices, 6, dtype=torch.bool),
    }
    visual = {name: batch[name] for name in ("appearance", "boxes", "box_mask", "image_size")}
    labels = torch.tensor([0, 2, 1, 2])
    output = model(**text, **visual, labels=labels)
    assert output.logits.shape == (4, choices)
    losses = _overfit(model, lambda m: m(**text, **visual, labels=labels).loss)
    assert losses[-1] < 0.75 * losses[0]


def test_referring_expression_loss_decreases():
    torch.manual_seed(0)
    model = VLBertForReferringExpressions(tiny())
    batch = make_batch(model.config)
    labels = torch.zeros(batch["box_mask"].shape)
    labels[torch.arange(4), torch.tensor([1, 2, 3, 4])] = 1.0
    output = model(**batch, labels=labels)
    assert output.logits.shape == batch["box_mask"].shape
    losses = _overfit(model, lambda m: m(**batch, labels=labels).loss)
    assert losses[-1] < 0.75 * losses[0]


def test_image_text_matching_loss_decreases():
    torch.manual_seed(0)
    model = VLBertForImageTextMatching(tiny())
    batch = make_batch(model.config)
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    losses = _overfit(model, lambda m: m(**batch, labels=labels).loss)
    assert losses[-1] < 0.75 * losses[0]


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    model = VLBertForPreTraining(tiny(with_relationship_head=True)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)  # not just the initial values
    model.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    assert type(loaded) is VLBertForPreTraining and loaded.config == model.config
    batch = make_batch(model.config)
    assert torch.equal(loaded(**batch).mlm_logits, model(**batch).mlm_logits)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_fine_tuning_heads_start_from_pretraining_heads(tmp_path):
    torch.manual_seed(0)
    pretrained = VLBertForPreTraining(tiny())
    pretrained.save_pretrained(tmp_path)
    vqa = VLBertForQuestionAnswering.from_pretrained(tmp_path)
    grounding = VLBertForReferringExpressions.from_pretrained(tmp_path)
    assert torch.equal(vqa.answer_head.transform.dense.weight, pretrained.mlm_head.transform.dense.weight)
    assert torch.equal(vqa.answer_head.transform.layer_norm.bias, pretrained.mlm_head.transform.layer_norm.bias)
    assert torch.equal(grounding.region_score_head.transform.dense.weight, pretrained.region_head.transform.dense.weight)
    for name, tensor in pretrained.vlbert.state_dict().items():
        assert torch.equal(vqa.vlbert.state_dict()[name], tensor), name


def test_a_pooler_absent_from_the_checkpoint_starts_fresh(tmp_path):
    torch.manual_seed(0)
    pretrained = VLBertForPreTraining(tiny(with_pooler=False))  # as VL-BERT pre-training
    pretrained.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="with_pooler"):
        VLBertForMultipleChoice.from_pretrained(tmp_path)
    vcr = VLBertForMultipleChoice.from_pretrained(tmp_path, with_pooler=True)
    assert 0.005 < vcr.vlbert.pooler.dense.weight.std().item() < 0.05
    words = pretrained.vlbert.embeddings.word_embeddings.weight
    assert torch.equal(vcr.vlbert.embeddings.word_embeddings.weight, words)


@pytest.mark.parametrize("model_class, config, reads", [
    (VLBertForQuestionAnswering, {}, False), (VLBertForReferringExpressions, {}, False),
    (VLBertForPreTraining, {}, False), (VLBertForPreTraining, {"with_relationship_head": True}, True),
    (VLBertForImageTextMatching, {}, True)], ids=["vqa", "refexp", "pretrain", "pretrain-relationship", "matching"])
def test_skip_unread_pooler_drops_the_pooled_output_only_where_no_head_reads_it(model_class, config, reads):
    """Skipped, the pooled [CLS] is None and every loss and gradient is the one computed beside it, bit
    for bit; a model whose head reads it keeps it."""
    torch.manual_seed(0)
    model = model_class(tiny(**config))
    batch = make_batch(model.config)
    labels = {VLBertForQuestionAnswering: {"answer_positions": batch["text_mask"].sum(1) - 2,
                                           "labels": torch.rand(4, model.config.num_answers)},
              VLBertForReferringExpressions: {"labels": (torch.rand(batch["box_mask"].shape) > 0.5).float()},
              VLBertForImageTextMatching: {"labels": torch.tensor([1.0, 0.0, 0.0, 1.0])}}.get(model_class)
    if model_class is VLBertForPreTraining:
        _, mlm_labels, region_labels = _pretraining_batch(model.config)
        labels = {"mlm_labels": mlm_labels, "region_labels": region_labels}
        if reads:
            labels["relationship_labels"] = torch.tensor([1, 0, 1, 0])

    def forward_and_gradients():
        model.zero_grad()
        output = model(**batch, **labels)
        output.loss.backward()
        return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    computed, computed_gradients = forward_and_gradients()
    model.skip_unread_pooler()
    skipped, skipped_gradients = forward_and_gradients()
    assert model.reads_pooled_output() == reads
    assert (skipped.vlbert.pooled_output is None) == (not reads) and computed.vlbert.pooled_output is not None
    assert torch.equal(skipped.loss, computed.loss) and skipped_gradients.keys() == computed_gradients.keys()
    assert all(torch.equal(skipped_gradients[name], computed_gradients[name]) for name in computed_gradients)
    assert any(name.startswith("vlbert.pooler.") for name, _ in model.named_parameters())
