"""How well `Detector.detect` finds annotated objects: recall, class and attribute accuracy."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from torchvision.ops import box_iou

from extract import Detector
from extract.training.data import DetectionExample

MATCH_IOU = 0.5


@dataclass
class DetectionQuality:
    images: int
    objects: int
    boxes_per_image: float  # selected boxes (at least the config's min_boxes)
    recall: float  # objects with a selected box at IoU >= 0.5
    class_accuracy: float  # of the recalled objects: the best-overlapping box's class is right
    attribute_accuracy: float  # ... its top attribute is one of the object's
    attribute_set_accuracy: float  # ... its top-k attributes are exactly the object's k attributes
    confident_precision: float  # selected boxes at or above score_thresh that overlap an object at IoU >= 0.5

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@torch.no_grad()
def evaluate_detector(det: Detector, examples: Sequence[DetectionExample]) -> DetectionQuality:
    det.eval()
    objects = recalled = right_class = right_attribute = right_set = boxes = confident = confident_hits = 0
    for example in examples:
        region = det.detect([det.prepare(example.image)])[0]
        boxes += len(region.boxes)
        iou = box_iou(torch.as_tensor(example.boxes, dtype=torch.float32).reshape(-1, 4), region.boxes.cpu())
        is_confident = region.objects_conf.cpu() >= det.cfg.score_thresh
        confident += int(is_confident.sum())
        confident_hits += int(((iou >= MATCH_IOU).any(dim=0) & is_confident).sum())
        attr_probs = None
        if region.attrs_id is not None:
            attr_logits = det.roi_heads.box_predictor(region.features).attr_logits
            attr_probs = attr_logits.softmax(dim=1)[:, :-1].cpu()
        for gt, overlaps in enumerate(iou):
            objects += 1
            if len(overlaps) == 0 or overlaps.max() < MATCH_IOU:
                continue
            recalled += 1
            box = int(overlaps.argmax())
            right_class += int(region.objects_id[box]) == int(example.classes[gt])
            if attr_probs is not None:
                truth = set(example.attributes[gt])
                right_attribute += int(region.attrs_id[box]) in truth
                top = attr_probs[box].topk(max(len(truth), 1)).indices.tolist()
                right_set += set(top) == truth
    per_object = max(recalled, 1)
    return DetectionQuality(
        images=len(examples), objects=objects, boxes_per_image=boxes / max(len(examples), 1),
        recall=recalled / max(objects, 1), class_accuracy=right_class / per_object,
        attribute_accuracy=right_attribute / per_object, attribute_set_accuracy=right_set / per_object,
        confident_precision=confident_hits / max(confident, 1),
    )
