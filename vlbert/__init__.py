"""VL-BERT model library: config, embeddings, encoder, heads, tokenization helpers, checkpoints.

The names below load their module on first use, so that importing a light part (`vlbert.errors`,
`vlbert.config`) does not import torch and transformers."""

import importlib

_EXPORTS = {
    "VLBertConfig": "vlbert.config",
    "ConversionResult": "vlbert.convert_official", "convert_official_checkpoint": "vlbert.convert_official",
    "UserError": "vlbert.errors",
    "IGNORE_INDEX": "vlbert.losses",
    **dict.fromkeys([
        "PreTrainingOutput", "TaskOutput", "VLBertForImageTextMatching", "VLBertForMultipleChoice",
        "VLBertForPreTraining", "VLBertForQuestionAnswering", "VLBertForReferringExpressions", "VLBertModel",
        "VLBertOutput", "VLBertPreTrainedModel", "box_geometry_embedding", "load_pretrained",
    ], "vlbert.modeling"),
    **dict.fromkeys([
        "Segment", "TextSequence", "build_caption_sequence", "build_choice_sequences", "build_sequence",
        "build_vqa_sequence", "choose_masked_regions", "load_tokenizer", "mask_whole_words", "pad_text",
        "word_pieces",
    ], "vlbert.tokenization"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vlbert' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
