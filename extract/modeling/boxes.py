"""Box arithmetic shared by the RPN, the box head and their training (detectron2's Box2BoxTransform)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Largest log-scale a delta may apply, as detectron2 and torchvision clamp it.
SCALE_CLAMP = math.log(1000.0 / 16)


@dataclass(frozen=True)
class BoxCoder:
    """Both directions between xyxy boxes and (dx, dy, dw, dh) deltas, scaled by `weights`.

    `decode(encode(boxes, targets), boxes) == targets` up to rounding; the RPN uses weights
    1, 1, 1, 1 and the box head `bbox_reg_weights` (10, 10, 5, 5).
    """

    weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)

    def encode(self, boxes: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(N, 4) deltas that turn `boxes` into `targets` (training targets)."""
        widths, heights, ctr_x, ctr_y = _centres(boxes)
        t_widths, t_heights, t_ctr_x, t_ctr_y = _centres(targets)
        wx, wy, ww, wh = self.weights
        return torch.stack((wx * (t_ctr_x - ctr_x) / widths, wy * (t_ctr_y - ctr_y) / heights,
                            ww * torch.log(t_widths / widths), wh * torch.log(t_heights / heights)), dim=1)

    def decode(self, deltas: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """(N, 4k) deltas, one group of four per class, applied to (N, 4) boxes; always in float32."""
        deltas = deltas.float()
        widths, heights, ctr_x, ctr_y = _centres(boxes.to(deltas.dtype))
        wx, wy, ww, wh = self.weights
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


def _centres(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(widths, heights, centre x, centre y) of (N, 4) xyxy boxes."""
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    return widths, heights, boxes[:, 0] + 0.5 * widths, boxes[:, 1] + 0.5 * heights


def clip_boxes(boxes: torch.Tensor, height: float, width: float) -> torch.Tensor:
    x = boxes[..., 0::2].clamp(0, width)
    y = boxes[..., 1::2].clamp(0, height)
    return torch.stack((x[..., 0], y[..., 0], x[..., 1], y[..., 1]), dim=-1)
