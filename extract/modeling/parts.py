"""The detector's three parts, each picked by name from a registry (the config's `backbone`,
`proposal_generator` and `roi_heads` fields), as torchvision's GeneralizedRCNN composes them.

What `extract.Detector` asks of each part:
- backbone: `forward(images)` (B, 3, H, W) → one (B, C, H / S, W / S) feature map, and its
  `output_shape` (`ShapeSpec`: C and S), which the RPN and the RoI head are built for.
- proposal generator: `propose(features, input_hws)` → per image (boxes in input pixels,
  objectness logits), `forward(features, input_hw)` for one image, and `rpn_head` / `anchors`
  / `box_coder` for training.
- RoI heads: `box_features(maps, boxes)` (per image a (1, C, h, w) map and its (N, 4) boxes) →
  (sum N, D) features, `forward(maps, boxes)` → per image `BoxPredictions`, `box_predictor`
  (with `attribute_logits`) and `box_coder`.

A new part is a module with that interface plus one `register_part` call; its parameter names
are checkpoint keys under `backbone.`, `proposal_generator.` or `roi_heads.`. A part's `shape`
says, from the config alone, what it outputs: the backbone its feature map, the RoI head its
feature size (`DetectorConfig.feature_dim`, which a pipeline checks before anything is built).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ShapeSpec:
    channels: int
    stride: int | None = None  # input pixels per feature-map cell; None: one vector per RoI


@dataclass(frozen=True)
class Part:
    name: str
    build: Callable[..., nn.Module]  # (DetectorConfig) → a backbone; (DetectorConfig, ShapeSpec) → a head
    summary: str
    shape: Callable[[Any], ShapeSpec] | None = None  # (DetectorConfig) → what the part outputs


PARTS: dict[str, dict[str, Part]] = {"backbone": {}, "proposal_generator": {}, "roi_heads": {}}


def register_part(kind: str, part: Part) -> None:
    if kind not in PARTS:
        raise ValueError(f"part kind {kind!r}: expected one of {', '.join(PARTS)}")
    PARTS[kind][part.name] = part


def build_part(kind: str, cfg, *inputs: ShapeSpec) -> nn.Module:
    """The module of the part that `cfg.<kind>` names (the config checked the name when it loaded),
    built for `inputs`: a head for the backbone's output shape."""
    return PARTS[kind][getattr(cfg, kind)].build(cfg, *inputs)


def part_shape(kind: str, cfg) -> ShapeSpec:
    return PARTS[kind][getattr(cfg, kind)].shape(cfg)


def lazy(path: str) -> Callable:
    """The function or class `module:name`, imported when first called: the registry (which configs
    check their names against when they load, `vlbert --help` among them) stays free of torch."""
    module, name = path.split(":")
    return lambda *args: getattr(importlib.import_module(module), name)(*args)


register_part("backbone", Part("resnet_c4", lazy("extract.modeling.resnet:ResNetC4"),
                               "ResNet or ResNeXt stem and res2-res4, output stride 16",
                               lazy("extract.modeling.resnet:resnet_c4_shape")))
register_part("proposal_generator", Part("rpn", lazy("extract.modeling.rpn:RPN"),
                                         "region proposal network on the backbone's map"))
register_part("roi_heads", Part("res5", lazy("extract.modeling.roi_heads:Res5ROIHeads"),
                                "RoI pooling on the backbone's map, res5, mean, box and attribute heads",
                                lazy("extract.modeling.roi_heads:res5_shape")))
