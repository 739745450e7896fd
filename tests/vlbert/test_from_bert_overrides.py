"""`from_bert`'s override rule, in one place (vlbert.modeling.BERT_SIZES, BERT_DEFAULTS): the BERT
checkpoint fixes its sizes, whatever the caller gives for them; its activation, dropouts and LayerNorm
epsilon hold unless the caller replaces them; other fields are the caller's."""

import torch
from transformers import BertConfig, BertForPreTraining

from vlbert.modeling import BERT_DEFAULTS, BERT_SIZES, VLBertForQuestionAnswering

BERT = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=96, hidden_act="gelu_new", hidden_dropout_prob=0.2,
            attention_probs_dropout_prob=0.3, layer_norm_eps=1e-7)


def test_from_bert_keeps_the_checkpoints_sizes_and_takes_the_callers_other_fields(tmp_path):
    torch.manual_seed(0)
    bert = BertForPreTraining(BertConfig(**BERT))
    bert.save_pretrained(tmp_path)
    other_sizes = dict(vocab_size=200, hidden_size=64, num_hidden_layers=3, num_attention_heads=8,
                       intermediate_size=128, max_position_embeddings=40)
    model = VLBertForQuestionAnswering.from_bert(tmp_path, **other_sizes, hidden_dropout_prob=0.0, num_answers=7,
                                                 visual_feature_size=24, geometry_frequencies=4)
    config = model.config
    assert {name: getattr(config, name) for name in BERT_SIZES} == {name: BERT[name] for name in BERT_SIZES}
    assert config.hidden_dropout_prob == 0.0  # the caller's
    assert {name: getattr(config, name) for name in BERT_DEFAULTS if name != "hidden_dropout_prob"} == {
        "hidden_act": "gelu_new", "attention_probs_dropout_prob": 0.3, "layer_norm_eps": 1e-7}
    assert config.num_answers == 7 and config.visual_feature_size == 24 and config.geometry_frequencies == 4
    expected = bert.bert.encoder.layer[1].attention.self.query.weight
    assert torch.equal(model.vlbert.encoder.bert.layer[1].attention.self.query.weight, expected)
