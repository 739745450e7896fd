"""Convolutions whose numbers for an image do not depend on what else is in its batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def conv2d(conv: nn.Conv2d, x: torch.Tensor, padding: tuple[int, ...] | None = None,
           dilation: tuple[int, ...] | None = None, weight: torch.Tensor | None = None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """`conv` applied to `x` (with `padding` and `dilation` in place of its own where given, and
    `weight` with `bias`); float32 on the CPU always through oneDNN.

    PyTorch otherwise takes its native kernel for a batch of one small input (and, single-threaded,
    for 1x1 convs under 16 images), whose rounding differs from oneDNN's, so an image would get
    other numbers alone than in a batch. oneDNN's do not depend on the batch
    (tests/extract/test_detector_batching.py), and it is what large inputs get anyway.
    """
    padding = conv.padding if padding is None else padding
    dilation = conv.dilation if dilation is None else dilation
    weight, bias = (conv.weight, conv.bias) if weight is None else (weight, bias)
    if x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"):
        return torch.mkldnn_convolution(x, weight, bias, padding, conv.stride, dilation, conv.groups)
    return F.conv2d(x, weight, bias, conv.stride, padding, dilation, conv.groups)
