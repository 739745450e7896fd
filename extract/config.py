"""Detector configuration: one dataclass and its overrides (presets and YAML files: `extract.presets`).

Field names follow detectron2's config where one exists (lower-cased, without the MODEL. prefix),
so a preset can be checked against the detectron2 YAML it reproduces.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from extract.modeling.parts import PARTS, part_shape
from vlbert.utils.errors import UserError
from vlbert.utils.typed_config import above, at_least, checked_fields, from_text

POSITIVE = at_least(1)
SHARE = at_least(0, 1)  # a probability or an IoU threshold


class ConfigError(UserError):
    """A detector config, preset name or override that cannot be used."""


@dataclass(frozen=True)
class DetectorConfig:
    name: str = "butd-vg"

    # The detector's parts, by their names in `extract.modeling.parts.PARTS`.
    backbone: str = "resnet_c4"
    proposal_generator: str = "rpn"
    roi_heads: str = "res5"

    # ResNet trunk (res2-res4) and the res5 RoI head built from the same bottleneck blocks.
    res_blocks: tuple[int, int, int, int] = (3, 4, 23, 3)  # ResNet-101
    stem_out_channels: int = field(default=64, metadata=POSITIVE)
    res2_out_channels: int = field(default=256, metadata=POSITIVE)
    # res2's 3x3 width: groups x width per group (ResNeXt 32x8d: 256)
    bottleneck_channels: int = field(default=64, metadata=POSITIVE)
    num_groups: int = 1  # the 3x3 convs' groups: 1 for ResNet, 32 for ResNeXt 32x8d
    stride_in_1x1: bool = True  # MSRA/caffe weights put the stride in the first 1x1 conv
    stem_pool: str = "caffe"  # "caffe": max-pool k3 s2 pad 0 ceil mode; "standard": pad 1
    res5_stride: int = field(default=1, metadata=POSITIVE)
    res5_dilation: int = field(default=2, metadata=POSITIVE)

    # Region proposal network on res4 (stride 16).
    rpn_hidden_channels: int = field(default=512, metadata=POSITIVE)
    anchor_sizes: tuple[float, ...] = field(default=(64.0, 128.0, 256.0, 512.0), metadata=above(0))
    anchor_ratios: tuple[float, ...] = field(default=(0.5, 1.0, 2.0), metadata=above(0))
    rpn_pre_nms_topk: int = field(default=6000, metadata=POSITIVE)
    rpn_post_nms_topk: int = field(default=300, metadata=POSITIVE)
    rpn_nms_thresh: float = field(default=0.7, metadata=SHARE)

    # RoI head: pooling on res4, res5, mean over the pooled grid, box predictor, attribute head.
    pooler: str = "roipool"  # "roipool", "roialign" (ROIAlignV2: aligned=True) or "roialign_legacy" (aligned=False)
    pooler_resolution: int = field(default=14, metadata=POSITIVE)
    pooler_sampling_ratio: int = field(default=0, metadata=at_least(0))
    # foreground classes; the predictor adds background as the last output
    num_classes: int = field(default=1600, metadata=POSITIVE)
    bbox_reg_weights: tuple[float, float, float, float] = field(default=(10.0, 10.0, 5.0, 5.0), metadata=above(0))
    # 0: no attribute head; otherwise "no attribute" is an extra last output
    num_attributes: int = field(default=400, metadata=at_least(0))
    attr_embed_dim: int = field(default=256, metadata=POSITIVE)
    attr_hidden_dim: int = field(default=512, metadata=POSITIVE)

    # Input: channel order, normalisation (in that channel order) and test-time resizing.
    input_format: str = "BGR"
    pixel_mean: tuple[float, float, float] = (102.9801, 115.9465, 122.7717)
    pixel_std: tuple[float, float, float] = field(default=(1.0, 1.0, 1.0), metadata=above(0))
    min_size: int = 600
    max_size: int = 1000

    # Box selection in detection mode (bottom-up-attention).
    score_thresh: float = field(default=0.2, metadata=SHARE)
    nms_thresh: float = field(default=0.3, metadata=SHARE)
    min_boxes: int = 10
    max_boxes: int = 100
    box_source: str = "proposals"  # "proposals": the pooled boxes; "regressed": class-specific deltas applied

    # Vocabularies, when known (index i names class/attribute i).
    class_names: tuple[str, ...] = ()
    attribute_names: tuple[str, ...] = ()

    # Seed of the random initialisation used when no checkpoint is given.
    init_seed: int = field(default=0, metadata=at_least(0))

    def __post_init__(self) -> None:
        _check(self)

    @property
    def feature_dim(self) -> int:
        """The RoI feature size, as the RoI head part declares it."""
        return part_shape("roi_heads", self).channels

    @property
    def num_anchors(self) -> int:
        return len(self.anchor_sizes) * len(self.anchor_ratios)

    def replace(self, **overrides: Any) -> "DetectorConfig":
        return apply_overrides(self, overrides)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))


SELECTION_FIELDS = ("score_thresh", "nms_thresh", "min_boxes", "max_boxes", "box_source")

_CHOICES = {
    "stem_pool": ("caffe", "standard"),
    "pooler": ("roipool", "roialign", "roialign_legacy"),
    "input_format": ("BGR", "RGB"),
    "box_source": ("proposals", "regressed"),
}


def _check(cfg: DetectorConfig) -> None:
    choices = {**{kind: tuple(parts) for kind, parts in PARTS.items()}, **_CHOICES}
    for name, allowed in choices.items():
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"{name}={getattr(cfg, name)!r}: expected one of {', '.join(allowed)}")
    if cfg.num_groups < 1 or cfg.bottleneck_channels % cfg.num_groups:
        raise ConfigError(f"bottleneck_channels={cfg.bottleneck_channels}, num_groups={cfg.num_groups}: expected "
                          "groups >= 1 that divide the bottleneck width")
    if len(cfg.res_blocks) != 4 or min(cfg.res_blocks) < 1:
        raise ConfigError(f"res_blocks={cfg.res_blocks!r}: expected four positive block counts (res2-res5)")
    if not 0 < cfg.min_boxes <= cfg.max_boxes:
        raise ConfigError(f"min_boxes={cfg.min_boxes}, max_boxes={cfg.max_boxes}: expected 0 < min_boxes <= max_boxes")
    if cfg.min_size < 1 or cfg.max_size < cfg.min_size:
        raise ConfigError(f"min_size={cfg.min_size}, max_size={cfg.max_size}: expected 1 <= min_size <= max_size")
    for name in ("class_names", "attribute_names"):
        names, expected = getattr(cfg, name), cfg.num_classes if name == "class_names" else cfg.num_attributes
        if names and len(names) != expected:
            raise ConfigError(f"{name} has {len(names)} entries, the config has {expected}")




def apply_overrides(cfg: DetectorConfig, overrides: Mapping[str, Any]) -> DetectorConfig:
    """`cfg` with `overrides` (from YAML, or `FIELD=VALUE` text read as YAML) checked as every config is."""
    values = {name: from_text(value, ConfigError, name) if isinstance(value, str) and not isinstance(
        getattr(cfg, name, None), str) else value for name, value in overrides.items()}
    return dataclasses.replace(cfg, **checked_fields(DetectorConfig, values, error=ConfigError))


def parse_override(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r}: expected FIELD=VALUE")
    return key.strip(), value.strip()




def config_from_dict(data: Mapping[str, Any]) -> DetectorConfig:
    """Inverse of `DetectorConfig.to_dict` (used to reopen what a FeatureStore recorded)."""
    return apply_overrides(DetectorConfig(), dict(data))
