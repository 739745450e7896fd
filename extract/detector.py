"""The extraction detector: a Faster R-CNN C4 whose module names are detectron2's checkpoint keys.

Composed of three parts picked by config name (`extract.modeling.parts`): a backbone, a proposal
generator and RoI heads. Two ways to describe an image's regions, both also returning the
whole-image RoI feature: `detect` (proposals → box head → bottom-up-attention selection) and
`describe` (the caller's boxes, order kept). Images of one input size run through the trunk as
one batch, without padding; res5 runs over the RoIs of the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Sequence

import numpy as np
import torch
from torch import nn

from extract.checkpoint import (check_recorded_buffers, detectron2_names, fill_folded_norms, load_weights,
                                read_state_dict)
from extract.config import DetectorConfig
from extract.modeling.boxes import clip_boxes
from extract.modeling.parts import build_part
from extract.modeling.res5_layouts import DEFAULT_RES5_LAYOUT
from extract.modeling.resnet import ConvNorm
from extract.modeling.roi_heads import BoxPredictions
from extract.modeling.speed_paths import speed_paths as checked_speed_paths
from extract.preprocess import PreparedImage, masked_images, prepare_image, transferred
from extract.presets import load_config
from extract.selection import select_boxes_batch
from vlbert.utils.device import check_device
from vlbert.utils.errors import FAILED, UserError
from vlbert.utils.precision import precision as find_precision

# Images per trunk pass: one batch holds each image's activations (about 150 MB at BUTD size in float32).
TRUNK_BATCH = 16


class BoxError(UserError):
    """Boxes given for an image that cannot be pooled; the message names the box."""

    exit_status = FAILED


@dataclass
class RegionFeatures:
    """One image's regions. Boxes are xyxy in original-image pixels; background is the last class."""

    boxes: torch.Tensor  # (N, 4) float32
    features: torch.Tensor  # (N, D) float32
    class_probs: torch.Tensor  # (N, C + 1)
    objects_id: torch.Tensor  # (N,) int64: argmax over the foreground classes
    objects_conf: torch.Tensor  # (N,) its probability
    attrs_id: torch.Tensor | None  # (N,) int64: argmax over the attributes, "no attribute" excluded
    attrs_conf: torch.Tensor | None
    image_feature: torch.Tensor  # (D,) the whole-image box's feature
    image_height: int
    image_width: int
    box_source: str  # "proposals", "regressed" or "given"

    def numpy(self) -> dict[str, np.ndarray | int | str | None]:
        return regions_numpy([self])[0]


REGION_ARRAYS = ("boxes", "features", "class_probs", "objects_id", "objects_conf", "attrs_id", "attrs_conf",
                 "image_feature")
REGION_SCALARS = ("image_height", "image_width", "box_source")


def regions_numpy(regions: Sequence[RegionFeatures],
                  arrays: Sequence[Collection[str]] | None = None) -> list[dict[str, np.ndarray | int | str | None]]:
    """Each region set's tensor fields as NumPy arrays (None where a field is None) and its scalars,
    in one device→host copy for all of them: the tensors' bytes are concatenated on the device,
    copied once and split on the host. `arrays[i]` names the tensor fields wanted of `regions[i]`
    (default: every one), so that nothing is copied that nobody reads."""
    results = [{name: getattr(r, name) for name in (REGION_ARRAYS if arrays is None else arrays[i])}
               for i, r in enumerate(regions)]
    parts = [(result, name, value.detach()) for result in results for name, value in result.items()
             if value is not None]
    # Widest dtypes first, so that every part starts aligned for its dtype in the host buffer.
    parts.sort(key=lambda part: -part[2].element_size())
    if parts:
        host = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, _, t in parts]).cpu().numpy()
        offset = 0
        for result, name, t in parts:
            size = t.numel() * t.element_size()
            dtype = torch.empty(0, dtype=t.dtype).numpy().dtype
            result[name] = host[offset:offset + size].view(dtype).reshape(t.shape)
            offset += size
    for result, r in zip(results, regions):
        result.update({name: getattr(r, name) for name in REGION_SCALARS})
    return results


class Detector(nn.Module):
    def __init__(self, cfg: DetectorConfig, precision: str = "fp32", res5_layout: str = DEFAULT_RES5_LAYOUT,
                 speed_paths: Collection[str] = ()) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = build_part("backbone", cfg)
        self.proposal_generator = build_part("proposal_generator", cfg, self.backbone.output_shape)
        self.roi_heads = build_part("roi_heads", cfg, self.backbone.output_shape)
        self.precision = precision
        self.res5_layout = res5_layout
        self.speed_paths = speed_paths
        self.init_weights(cfg.init_seed)
        self.eval()

    @classmethod
    def build(cls, detector: str | DetectorConfig = "butd-vg", weights: str | Path | None = None,
              device: str | torch.device = "cpu", precision: str = "fp32", res5_layout: str = DEFAULT_RES5_LAYOUT,
              speed_paths: Collection[str] = (), **overrides) -> "Detector":
        """A preset name, YAML file or config; detectron2-named weights if given, else seeded random ones.

        `precision` (`vlbert.utils.precision.PRECISIONS`): fp32 (the reference numbers), tf32
        (CUDA only) or bf16, for `detect` and `describe`. `res5_layout`
        (`extract.modeling.res5_layouts.RES5_LAYOUTS`): how the RoI head runs res5, for every path
        (`detect`, `describe`, `box_features`): dilated (the reference numbers) or polyphase.
        `speed_paths` (`extract.modeling.speed_paths.SPEED_PATHS`): the ways of running faster it takes;
        none by default (the reference numbers).
        """
        device = check_device(device)
        find_precision(precision).check(torch.device(device))
        cfg = detector.replace(**overrides) if isinstance(detector, DetectorConfig) else load_config(detector, overrides)
        model = cls(cfg, precision, res5_layout, speed_paths)
        if weights is not None:
            model.load_checkpoint(weights)
        return model.to(device)

    @property
    def precision(self) -> str:
        return self._precision.name

    @precision.setter
    def precision(self, name: str) -> None:
        self._precision = find_precision(name)

    @property
    def res5_layout(self) -> str:
        return self.roi_heads.res5_layout

    @res5_layout.setter
    def res5_layout(self, name: str) -> None:
        self.roi_heads.res5_layout = name

    @property
    def speed_paths(self) -> tuple[str, ...]:
        """The speed paths taken, sorted (extract/modeling/speed_paths.py); the parts act on their names."""
        return self._speed_paths

    @speed_paths.setter
    def speed_paths(self, names: Collection[str]) -> None:
        """SpeedPathError where one does not exist or does not apply to the detector's precision."""
        self._speed_paths = checked_speed_paths(names, self.precision)
        self.proposal_generator.speed_paths = self.roi_heads.speed_paths = frozenset(self._speed_paths)

    def load_checkpoint(self, path: str | Path, trunk_only: bool = False) -> None:
        """Weights from .pkl, .pth or .safetensors under detectron2's names or a known scheme
        (`extract.checkpoint.KEY_MAPS`); refuses anything that does not fit.

        `trunk_only`: the RPN and box predictor may be absent, as in the Fast R-CNN weights of a
        converted VL-BERT checkpoint, which only the end-to-end stage's trunk and res5 use.
        """
        state = check_recorded_buffers(detectron2_names(read_state_dict(path), self.cfg, str(path)), {
            "cell_anchors": self.proposal_generator.cell_anchors.cpu(),
            "pixel_mean": torch.tensor(self.cfg.pixel_mean),
            "pixel_std": torch.tensor(self.cfg.pixel_std),
        }, str(path))
        optional = ("proposal_generator.", "roi_heads.box_predictor.") if trunk_only else ()
        load_weights(self, fill_folded_norms(state, self.state_dict()), source=str(path), optional_prefixes=optional)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """detectron2's initialisation, drawn from a private generator so the global RNG is untouched.

        One change: the last norm of each residual branch starts at gain 0.2 instead of 1, or the
        33 blocks of a random ResNet-101 grow activations ~2^33-fold and every proposal degenerates.
        """
        gen = torch.Generator().manual_seed(seed)
        for name, module in self.named_modules():
            if isinstance(module, ConvNorm) and name.endswith("conv3"):
                module.norm.weight.fill_(0.2)
            if isinstance(module, nn.Conv2d):
                if name.startswith("proposal_generator"):
                    module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * 0.01)
                else:
                    fan_out = module.out_channels * module.kernel_size[0] * module.kernel_size[1]
                    module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * (2.0 / fan_out) ** 0.5)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Linear):
                std = 0.001 if name.endswith("bbox_pred") else 0.01
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
                module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * 0.01)

    @property
    def device(self) -> torch.device:
        return self.roi_heads.box_predictor.cls_score.weight.device

    def prepare(self, image: np.ndarray) -> PreparedImage:
        """(H, W, 3) uint8 RGB array → the network input on the detector's device."""
        return prepare_image(image, self.cfg, self.device)

    def box_features(self, images: Sequence[PreparedImage], boxes: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per image (N_i, D) features of boxes given in input pixels; differentiable (end-to-end tuning).

        Runs in the caller's precision (the trainer's autocast), not the detector's.
        """
        images = self._on_device(images)
        features = self.roi_heads.box_features(self.feature_maps(images), [b.to(self.device) for b in boxes])
        return list(features.split([len(b) for b in boxes]))

    @torch.no_grad()
    def detect(self, images: Sequence[PreparedImage]) -> list[RegionFeatures]:
        """Regions chosen by the detector: proposals, box head, bottom-up-attention selection."""
        images = self._on_device(images)
        with self._precision.applied(self.device):
            res4: list[torch.Tensor] = [torch.empty(0)] * len(images)
            proposals: list[torch.Tensor] = [torch.empty(0)] * len(images)
            for group, features in self._trunk(images):
                sizes = [(images[i].input_height, images[i].input_width) for i in group]
                for i, f, (p, _) in zip(group, features.split(1), self.proposal_generator.propose(features, sizes)):
                    res4[i], proposals[i] = f, p
            pooled = [torch.cat((image.to_input(image.whole_image_box()), p)) for image, p in zip(images, proposals)]
            predictions = [_split_first(pred) for pred in self.roi_heads(res4, pooled)]
        class_probs = [pred.class_logits.float().softmax(dim=1) for _, pred in predictions]
        selected = select_boxes_batch(proposals, class_probs, self.cfg.score_thresh, self.cfg.nms_thresh,
                                      self.cfg.min_boxes, self.cfg.max_boxes)
        results = []
        for image, p, (whole, pred), probs, (keep, _) in zip(images, proposals, predictions, class_probs, selected):
            boxes = p[keep]
            if self.cfg.box_source == "regressed":
                boxes = self._regress(boxes, pred, keep, probs, image)
            results.append(self._regions(image, boxes, pred.take(keep), whole, self.cfg.box_source))
        return results

    @torch.no_grad()
    def describe(self, images: Sequence[PreparedImage], boxes: Sequence[torch.Tensor | np.ndarray],
                 pixel_masks: Sequence[torch.Tensor | np.ndarray | None] | None = None) -> list[RegionFeatures]:
        """Regions for the caller's boxes (original pixels, xyxy, order kept).

        Boxes are clamped to the image (the clamped boxes are returned); a box that is not finite,
        inverted, or empty after clamping is a BoxError. `pixel_masks[i]` (N_i,) bool selects boxes
        whose pixels are zeroed in the input before the CNN runs (masked-RoI variants). An image may
        appear several times (its clean pass and masked variants): all its passes share an input
        size, so they run through the trunk together.
        """
        images = self._on_device(images)
        boxes = checked_boxes(boxes, images)
        pooled = [image.to_input(torch.cat((image.whole_image_box(), b))) for image, b in zip(images, boxes)]
        images = masked_images(images, [p[1:] for p in pooled], pixel_masks)
        with self._precision.applied(self.device):
            predictions = self.roi_heads(self.feature_maps(images), pooled)
        return [
            self._regions(image, b, pred, whole, "given")
            for image, b, (whole, pred) in zip(images, boxes, map(_split_first, predictions))
        ]

    def _trunk(self, images: Sequence[PreparedImage]) -> list[tuple[list[int], torch.Tensor]]:
        """(indices, their batched trunk output) for each run of images sharing an input tensor size.

        No padding, and convolutions whose per-image numbers do not depend on the batch
        (`extract.modeling.conv`): on the CPU in float32 an image's outputs are bitwise the same in
        any batch (tests/extract/test_detector_batching.py). On CUDA, cuDNN may pick another algorithm for
        another batch size, which changes the rounding. Channels-last there, the layout its tensor
        cores take.
        """
        by_size: dict[tuple[int, ...], list[int]] = {}
        for i, image in enumerate(images):
            by_size.setdefault(tuple(image.tensor.shape), []).append(i)
        runs = []
        for indices in by_size.values():
            for start in range(0, len(indices), TRUNK_BATCH):
                group = indices[start:start + TRUNK_BATCH]
                x = torch.stack([images[i].tensor for i in group])
                if x.is_cuda:
                    x = x.contiguous(memory_format=torch.channels_last)
                runs.append((group, self.backbone(x)))
        return runs

    def feature_maps(self, images: Sequence[PreparedImage]) -> list[torch.Tensor]:
        """Each image's (1, C, h, w) trunk output, in order (views into the batched outputs)."""
        res4: list[torch.Tensor] = [torch.empty(0)] * len(images)
        for group, features in self._trunk(images):
            for i, f in zip(group, features.split(1)):
                res4[i] = f
        return res4

    def _on_device(self, images: Sequence[PreparedImage]) -> list[PreparedImage]:
        """Images prepared elsewhere (on the CPU, in loader workers) moved to the detector's device."""
        device = self.device
        return [image if image.tensor.device == device
                else image.with_tensor(image.tensor.to(device, non_blocking=True)) for image in images]

    def _regress(self, boxes: torch.Tensor, pred: BoxPredictions, keep: torch.Tensor, probs: torch.Tensor,
                 image: PreparedImage) -> torch.Tensor:
        classes = probs[keep, :-1].argmax(dim=1)
        deltas = pred.box_deltas[keep].view(len(keep), -1, 4)[torch.arange(len(keep), device=keep.device), classes]
        regressed = self.roi_heads.box_coder.decode(deltas, boxes)
        return clip_boxes(regressed, image.input_height, image.input_width)

    def _regions(self, image: PreparedImage, boxes: torch.Tensor, pred: BoxPredictions, whole: BoxPredictions,
                 box_source: str) -> RegionFeatures:
        """`boxes` are in input pixels for detected regions and original pixels for given ones."""
        if box_source != "given":
            boxes = image.to_original(boxes)
        probs = pred.class_logits.float().softmax(dim=1)
        objects_conf, objects_id = probs[:, :-1].max(dim=1)
        attrs_id = attrs_conf = None
        if pred.attr_logits is not None:
            attrs_conf, attrs_id = pred.attr_logits.float().softmax(dim=1)[:, :-1].max(dim=1)
        return RegionFeatures(
            boxes=boxes.float(), features=pred.features.float(), class_probs=probs.float(),
            objects_id=objects_id, objects_conf=objects_conf.float(), attrs_id=attrs_id,
            attrs_conf=None if attrs_conf is None else attrs_conf.float(),
            image_feature=whole.features[0].float(), image_height=image.height, image_width=image.width,
            box_source=box_source,
        )


def _split_first(pred: BoxPredictions) -> tuple[BoxPredictions, BoxPredictions]:
    """(the whole-image box's predictions, the other boxes')."""
    return pred.take(slice(0, 1)), pred.take(slice(1, None))


def checked_boxes(boxes: Sequence[torch.Tensor | np.ndarray], images: Sequence[PreparedImage]) -> list[torch.Tensor]:
    """Each image's (N, 4) float32 boxes (original pixels, xyxy) clamped to it, on the images'
    device; BoxError names a box that is not finite, inverted, or empty once clamped. Every
    backend's `describe` checks its boxes so. The checks run on the host: boxes on the device
    travel there in one copy, and host boxes to the device in one copy."""
    boxes = [torch.as_tensor(b, dtype=torch.float32).detach().reshape(-1, 4) for b in boxes]
    for b, image in zip(transferred(boxes, torch.device("cpu")), images):
        _check_boxes(b, image)
    device = images[0].tensor.device if images else torch.device("cpu")
    return [clip_boxes(b, image.height, image.width) for b, image in zip(transferred(boxes, device), images)]


def _check_boxes(boxes: torch.Tensor, image: PreparedImage) -> None:
    size = f"{image.width}x{image.height}"
    for i, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        if not all(np.isfinite((x1, y1, x2, y2))):
            raise BoxError(f"box {i} {[x1, y1, x2, y2]}: not finite")
        if x2 < x1 or y2 < y1:
            raise BoxError(f"box {i} {[x1, y1, x2, y2]}: inverted (expected x1 <= x2 and y1 <= y2)")
    clamped = clip_boxes(boxes, image.height, image.width)
    empty = (clamped[:, 2] <= clamped[:, 0]) | (clamped[:, 3] <= clamped[:, 1])
    if empty.any():
        i = int(empty.nonzero()[0])
        raise BoxError(f"box {i} {boxes[i].tolist()}: empty inside the {size} image")
