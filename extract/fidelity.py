"""How far a detector precision's outputs are from float32's, on the same images and weights."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torchvision.ops import box_iou

from extract.detector import Detector, RegionFeatures
from extract.preprocess import PreparedImage

# A detected box counts as the same box when the other precision selected one this close to it.
SAME_BOX_IOU = 0.95


@dataclass
class PrecisionAgreement:
    precision: str
    images: int
    rows: int  # given-box rows compared, the whole-image box included
    cosine_min: float  # of each row's feature with float32's
    cosine_mean: float
    relative_l2_max: float  # |f - f32| / |f32| per row
    class_agreement: float  # rows whose argmax class is float32's
    attribute_agreement: float | None  # rows whose argmax attribute is float32's; None without attributes
    detected_boxes: float  # detection mode: float32's selected boxes that the precision also selects (IoU >= 0.95)

    def to_dict(self) -> dict:
        return asdict(self)


def compare_to_fp32(detector: Detector, images: Sequence[PreparedImage], precision: str) -> PrecisionAgreement:
    """Features and argmaxes compare in given-box mode, on the boxes float32 detects (so that each
    row is the same box in both precisions); box selection compares in detection mode, where a
    precision may select other boxes. The detector's own precision is restored afterwards."""
    saved = detector.precision
    try:
        detector.precision = "fp32"
        reference = detector.detect(images)
        boxes = [r.boxes for r in reference]
        reference_given = detector.describe(images, boxes)
        detector.precision = precision
        other = detector.detect(images)
        other_given = detector.describe(images, boxes)
    finally:
        detector.precision = saved
    ref, oth = _rows(reference_given), _rows(other_given)
    cosine = F.cosine_similarity(oth["features"], ref["features"], dim=1)
    relative_l2 = (oth["features"] - ref["features"]).norm(dim=1) / ref["features"].norm(dim=1).clamp(min=1e-12)
    attributes = None
    if ref["attrs"] is not None:
        attributes = float((oth["attrs"] == ref["attrs"]).float().mean())
    return PrecisionAgreement(
        precision=precision, images=len(images), rows=len(cosine), cosine_min=float(cosine.min()),
        cosine_mean=float(cosine.mean()), relative_l2_max=float(relative_l2.max()),
        class_agreement=float((oth["classes"] == ref["classes"]).float().mean()), attribute_agreement=attributes,
        detected_boxes=_same_boxes(reference, other),
    )


def _rows(regions: Sequence[RegionFeatures]) -> dict[str, torch.Tensor | None]:
    """Every image's box rows and its whole-image row, stacked: features, argmax class and attribute."""
    features = torch.cat([torch.cat((r.features, r.image_feature[None])) for r in regions]).cpu()
    # The whole-image row's classes are not part of RegionFeatures: its feature stands for it.
    classes = torch.cat([r.objects_id for r in regions]).cpu()
    attrs = None if regions[0].attrs_id is None else torch.cat([r.attrs_id for r in regions]).cpu()
    return {"features": features.float(), "classes": classes, "attrs": attrs}


def _same_boxes(reference: Sequence[RegionFeatures], other: Sequence[RegionFeatures]) -> float:
    matched = total = 0
    for a, b in zip(reference, other):
        total += len(a.boxes)
        if len(a.boxes) and len(b.boxes):
            matched += int((box_iou(a.boxes.cpu(), b.boxes.cpu()).max(dim=1).values >= SAME_BOX_IOU).sum())
    return matched / max(total, 1)
