"""Convolutions whose numbers for an image do not depend on what else is in its batch."""

from __future__ import annotations

import torch
from torch import nn


def conv2d(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """`conv` applied to `x`; float32 on the CPU always through oneDNN.

    PyTorch otherwise takes its native kernel for a batch of one small input (and, single-threaded,
    for 1x1 convs under 16 images), whose rounding differs from oneDNN's, so an image would get
    other numbers alone than in a batch. oneDNN's do not depend on the batch
    (tests/test_detector_batching.py), and it is what large inputs get anyway.
    """
    if x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"):
        return torch.mkldnn_convolution(x, conv.weight, conv.bias, conv.padding, conv.stride, conv.dilation,
                                        conv.groups)
    return conv._conv_forward(x, conv.weight, conv.bias)
