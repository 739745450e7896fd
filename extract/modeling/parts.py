"""The detector's three parts, each picked by name from a registry (the config's `backbone`,
`proposal_generator` and `roi_heads` fields), as torchvision's GeneralizedRCNN composes them.

What `extract.Detector` asks of each part:
- backbone: `forward(images)` (B, 3, H, W) → one (B, C, H / 16, W / 16) feature map.
- proposal generator: `propose(features, image_sizes)` → per image (boxes in input pixels,
  objectness logits), `forward(features, image_size)` for one image, and `rpn_head` / `anchors`
  / `box_coder` for training.
- RoI heads: `box_features(maps, boxes)` (per image a (1, C, h, w) map and its (N, 4) boxes) →
  (sum N, D) features, `forward(maps, boxes)` → per image `BoxPredictions`, `box_predictor`
  (with `attribute_logits`) and `box_coder`.

A new part is a module with that interface plus one `register_part` call; its parameter names
are checkpoint keys under `backbone.`, `proposal_generator.` or `roi_heads.`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Part:
    name: str
    build: Callable[..., nn.Module]  # (DetectorConfig) → the module
    summary: str


PARTS: dict[str, dict[str, Part]] = {"backbone": {}, "proposal_generator": {}, "roi_heads": {}}


def register_part(kind: str, part: Part) -> None:
    if kind not in PARTS:
        raise ValueError(f"part kind {kind!r}: expected one of {', '.join(PARTS)}")
    PARTS[kind][part.name] = part


def build_part(kind: str, cfg) -> nn.Module:
    """The module of the part that `cfg.<kind>` names (the config checked the name when it loaded)."""
    return PARTS[kind][getattr(cfg, kind)].build(cfg)


def module_class(path: str) -> Callable[..., nn.Module]:
    """A builder that imports `module:Class` when it builds: the registry (which configs check their
    names against when they load, `vlbert --help` among them) stays free of torch."""
    module, name = path.split(":")
    return lambda cfg: getattr(importlib.import_module(module), name)(cfg)


register_part("backbone", Part("resnet_c4", module_class("extract.modeling.resnet:ResNetC4"),
                               "ResNet stem and res2-res4, output stride 16"))
register_part("proposal_generator", Part("rpn", module_class("extract.modeling.rpn:RPN"),
                                         "region proposal network on the res4 map"))
register_part("roi_heads", Part("res5", module_class("extract.modeling.roi_heads:Res5ROIHeads"),
                                "RoI pooling on res4, res5, mean, box and attribute heads"))
