"""VL-BERT configuration: one dataclass, VL-BERT-base defaults, named sizes (base, large, tiny)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from vlbert.utils.errors import UserError
from vlbert.utils.typed_config import above, at_least, from_mapping, load_yaml, located

POSITIVE = at_least(1)
PROBABILITY = at_least(0, 1)

# Named model sizes: the fields each changes from VLBertConfig's defaults (which are VL-BERT-base's).
# A trainer replaces the vocabulary, feature and class counts with its tokenizer's and store's.
MODEL_SIZES: dict[str, dict[str, int]] = {
    "base": {},  # BERT-base: 12 layers, 768 wide, 12 heads (110M text parameters)
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    "tiny": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=96, visual_feature_size=24, geometry_frequencies=4,
                 num_detector_classes=11, num_answers=7),  # a few layers for tests and smoke runs
}


class VLBertConfigError(UserError):
    """A VL-BERT config (a file or mapping of its fields) that cannot be used; the message names the field."""


@dataclass
class VLBertConfig:
    # Text side, as BERT-base (uncased).
    vocab_size: int = field(default=30522, metadata=POSITIVE)
    hidden_size: int = field(default=768, metadata=POSITIVE)
    num_hidden_layers: int = field(default=12, metadata=POSITIVE)
    num_attention_heads: int = field(default=12, metadata=POSITIVE)
    intermediate_size: int = field(default=3072, metadata=POSITIVE)
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = field(default=0.1, metadata=PROBABILITY)
    attention_probs_dropout_prob: float = field(default=0.1, metadata=PROBABILITY)
    max_position_embeddings: int = field(default=512, metadata=POSITIVE)
    # Segments: A = 0, B = 1, visual elements and [END] = 2.
    type_vocab_size: int = field(default=3, metadata=at_least(3))
    layer_norm_eps: float = field(default=1e-12, metadata=above(0))
    initializer_range: float = field(default=0.02, metadata=at_least(0))
    pad_token_id: int = field(default=0, metadata=at_least(0))

    # Visual side: RoI appearance features from the Fast R-CNN (res5 mean-pooled).
    visual_feature_size: int = field(default=2048, metadata=POSITIVE)
    # Geometry: sin and cos of each of 4 box coordinates at `geometry_frequencies` wavelengths
    # spread up to `geometry_wavelength`; (center x, center y, w, h) as the reference code,
    # or the paper's corners (x1, y1, x2, y2). Both are fractions of the image size × 100.
    geometry_frequencies: int = field(default=256, metadata=POSITIVE)
    geometry_wavelength: float = field(default=1000.0, metadata=above(0))
    geometry_form: Literal["center", "corner"] = "center"
    visual_dropout_prob: float = field(default=0.1, metadata=PROBABILITY)
    # Gain of the LayerNorms on the visual feature embedding: 0 so that training starts from BERT.
    visual_gain_init: float = 0.0

    # Heads.
    num_detector_classes: int = field(default=1601, metadata=POSITIVE)  # Visual Genome: 1600 classes + background
    with_pooler: bool = True  # [CLS] dense + tanh, used by the relationship, choice and matching heads
    with_relationship_head: bool = False  # the paper's ablation (c); off in VL-BERT pre-training
    num_answers: int = field(default=3129, metadata=POSITIVE)  # VQA v2 answer vocabulary
    # sequence classification: SNLI-VE's entailment, neutral, contradiction
    num_labels: int = field(default=3, metadata=POSITIVE)
    classifier_dropout: float = field(default=0.1, metadata=PROBABILITY)
    # Retrieval's loss over a caption's group of pairs (`vlbert.losses.MATCHING_LOSSES`): Unicoder-VL's
    # hardest-negative triplet loss, a softmax over the group, or binary cross-entropy per pair; and
    # the triplet margin (Unicoder-VL's γ, which it does not state; VSE++'s value, whose loss it follows).
    matching_loss: str = "triplet"
    matching_margin: float = field(default=0.2, metadata=at_least(0))
    # What the task head's outputs stand for, in order (VQA's answers, SNLI-VE's classes); a model folder's
    # config.json holds them as transformers' id2label and label2id.
    label_names: list[str] | None = None

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise VLBertConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        from vlbert.losses import MATCHING_LOSSES

        if self.matching_loss not in MATCHING_LOSSES:
            raise VLBertConfigError(f"matching_loss must be one of {tuple(MATCHING_LOSSES)}, got {self.matching_loss!r}")

    @property
    def geometry_size(self) -> int:
        return 4 * 2 * self.geometry_frequencies

    @classmethod
    def sized(cls, size: str = "base", **overrides) -> VLBertConfig:
        """The named size of MODEL_SIZES, `overrides` replacing its fields."""
        if size not in MODEL_SIZES:
            raise VLBertConfigError(f"model size {size!r} is not one of {', '.join(MODEL_SIZES)}")
        return cls(**{**MODEL_SIZES[size], **overrides})

    @classmethod
    def tiny(cls, **overrides) -> VLBertConfig:
        """A few-layer, narrow model for tests (random weights; seconds on a CPU)."""
        return cls.sized("tiny", **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> VLBertConfig:
        """A config from a mapping of its fields, checked as every config is (vlbert.utils.typed_config)."""
        return from_mapping(cls, values, error=VLBertConfigError)

    @classmethod
    def load(cls, path: str | Path) -> VLBertConfig:
        """A config.json (or a YAML file) of VLBertConfig fields; a mistake names the file, line and field."""
        values, lines = load_yaml(path, VLBertConfigError)  # JSON is YAML
        try:
            return cls.from_dict(values)
        except VLBertConfigError as exc:
            raise VLBertConfigError(located(str(path), lines, exc)) from None
