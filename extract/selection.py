"""Bottom-up-attention box selection: which proposals of an image are kept, and in what order."""

from __future__ import annotations

import torch
from torchvision.ops import nms


def select_boxes(boxes: torch.Tensor, class_probs: torch.Tensor, score_thresh: float, nms_thresh: float,
                 min_boxes: int, max_boxes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the kept boxes, sorted by confidence (descending), and their confidences.

    A box's confidence is its highest foreground probability among the classes in which it
    survives per-class NMS; boxes at or above `score_thresh` are kept, topped up to `min_boxes`
    by confidence and cut to `max_boxes`. `class_probs` is (N, C + 1) with background last.
    """
    num_boxes, num_fg = class_probs.shape[0], class_probs.shape[1] - 1
    if num_boxes == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device), class_probs.new_zeros(0)
    scores = class_probs[:, :num_fg].float()
    boxes = boxes.float()
    max_conf = scores.new_zeros(num_boxes)
    # One NMS per class over the same boxes. (A single batched NMS over all box-class pairs is
    # quadratic in boxes x classes: 480k pairs for the VG head, far slower than this loop.)
    for c in range(num_fg):
        kept = nms(boxes, scores[:, c], nms_thresh)
        max_conf[kept] = torch.maximum(max_conf[kept], scores[kept, c])

    order = torch.sort(max_conf, descending=True, stable=True).indices
    num_confident = int((max_conf >= score_thresh).sum())
    num_kept = min(max(num_confident, min_boxes), max_boxes, num_boxes)
    keep = order[:num_kept]
    return keep, max_conf[keep]
