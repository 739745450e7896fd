"""Faster R-CNN training losses for `extract.Detector`: RPN, box head and attribute head.

Conventions follow detectron2 (and the bottom-up-attention attribute head): background is the
last class, "no attribute" the last attribute, L1 box losses normalised by the sampled count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from extract import Detector, PreparedImage
from extract.training.config import LossConfig
from extract.training.data import DetectionExample
from extract.training.targets import POSITIVE, match, sample



@dataclass
class ImageTargets:
    """One example's annotations on the device, boxes in the prepared image's input pixels."""

    boxes: torch.Tensor  # (G, 4)
    classes: torch.Tensor  # (G,)
    attributes: list[list[int]]

    @classmethod
    def of(cls, example: DetectionExample, image: PreparedImage) -> "ImageTargets":
        boxes = image.to_input(torch.as_tensor(example.boxes, dtype=torch.float32).reshape(-1, 4))
        return cls(boxes, torch.as_tensor(example.classes, dtype=torch.long, device=boxes.device),
                   example.attributes)


def rpn_losses(det: Detector, res4: torch.Tensor, targets: ImageTargets, cfg: LossConfig,
               generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Objectness BCE over sampled anchors and L1 on the positive anchors' deltas, for one image."""
    rpn = det.proposal_generator
    logits, deltas = rpn.rpn_head(res4)
    _, _, height, width = logits.shape
    logits = logits.permute(0, 2, 3, 1).reshape(-1)
    deltas = deltas.permute(0, 2, 3, 1).reshape(-1, 4)
    anchors = rpn.anchors(height, width)
    matched, labels = match(anchors, targets.boxes, cfg.rpn_negative_below, cfg.rpn_positive_from,
                            low_quality_positives=True)
    positive, negative = sample(labels, cfg.rpn_samples_per_image, cfg.rpn_positive_fraction, generator)
    sampled = torch.cat((positive, negative))
    objectness = (labels[sampled] == POSITIVE).float()
    target_deltas = rpn.box_coder.encode(anchors[positive], targets.boxes[matched[positive]])
    normaliser = cfg.rpn_samples_per_image
    return {
        "rpn_objectness": F.binary_cross_entropy_with_logits(logits[sampled], objectness, reduction="sum") / normaliser,
        "rpn_boxes": F.l1_loss(deltas[positive], target_deltas, reduction="sum") / normaliser,
    }


@dataclass
class SampledRois:
    boxes: torch.Tensor  # (R, 4) input pixels
    classes: torch.Tensor  # (R,) ground-truth class, num_classes for background
    target_boxes: torch.Tensor  # (R, 4) the matched ground-truth box (meaningful for foreground only)
    attributes: list[list[int]]  # per foreground RoI (in order), its object's attributes


def sample_rois(det: Detector, res4: torch.Tensor, image: PreparedImage, targets: ImageTargets,
                cfg: LossConfig, generator: torch.Generator) -> SampledRois:
    """Proposals plus the ground-truth boxes, matched at IoU 0.5 and sampled, foreground first."""
    proposals, _ = det.proposal_generator(res4, (image.input_height, image.input_width))
    candidates = torch.cat((proposals, targets.boxes))
    matched, labels = match(candidates, targets.boxes, cfg.roi_foreground_from, cfg.roi_foreground_from,
                            low_quality_positives=False)
    foreground, background = sample(labels, cfg.roi_samples_per_image, cfg.roi_positive_fraction, generator)
    sampled = torch.cat((foreground, background))
    classes = targets.classes[matched[sampled]].clone()
    classes[len(foreground):] = det.cfg.num_classes
    return SampledRois(candidates[sampled], classes, targets.boxes[matched[sampled]],
                       [targets.attributes[i] for i in matched[foreground].tolist()])


def attribute_loss(logits: torch.Tensor, attributes: list[list[int]], num_attributes: int) -> torch.Tensor:
    """Softmax CE against each of an object's attributes, weighted 1/count so every object counts once.

    An object without attributes is trained towards "no attribute" (the last index).
    """
    rows, labels, weights = [], [], []
    for row, attrs in enumerate(attributes):
        attrs = attrs or [num_attributes]
        rows += [row] * len(attrs)
        labels += attrs
        weights += [1.0 / len(attrs)] * len(attrs)
    if not rows:
        return logits.sum() * 0.0
    rows_t = torch.tensor(rows, device=logits.device)
    losses = F.cross_entropy(logits[rows_t], torch.tensor(labels, device=logits.device), reduction="none")
    return (losses * torch.tensor(weights, device=logits.device)).sum() / len(attributes)


def box_head_losses(det: Detector, res4: list[torch.Tensor], rois: list[SampledRois]) -> dict[str, torch.Tensor]:
    """Class CE, class-specific L1 box deltas and the attribute loss over the RoIs of a batch."""
    heads = det.roi_heads
    features = heads.box_features(res4, [r.boxes for r in rois])
    boxes, classes, target_boxes = (torch.cat([getattr(r, name) for r in rois])
                                    for name in ("boxes", "classes", "target_boxes"))
    num_classes = det.cfg.num_classes
    losses = {"roi_classes": F.cross_entropy(heads.box_predictor.cls_score(features), classes)}

    foreground = (classes < num_classes).nonzero().squeeze(1)
    deltas = heads.box_predictor.bbox_pred(features).view(len(features), num_classes, 4)
    target_deltas = heads.box_coder.encode(boxes[foreground], target_boxes[foreground])
    losses["roi_boxes"] = F.l1_loss(deltas[foreground, classes[foreground]], target_deltas,
                                    reduction="sum") / len(classes)
    if det.cfg.num_attributes > 0:
        # Foreground RoIs come first within each image, in the order their attribute lists are kept.
        attributes = [a for r in rois for a in r.attributes]
        logits = heads.box_predictor.attribute_logits(features[foreground], classes[foreground])
        losses["roi_attributes"] = attribute_loss(logits, attributes, det.cfg.num_attributes)
    return losses
