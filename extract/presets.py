"""Named detector configurations, and loading a detector config by preset name or from a YAML file
(`base: PRESET` plus fields). A new preset is one record in `PRESETS`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from extract.config import ConfigError, DetectorConfig, apply_overrides
from vlbert.utils.typed_config import load_with_bases, located

PRESETS: dict[str, DetectorConfig] = {
    # Bottom-up-attention Faster R-CNN on Visual Genome: 1600 classes, 400 attributes.
    "butd-vg": DetectorConfig(),
    # detectron2 COCO-Detection/faster_rcnn_R_101_C4_3x.
    "d2-r101-c4": DetectorConfig(
        name="d2-r101-c4",
        stem_pool="standard",
        res5_stride=2,
        res5_dilation=1,
        rpn_hidden_channels=1024,
        anchor_sizes=(32.0, 64.0, 128.0, 256.0, 512.0),
        rpn_post_nms_topk=1000,
        pooler="roialign",
        num_classes=80,
        num_attributes=0,
        pixel_mean=(103.53, 116.28, 123.675),
        min_size=800,
        max_size=1333,
    ),
    # The butd-vg architecture scaled down for tests and the demo.
    "tiny": DetectorConfig(
        name="tiny",
        res_blocks=(1, 1, 1, 1),
        stem_out_channels=8,
        res2_out_channels=32,
        bottleneck_channels=8,
        rpn_hidden_channels=32,
        anchor_sizes=(16.0, 32.0, 64.0, 128.0),
        rpn_pre_nms_topk=600,
        rpn_post_nms_topk=100,
        num_classes=6,
        num_attributes=8,
        attr_embed_dim=16,
        attr_hidden_dim=32,
        min_size=128,
        max_size=192,
        min_boxes=4,
        max_boxes=20,
    ),
    # The Fast R-CNN of the official VL-BERT checkpoints (jackroos/VL-BERT common/fast_rcnn.py,
    # common/backbone/resnet/resnet.py, cfgs/*/base_*.yaml), which `vlbert convert-official` writes
    # out: BUTD's ResNet-101 C4 with the torchvision stem pool, and maskrcnn-benchmark's legacy
    # RoIAlign (no half-pixel offset, RoI sides of at least one cell) with sampling ratio 1.
    # Its images: RGB loaded, BGR x 255, minus the means, std 1; short side 600, long <= 1000.
    "vlbert-official": DetectorConfig(
        name="vlbert-official-fast-rcnn",
        stem_pool="standard",
        pooler="roialign_legacy",
        pooler_sampling_ratio=1,
    ),
    # VinVL's detector (Zhang et al. 2021; scene_graph_benchmark, sgg_configs/vgattr/vinvl_x152c4.yaml):
    # ResNeXt-152 32x8d C4 trained on Visual Genome and more, 1594 classes and 524 attributes (the file
    # counts background and "no attribute": 1595, 525). maskrcnn-benchmark's layout: stride in the 3x3
    # conv, the torchvision stem pool, res5 with stride 2 on 14x14 legacy-RoIAlign features, RPN
    # anchors 32-512 on res4, 6000 proposals before NMS and 300 after, box selection at 0.2 with
    # 10-100 boxes. Its weights use maskrcnn-benchmark's key names (`KEY_MAPS`). The input settings
    # are maskrcnn-benchmark's defaults for caffe-style weights (BGR 0-255, the caffe means, std 1)
    # at BUTD's 600/1000 sides; check them against the config you run.
    "vinvl-x152c4": DetectorConfig(
        name="vinvl-x152c4",
        res_blocks=(3, 8, 36, 3),
        bottleneck_channels=256,
        num_groups=32,
        stride_in_1x1=False,
        stem_pool="standard",
        res5_stride=2,
        res5_dilation=1,
        rpn_hidden_channels=1024,
        anchor_sizes=(32.0, 64.0, 128.0, 256.0, 512.0),
        pooler="roialign_legacy",
        num_classes=1594,
        num_attributes=524,
    ),
}


def load_config(preset_or_file: str, overrides: Mapping[str, Any] | None = None) -> DetectorConfig:
    """A preset name, or a YAML file with an optional `base: PRESET` and field values."""
    if preset_or_file in PRESETS:
        cfg = PRESETS[preset_or_file]
    elif preset_or_file.endswith((".yaml", ".yml")):
        cfg = _load_yaml(Path(preset_or_file))
    else:
        raise ConfigError(
            f"detector {preset_or_file!r}: not a preset ({', '.join(PRESETS)}) nor a .yaml file"
        )
    return apply_overrides(cfg, overrides or {})


def _load_yaml(path: Path) -> DetectorConfig:
    """A detector YAML file: fields over its `base`, a preset or another detector YAML file (relative to
    the file naming it; which may name another), whose fields it replaces one by one."""
    if not path.is_file():
        raise ConfigError(f"detector config {path}: no such file")
    data, lines = load_with_bases(path, ConfigError, lambda file: f"detector config {file}",
                                  keeps=lambda base: isinstance(base, str) and base in PRESETS,
                                  expected=f"a preset ({', '.join(PRESETS)}) or a detector YAML file")
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"detector config {path}: expected a mapping of field: value")
    base = data.pop("base", "butd-vg")  # a preset: load_with_bases has merged the files
    data.setdefault("name", path.stem)
    try:
        return apply_overrides(PRESETS[base], data)
    except ConfigError as exc:
        raise ConfigError(located(f"detector config {path}", lines, exc)) from None
