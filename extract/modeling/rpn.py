"""Region proposal network of a C4 detector, in detectron2's layout and anchor order.

Anchors within a cell are ordered size-major (for each size, each ratio) as detectron2's
DefaultAnchorGenerator orders them, so detectron2 RPN weights need no reordering.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import nms

from extract.modeling.boxes import BoxCoder, clip_boxes
from extract.modeling.conv import conv2d
from extract.modeling.parts import ShapeSpec
from extract.modeling.speed_paths import BATCHED_RPN


def cell_anchors(sizes: tuple[float, ...], ratios: tuple[float, ...]) -> torch.Tensor:
    """(A, 4) anchors centred on 0; ratio is height / width, area is size squared, no rounding."""
    anchors = []
    for size in sizes:
        for ratio in ratios:
            w = math.sqrt(size * size / ratio)
            h = ratio * w
            anchors.append([-w / 2, -h / 2, w / 2, h / 2])
    return torch.tensor(anchors, dtype=torch.float32)


class RPNHead(nn.Module):
    def __init__(self, in_channels: int, hidden_channels: int, num_anchors: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, hidden_channels, 3, padding=1)
        self.objectness_logits = nn.Conv2d(hidden_channels, num_anchors, 1)
        self.anchor_deltas = nn.Conv2d(hidden_channels, num_anchors * 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.relu(conv2d(self.conv, x))
        return conv2d(self.objectness_logits, x), conv2d(self.anchor_deltas, x)


class RPN(nn.Module):
    def __init__(self, cfg, input_shape: ShapeSpec) -> None:
        super().__init__()
        self.stride = input_shape.stride
        self.rpn_head = RPNHead(input_shape.channels, cfg.rpn_hidden_channels, cfg.num_anchors)
        self.register_buffer("cell_anchors", cell_anchors(cfg.anchor_sizes, cfg.anchor_ratios), persistent=False)
        self.pre_nms_topk = cfg.rpn_pre_nms_topk
        self.post_nms_topk = cfg.rpn_post_nms_topk
        self.nms_thresh = cfg.rpn_nms_thresh
        self.box_coder = BoxCoder((1.0, 1.0, 1.0, 1.0))
        self.speed_paths: frozenset[str] = frozenset()  # batched-rpn: `_select_all` (extract/modeling/speed_paths.py)

    def anchors(self, height: int, width: int) -> torch.Tensor:
        """(H*W*A, 4) anchors for a feature map, location-major as the head's outputs are flattened."""
        device = self.cell_anchors.device
        xs = torch.arange(width, device=device, dtype=torch.float32) * self.stride
        ys = torch.arange(height, device=device, dtype=torch.float32) * self.stride
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        shifts = torch.stack((grid_x, grid_y, grid_x, grid_y), dim=-1).reshape(-1, 1, 4)
        return (shifts + self.cell_anchors.reshape(1, -1, 4)).reshape(-1, 4)

    def forward(self, features: torch.Tensor, input_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One image's proposals: `features` is its (1, C, H, W) res4 map (see `propose`)."""
        return self.propose(features, [input_hw])[0]

    @torch.no_grad()
    def propose(self, features: torch.Tensor,
                input_hws: Sequence[tuple[int, int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image, proposals (K, 4) in input pixels sorted by objectness, and their objectness logits.

        `features` is the (B, C, H, W) res4 map of B images of one input size; the head runs once over
        all of them. `input_hws` are their (height, width) after resizing and before any padding,
        which proposals are clipped to. Decoding and NMS run in float32 whatever the head's precision.
        With the batched-rpn speed path, the same proposals from one selection over all images (`_select_all`).
        """
        logits, deltas = self.rpn_head(features)
        _, _, h, w = logits.shape
        anchors = self.anchors(h, w)
        count = len(features)
        logits = logits.float().permute(0, 2, 3, 1).reshape(count, -1)
        deltas = deltas.float().reshape(count, -1, 4, h, w).permute(0, 3, 4, 1, 2).reshape(count, -1, 4)
        if BATCHED_RPN in self.speed_paths:
            return self._select_all(logits, deltas, anchors, input_hws)
        return [self._select(l, d, anchors, size) for l, d, size in zip(logits, deltas, input_hws)]

    def _select(self, logits: torch.Tensor, deltas: torch.Tensor, anchors: torch.Tensor,
                input_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        k = min(self.pre_nms_topk, logits.numel())
        logits, order = logits.topk(k)
        boxes = self.box_coder.decode(deltas[order], anchors[order])

        valid = torch.isfinite(boxes).all(dim=1) & torch.isfinite(logits)
        boxes, logits = clip_boxes(boxes[valid], *input_hw), logits[valid]
        nonempty = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        boxes, logits = boxes[nonempty], logits[nonempty]
        keep = nms(boxes, logits, self.nms_thresh)[: self.post_nms_topk]
        return boxes[keep], logits[keep]

    def _select_all(self, logits: torch.Tensor, deltas: torch.Tensor, anchors: torch.Tensor,
                    input_hws: Sequence[tuple[int, int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """`_select` of each image, its (A,) logits and (A, 4) deltas a row of (B, A) and (B, A, 4): the
        top-k, decoding, clipping and both tests over all rows in one call each, and the rows' counts of
        boxes kept told to the host in one copy (each boolean selection of `_select` makes the host wait
        for a CUDA device: four an image). Then one NMS per image: torchvision's `batched_nms` offsets
        each image's coordinates, which rounds them and moves IoUs near the threshold. Each op computes
        a row's elements as `_select` computes them, so the proposals are the same, in the same order.
        """
        count, k = len(logits), min(self.pre_nms_topk, logits.shape[1])
        if not count:
            return []
        logits, order = logits.topk(k, dim=1)
        rows = torch.arange(count, device=order.device)[:, None]
        boxes = self.box_coder.decode(deltas[rows, order].reshape(-1, 4), anchors[order].reshape(-1, 4))
        boxes = boxes.reshape(count, k, 4)
        valid = torch.isfinite(boxes).all(dim=2) & torch.isfinite(logits)
        # Clipped by plain numbers, as `_select` clips: bounds held in a tensor would first cost a copy to the device.
        boxes = clip_boxes(boxes, *input_hws[0]) if len(set(input_hws)) == 1 else \
            torch.stack([clip_boxes(b, *size) for b, size in zip(boxes, input_hws)])
        kept = valid & (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])
        first = torch.sort(~kept, dim=1, stable=True).indices  # each row's kept boxes first, in their order
        proposals = []
        for b, l, f, n in zip(boxes, logits, first, kept.sum(dim=1).tolist()):
            b, l = b[f[:n]], l[f[:n]]
            keep = nms(b, l, self.nms_thresh)[: self.post_nms_topk]
            proposals.append((b[keep], l[keep]))
        return proposals
