"""VL-BERT model library: config, embeddings, encoder, heads, tokenization helpers, checkpoints.

The names below load their module on first use, so that importing a light part (`vlbert.utils.errors`,
which every package imports, or `vlbert.config`) does not import torch and transformers. transformers'
AutoConfig and AutoModel know VL-BERT's model folders once transformers loads them (vlbert.auto)."""

import importlib

from vlbert.auto import register_when_transformers_loads

_MODULES = {
    "vlbert.config": ("VLBertConfig",),
    "vlbert.convert_official": ("ConversionResult", "convert_official_checkpoint"),
    "vlbert.losses": ("IGNORE_INDEX",),
    "vlbert.modeling": (
        "PreTrainingOutput", "TaskOutput", "VLBertForImageTextMatching", "VLBertForMultipleChoice",
        "VLBertForPairClassification", "VLBertForPreTraining", "VLBertForQuestionAnswering",
        "VLBertForReferringExpressions", "VLBertForSequenceClassification", "VLBertModel",
        "VLBertOutput", "VLBertPreTrainedModel", "box_geometry_embedding", "load_pretrained",
    ),
    "vlbert.tokenization": (
        "Segment", "TextSequence", "build_caption_sequence", "build_choice_sequences", "build_sequence",
        "build_vqa_sequence", "choose_masked_regions", "load_tokenizer", "mask_whole_words", "pad_text",
        "word_pieces",
    ),
    "vlbert.transformers_config": ("VLBertTransformersConfig",),
    "vlbert.utils.versions": ("environment_versions",),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vlbert' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


register_when_transformers_loads()
