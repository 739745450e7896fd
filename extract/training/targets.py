"""Training targets: IoU matching and balanced sampling (detectron2's conventions); box deltas are
`extract.modeling.boxes.BoxCoder.encode`."""

from __future__ import annotations

import torch
from torchvision.ops import box_iou

# Matcher labels.
NEGATIVE, IGNORED, POSITIVE = 0, -1, 1


def match(boxes: torch.Tensor, gt_boxes: torch.Tensor, negative_below: float, positive_from: float,
          low_quality_positives: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """For each box: the index of its best ground-truth box and a label.

    IoU >= `positive_from` is POSITIVE, < `negative_below` NEGATIVE, in between IGNORED. With
    `low_quality_positives`, each ground-truth box's best-overlapping boxes are POSITIVE too (the
    RPN's rule, so that small objects no anchor covers well still get one).
    """
    if len(gt_boxes) == 0:
        return (torch.zeros(len(boxes), dtype=torch.long, device=boxes.device),
                torch.full((len(boxes),), NEGATIVE, dtype=torch.long, device=boxes.device))
    iou = box_iou(gt_boxes, boxes)  # (G, N)
    best_iou, matched = iou.max(dim=0)
    labels = torch.full_like(matched, IGNORED)
    labels[best_iou < negative_below] = NEGATIVE
    labels[best_iou >= positive_from] = POSITIVE
    if low_quality_positives:
        best_per_gt = iou.max(dim=1, keepdim=True).values
        _, box_index = ((iou == best_per_gt) & (best_per_gt > 0)).nonzero(as_tuple=True)
        labels[box_index] = POSITIVE
    return matched, labels


def sample(labels: torch.Tensor, num_samples: int, positive_fraction: float,
           generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random positive and negative indices: at most `positive_fraction` positives, negatives fill up."""
    positive = (labels == POSITIVE).nonzero().squeeze(1)
    negative = (labels == NEGATIVE).nonzero().squeeze(1)
    num_pos = min(len(positive), int(num_samples * positive_fraction))
    num_neg = min(len(negative), num_samples - num_pos)
    return _random_subset(positive, num_pos, generator), _random_subset(negative, num_neg, generator)


def _random_subset(indices: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    return indices[torch.randperm(len(indices), generator=generator)[:k].to(indices.device)]
