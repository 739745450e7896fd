"""The detectron2 backend: any detectron2 Faster R-CNN (C4 or FPN) run by detectron2 itself.

detectron2 computes the backbone, the proposals, the RoI pooling and the box head; the rest is
shared with our detector so that a store means the same whichever backend wrote it: input
preparation (`prepare_image` from the model's INPUT/PIXEL_* settings, bilinear resizing without
antialiasing rather than detectron2's PIL resize), pixel masking of masked-pixel variants (the
mean colour after normalisation, before the CNN), given-box checks, and the bottom-up-attention
selection over the box head's class probabilities in detection mode (the stored boxes are the
pooled proposals). The feature of a box is what the box predictor reads: the res5 mean for C4
heads (2048-d for R-50/101), the box head's last fc for FPN heads (1024-d).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import yaml
from detectron2.config import CfgNode, get_cfg
from detectron2.data import MetadataCatalog
from detectron2.modeling import GeneralizedRCNN, build_model
from detectron2.modeling.roi_heads import Res5ROIHeads, StandardROIHeads
from detectron2.structures import Boxes, ImageList
from torch import nn

from extract.checkpoint import CheckpointError, file_sha256, fill_folded_norms, load_weights, read_state_dict
from extract.config import SELECTION_FIELDS, ConfigError, DetectorConfig, apply_overrides
from extract.detector import RegionFeatures, checked_boxes
from extract.preprocess import PreparedImage, masked_images, prepare_image
from extract.selection import select_boxes_batch
from vlbert.utils.device import check_device
from vlbert.utils.typed_config import load_yaml

INIT_SEED = 0  # random weights (no --weights) are drawn from this seed, so a rerun resumes the same model
INPUT_FORMATS = ("BGR", "RGB")


@dataclass(frozen=True)
class BoxHeadLayout:
    """How one family of detectron2 RoI heads turns pooled regions into the features its box
    predictor reads: the feature maps it pools, its pooler, and what runs on the pooled grid."""

    heads: type
    in_features: str  # attribute of the heads naming the pooled feature maps
    pooler: str  # attribute of the heads holding its ROIPooler
    head: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (heads, pooled regions) → (R, D)


# Matched on the exact class: subclasses such as CascadeROIHeads run several box heads.
BOX_HEAD_LAYOUTS = (
    BoxHeadLayout(Res5ROIHeads, "in_features", "pooler", lambda heads, x: heads.res5(x).mean(dim=(2, 3))),
    BoxHeadLayout(StandardROIHeads, "box_in_features", "box_pooler", lambda heads, x: heads.box_head(x)),
)


@dataclass(frozen=True)
class Detectron2Config:
    """What the job, the store's meta.json and `prepare_image` need to know about a detectron2 model.

    `detectron2_model` is the model's resolved MODEL section (after _BASE_ files and overrides,
    without DEVICE and WEIGHTS), so resuming a store with any other model is refused field by field.
    """

    name: str
    config_sha256: str  # of the YAML file named by --detector d2:FILE
    detectron2_model: dict[str, Any]
    feature_dim: int
    num_classes: int
    class_names: tuple[str, ...]
    input_format: str
    pixel_mean: tuple[float, float, float]
    pixel_std: tuple[float, float, float]
    min_size: int
    max_size: int
    score_thresh: float
    nms_thresh: float
    min_boxes: int
    max_boxes: int
    box_source: str = "proposals"
    backend: str = "detectron2"
    num_attributes: int = 0
    attribute_names: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))


class Detectron2Extractor:
    """A detectron2 GeneralizedRCNN behind the RegionExtractor interface (see extract.backends)."""

    def __init__(self, model: GeneralizedRCNN, cfg: Detectron2Config, layout: BoxHeadLayout) -> None:
        self.model = model.eval()
        self.cfg = cfg
        self.layout = layout

    @classmethod
    def build(cls, config_file: str | Path, weights: str | Path | None = None, device: str = "cpu",
              overrides: Mapping[str, Any] | None = None) -> "Detectron2Extractor":
        """The model of a detectron2 YAML config, with `weights` (a detectron2 checkpoint) or seeded
        random ones. `overrides`: the box selection fields (score_thresh, nms_thresh, min_boxes,
        max_boxes) and detectron2 config keys (e.g. MODEL.RPN.POST_NMS_TOPK_TEST)."""
        device = check_device(device)
        config_file = Path(config_file)
        where = f"--detector d2:{config_file}"
        overrides = dict(overrides or {})
        selection = _selection(where, {k: overrides.pop(k) for k in SELECTION_FIELDS if k in overrides})
        d2_cfg = _load_detectron2_config(where, config_file, overrides)
        d2_cfg.MODEL.DEVICE = str(device)
        try:
            with torch.random.fork_rng(devices=[]):  # the model is built on the CPU, then moved
                torch.manual_seed(INIT_SEED)
                model = build_model(d2_cfg)
        except Exception as exc:  # noqa: BLE001 - any failure to build is this config's, reported with its name
            raise ConfigError(f"{where}: detectron2 cannot build its model ({type(exc).__name__}: {exc})") from None
        if not isinstance(model, GeneralizedRCNN) or model.proposal_generator is None:
            raise ConfigError(f"{where}: MODEL.META_ARCHITECTURE {d2_cfg.MODEL.META_ARCHITECTURE} with proposal "
                              f"generator {d2_cfg.MODEL.PROPOSAL_GENERATOR.NAME}: the detectron2 backend needs a "
                              "GeneralizedRCNN that makes its own proposals (RPN)")
        layout = _box_head_layout(model, where)
        if weights is not None:
            _load_checkpoint(model, Path(weights))
        cfg = Detectron2Config(
            name=config_file.stem, config_sha256=file_sha256(config_file),
            detectron2_model=_recorded_model_config(d2_cfg),
            feature_dim=model.roi_heads.box_predictor.cls_score.in_features,
            num_classes=model.roi_heads.num_classes, class_names=_class_names(d2_cfg),
            **_input_fields(where, d2_cfg), **selection,
        )
        return cls(model, cfg, layout)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def prepare(self, image: np.ndarray) -> PreparedImage:
        """(H, W, 3) uint8 RGB array → the network input on the model's device."""
        return prepare_image(image, self.cfg, self.device)

    @torch.no_grad()
    def detect(self, images: Sequence[PreparedImage]) -> list[RegionFeatures]:
        """detectron2's proposals and box head, then the bottom-up-attention selection."""
        images = [self._on_device(image) for image in images]
        maps, proposals = [], []
        for image in images:
            image_list, features = self._backbone(image)
            maps.append(features)
            proposals.append(self.model.proposal_generator(image_list, features, None)[0][0].proposal_boxes.tensor)
        rois = [torch.cat((image.to_input(image.whole_image_box()), p)) for image, p in zip(images, proposals)]
        heads = self._box_head(maps, rois)
        selected = select_boxes_batch(proposals, [probs[1:] for _, probs in heads], self.cfg.score_thresh,
                                      self.cfg.nms_thresh, self.cfg.min_boxes, self.cfg.max_boxes)
        return [_regions(image, image.to_original(p[keep]), features[1:][keep], probs[1:][keep], features[0],
                         "proposals")
                for image, p, (features, probs), (keep, _) in zip(images, proposals, heads, selected)]

    @torch.no_grad()
    def describe(self, images: Sequence[PreparedImage], boxes: Sequence[torch.Tensor | np.ndarray],
                 pixel_masks: Sequence[torch.Tensor | np.ndarray | None] | None = None) -> list[RegionFeatures]:
        """Regions for the caller's boxes (original pixels, xyxy, order kept, clamped to the image)."""
        images = [self._on_device(image) for image in images]
        boxes = checked_boxes(boxes, images)
        rois = [image.to_input(torch.cat((image.whole_image_box(), b))) for image, b in zip(images, boxes)]
        images = masked_images(images, [r[1:] for r in rois], pixel_masks)
        maps = [self._backbone(image)[1] for image in images]
        return [
            _regions(image, b, features[1:], probs[1:], features[0], "given")
            for image, b, (features, probs) in zip(images, boxes, self._box_head(maps, rois))
        ]

    def _on_device(self, image: PreparedImage) -> PreparedImage:
        return image.with_tensor(image.tensor.to(self.device, non_blocking=True))

    def _backbone(self, image: PreparedImage) -> tuple[ImageList, dict[str, torch.Tensor]]:
        """One image through the backbone, padded as the backbone requires (FPN: to a multiple of
        32) with zeros, the mean colour, as detectron2 pads; its size is the unpadded input's."""
        backbone = self.model.backbone
        padded = ImageList.from_tensors([image.tensor], backbone.size_divisibility,
                                        padding_constraints=backbone.padding_constraints)
        image_list = ImageList(padded.tensor, [(image.input_height, image.input_width)])
        return image_list, backbone(image_list.tensor)

    def _box_head(self, maps: list[dict[str, torch.Tensor]],
                  rois: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image (features, class probabilities) of its RoIs (input pixels); the box head runs
        once over the RoIs of every image."""
        heads, layout = self.model.roi_heads, self.layout
        pooler, names = getattr(heads, layout.pooler), getattr(heads, layout.in_features)
        pooled = torch.cat([pooler([f[name] for name in names], [Boxes(r)]) for f, r in zip(maps, rois)])
        features = layout.head(heads, pooled)
        regions = [Boxes(r) for r in rois]
        probs = heads.box_predictor.predict_probs(heads.box_predictor(features), regions)
        return list(zip(features.split([len(r) for r in rois]), probs))


def _regions(image: PreparedImage, boxes: torch.Tensor, features: torch.Tensor, probs: torch.Tensor,
             image_feature: torch.Tensor, box_source: str) -> RegionFeatures:
    objects_conf, objects_id = probs[:, :-1].max(dim=1)
    return RegionFeatures(
        boxes=boxes.float(), features=features.float(), class_probs=probs.float(), objects_id=objects_id,
        objects_conf=objects_conf.float(), attrs_id=None, attrs_conf=None, image_feature=image_feature.float(),
        image_height=image.height, image_width=image.width, box_source=box_source,
    )


def _box_head_layout(model: GeneralizedRCNN, where: str) -> BoxHeadLayout:
    heads = model.roi_heads
    for layout in BOX_HEAD_LAYOUTS:
        if type(heads) is layout.heads:
            return layout
    supported = ", ".join(layout.heads.__name__ for layout in BOX_HEAD_LAYOUTS)
    raise ConfigError(f"{where}: RoI heads {type(heads).__name__} are not supported by the detectron2 backend "
                      f"(supported: {supported})")


def _selection(where: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The bottom-up-attention selection fields: our detector's defaults, checked the same way."""
    try:
        checked = apply_overrides(DetectorConfig(), overrides)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if checked.box_source != "proposals":
        raise ConfigError(f"{where}: box_source={checked.box_source!r}: the detectron2 backend stores the pooled "
                          "proposals (box_source=proposals)")
    return {name: getattr(checked, name) for name in SELECTION_FIELDS}


def _load_detectron2_config(where: str, path: Path, overrides: Mapping[str, Any]) -> CfgNode:
    if not path.is_file():
        raise ConfigError(f"{where}: no such file")
    load_yaml(path, ConfigError, where)  # bounded and UTF-8, as every config file
    cfg = get_cfg()
    try:
        cfg.merge_from_file(str(path), allow_unsafe=False)  # detectron2's default falls back to yaml.unsafe_load
    except Exception as exc:  # noqa: BLE001 - YAML, unknown keys, bad _BASE_: all reported with the file
        raise ConfigError(f"{where}: detectron2 cannot load this config ({type(exc).__name__}: {exc})") from None
    for key, value in overrides.items():
        try:
            cfg.merge_from_list([key, value])
        except Exception as exc:  # noqa: BLE001 - an unknown key or a value of the wrong type
            raise ConfigError(f"{where}: override {key}={value!r}: neither a box selection field "
                              f"({', '.join(SELECTION_FIELDS[:4])}) nor a valid detectron2 config entry "
                              f"({type(exc).__name__}: {exc})") from None
    return cfg


def _input_fields(where: str, cfg: CfgNode) -> dict[str, Any]:
    """The INPUT and PIXEL_* settings that `prepare_image` reads, checked."""
    fields = {
        "input_format": cfg.INPUT.FORMAT, "pixel_mean": tuple(map(float, cfg.MODEL.PIXEL_MEAN)),
        "pixel_std": tuple(map(float, cfg.MODEL.PIXEL_STD)),
        "min_size": int(cfg.INPUT.MIN_SIZE_TEST), "max_size": int(cfg.INPUT.MAX_SIZE_TEST),
    }
    problems = []
    if fields["input_format"] not in INPUT_FORMATS:
        problems.append(f"INPUT.FORMAT {fields['input_format']!r}: expected one of {', '.join(INPUT_FORMATS)}")
    if len(fields["pixel_mean"]) != 3 or len(fields["pixel_std"]) != 3:
        problems.append("MODEL.PIXEL_MEAN and MODEL.PIXEL_STD: expected three values each")
    if not 1 <= fields["min_size"] <= fields["max_size"]:
        problems.append(f"INPUT.MIN_SIZE_TEST {fields['min_size']}, INPUT.MAX_SIZE_TEST {fields['max_size']}: "
                        "expected 1 <= MIN_SIZE_TEST <= MAX_SIZE_TEST (images are always resized)")
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    return fields


def _recorded_model_config(cfg: CfgNode) -> dict[str, Any]:
    model = yaml.safe_load(cfg.MODEL.dump())
    for name in ("DEVICE", "WEIGHTS"):  # where it runs, and a path --weights replaces
        model.pop(name, None)
    return model


def _class_names(cfg: CfgNode) -> tuple[str, ...]:
    """The class names of the config's first test dataset, when detectron2 knows that dataset and
    its names fit the model; otherwise none (the store then has no vocabulary)."""
    if not cfg.DATASETS.TEST:
        return ()
    names = getattr(MetadataCatalog.get(cfg.DATASETS.TEST[0]), "thing_classes", None)
    return tuple(names) if names is not None and len(names) == cfg.MODEL.ROI_HEADS.NUM_CLASSES else ()


def _load_checkpoint(model: nn.Module, path: Path) -> None:
    """detectron2-named weights (.pkl, .pth, .safetensors), refusing anything that does not fit.

    Buffers detectron2 does not save (pixel mean/std, cell anchors) may still be in older
    checkpoints: they are dropped when they equal the model's and refused when they differ.
    """
    state = read_state_dict(path)
    saved = model.state_dict()
    unsaved = {k: v for k, v in model.named_buffers() if k not in saved}
    for key in [k for k in state if k in unsaved]:
        ours, theirs = unsaved[key].detach().cpu().float().reshape(-1), state.pop(key).float().reshape(-1)
        if theirs.numel() != ours.numel() or not torch.allclose(theirs, ours, atol=1e-3):
            raise CheckpointError(f"{path}: {key} in the checkpoint is {theirs.tolist()[:12]}, but the detectron2 "
                                  f"config gives {ours.tolist()[:12]}; set the config to match the checkpoint")
    load_weights(model, fill_folded_norms(state, saved), source=str(path))
