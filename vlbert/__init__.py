"""VL-BERT model library: config, embeddings, encoder, heads, tokenization helpers, checkpoints."""

from vlbert.config import VLBertConfig
from vlbert.convert_official import ConversionResult, convert_official_checkpoint
from vlbert.losses import IGNORE_INDEX
from vlbert.modeling import (
    PreTrainingOutput,
    TaskOutput,
    VLBertForImageTextMatching,
    VLBertForMultipleChoice,
    VLBertForPreTraining,
    VLBertForQuestionAnswering,
    VLBertForReferringExpressions,
    VLBertModel,
    VLBertOutput,
    VLBertPreTrainedModel,
    box_geometry_embedding,
    load_pretrained,
)
from vlbert.tokenization import (
    Segment,
    TextSequence,
    build_caption_sequence,
    build_choice_sequences,
    build_sequence,
    build_vqa_sequence,
    choose_masked_regions,
    load_tokenizer,
    mask_whole_words,
    pad_text,
    word_pieces,
)

__all__ = [
    "IGNORE_INDEX",
    "ConversionResult",
    "PreTrainingOutput",
    "Segment",
    "TaskOutput",
    "TextSequence",
    "VLBertConfig",
    "VLBertForImageTextMatching",
    "VLBertForMultipleChoice",
    "VLBertForPreTraining",
    "VLBertForQuestionAnswering",
    "VLBertForReferringExpressions",
    "VLBertModel",
    "VLBertOutput",
    "VLBertPreTrainedModel",
    "box_geometry_embedding",
    "build_caption_sequence",
    "build_choice_sequences",
    "build_sequence",
    "build_vqa_sequence",
    "choose_masked_regions",
    "convert_official_checkpoint",
    "load_pretrained",
    "load_tokenizer",
    "mask_whole_words",
    "pad_text",
    "word_pieces",
]
