"""Box arithmetic shared by the RPN and the box head (detectron2's Box2BoxTransform conventions)."""

from __future__ import annotations

import math

import torch

# Largest log-scale a delta may apply, as detectron2 and torchvision clamp it.
SCALE_CLAMP = math.log(1000.0 / 16)


def apply_deltas(deltas: torch.Tensor, boxes: torch.Tensor,
                 weights: tuple[float, float, float, float]) -> torch.Tensor:
    """Decodes (N, 4k) deltas (dx, dy, dw, dh per group of four) against (N, 4) xyxy boxes."""
    deltas = deltas.float()
    boxes = boxes.to(deltas.dtype)
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights

    wx, wy, ww, wh = weights
    dx = deltas[:, 0::4] / wx
    dy = deltas[:, 1::4] / wy
    dw = (deltas[:, 2::4] / ww).clamp(max=SCALE_CLAMP)
    dh = (deltas[:, 3::4] / wh).clamp(max=SCALE_CLAMP)

    pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
    pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
    pred_w = torch.exp(dw) * widths[:, None]
    pred_h = torch.exp(dh) * heights[:, None]
    out = torch.stack((pred_ctr_x - 0.5 * pred_w, pred_ctr_y - 0.5 * pred_h,
                       pred_ctr_x + 0.5 * pred_w, pred_ctr_y + 0.5 * pred_h), dim=2)
    return out.reshape(deltas.shape)


def clip_boxes(boxes: torch.Tensor, height: float, width: float) -> torch.Tensor:
    x = boxes[..., 0::2].clamp(0, width)
    y = boxes[..., 1::2].clamp(0, height)
    return torch.stack((x[..., 0], y[..., 0], x[..., 1], y[..., 1]), dim=-1)
