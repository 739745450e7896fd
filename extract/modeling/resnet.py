"""ResNet and ResNeXt bottleneck stages with frozen batch norm, named as detectron2 names them.

Module names mirror detectron2's checkpoint keys (`stem.conv1.norm.running_var`,
`res4.22.conv2.weight`, ...) so its checkpoints load by name; other naming schemes go through a
key map (`extract.checkpoint.KEY_MAPS`). `make_stage` is the one block factory: the C4 trunk's
res2-res4 and the RoI head's res5 are built by it, with the config's groups (ResNeXt) and widths.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from extract.modeling.conv import conv2d
from extract.modeling.parts import ShapeSpec


class ConvNorm(nn.Conv2d):
    """A bias-free conv followed by its frozen batch norm, held as the child `norm`.

    `norm_in_weight` (the folded-res5-norms speed path, which the RoI head sets on res5's convs): where
    no gradient is needed, one conv whose weight is pre-multiplied by the norm's scale and whose bias is
    the norm's, rather than a conv and two passes over its output; the same numbers up to float rounding.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, dilation: int = 1, groups: int = 1) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias=False)
        self.norm = FrozenBatchNorm2d(out_channels)
        self.norm_in_weight = False
        self._folded: dict[Callable, Folded] = {}  # by the function that folds

    def forward(self, x: torch.Tensor, on_subgrids: bool = False) -> torch.Tensor:
        """`on_subgrids`: `x` holds the dilation x dilation sub-grids of this conv's input, as the
        polyphase res5 layout runs it (extract/modeling/res5_layouts.py): the conv runs undilated,
        with its padding divided by its dilation, which computes the same products."""
        padding, dilation = (tuple(p // d for p, d in zip(self.padding, self.dilation)), (1, 1)) if on_subgrids \
            else (None, None)
        if self.norm_in_weight and not torch.is_grad_enabled():  # with gradients, the weight's are today's
            weight, bias = self.folded(fold_conv)
            return conv2d(self, x, padding, dilation, weight, bias)
        # The frozen norm's x * scale + bias, applied in place to the conv's fresh output: the same
        # two roundings as FrozenBatchNorm2d, without allocating two more activation-sized tensors
        # (a tenth of the CPU time of res5 over 300 RoIs).
        scale, bias = self.folded_norm()
        return conv2d(self, x, padding, dilation).mul_(scale).add_(bias)

    def folded_norm(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The norm's per-channel (scale, bias), each (1, C, 1, 1), computed once for each state of
        its buffers rather than in every forward (7 ops per conv: half of an end-to-end forward's)."""
        return self.folded(fold_norm)

    def folded(self, fold: Callable[[ConvNorm], tuple[torch.Tensor, torch.Tensor]]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """`fold(self)`: `fold_norm` or `fold_conv`, computed once for each state of the tensors it reads."""
        sources = folded_sources(self, fold)
        if any(source.is_inference() for source in sources):
            return fold(self)  # inference tensors keep no version: an in-place load would go unseen
        cached = self._folded.get(fold)
        if cached is None or not cached.matches(self, sources):
            with torch.inference_mode(False), torch.no_grad():  # usable by later forwards with gradients
                cached = self._folded[fold] = Folded(self, sources, fold(self))
        return cached.values


def norm_buffers(norm: FrozenBatchNorm2d) -> tuple[torch.Tensor, ...]:
    return norm.weight, norm.bias, norm.running_mean, norm.running_var


def fold_norm(conv: ConvNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """FrozenBatchNorm2d's own arithmetic: scale = weight / sqrt(var + eps), bias - mean * scale."""
    norm = conv.norm
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    bias = norm.bias - norm.running_mean * scale
    return scale.view(1, -1, 1, 1), bias.view(1, -1, 1, 1)


def fold_conv(conv: ConvNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(the conv's weight times the norm's scale, the norm's bias): one conv that is conv and norm."""
    scale, bias = fold_norm(conv)
    return conv.weight * scale.view(-1, 1, 1, 1), bias.view(-1)


def folded_sources(conv: ConvNorm, fold: Callable) -> tuple[torch.Tensor, ...]:
    """The tensors that `fold` reads: the norm's buffers, and the conv's weight for `fold_conv`."""
    return norm_buffers(conv.norm) + ((conv.weight,) if fold is fold_conv else ())


class Folded:
    """Tensors folded from a ConvNorm's (`sources`: its norm's buffers, maybe its weight) and the state
    of the sources they were computed from.

    That state is the sources themselves (`.to()` and `load_state_dict(assign=True)` replace buffers)
    and their storages (`.to()` and `.double()` give a parameter new data and keep the tensor), both
    held here, so that a later check never meets a freed tensor's reused address; and `state`: their
    version counters (an ordinary `load_state_dict` copies into them in place) and data pointers, the
    norm's `eps`, and whether autocast is on (it runs the rsqrt in float32 for half-precision buffers).
    """

    def __init__(self, conv: ConvNorm, sources: tuple[torch.Tensor, ...],
                 values: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.sources, self.storages = sources, [source.untyped_storage() for source in sources]
        self.state, self.values = folded_state(conv, sources), values

    def matches(self, conv: ConvNorm, sources: tuple[torch.Tensor, ...]) -> bool:
        same_tensors = all(a is b for a, b in zip(sources, self.sources))
        return same_tensors and folded_state(conv, sources) == self.state


def folded_state(conv: ConvNorm, sources: tuple[torch.Tensor, ...]) -> tuple:
    tensors = tuple((source._version, source.data_ptr()) for source in sources)
    return tensors, conv.norm.eps, torch.is_autocast_enabled(conv.norm.weight.device.type)


class Bottleneck(nn.Module):
    """1x1, 3x3 (in `groups` groups: ResNeXt), 1x1, plus the shortcut."""

    def __init__(self, in_channels: int, out_channels: int, bottleneck_channels: int, stride: int,
                 dilation: int, stride_in_1x1: bool, groups: int = 1) -> None:
        super().__init__()
        self.shortcut = ConvNorm(in_channels, out_channels, 1, stride) if in_channels != out_channels else None
        stride_1x1, stride_3x3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.conv1 = ConvNorm(in_channels, bottleneck_channels, 1, stride_1x1)
        self.conv2 = ConvNorm(bottleneck_channels, bottleneck_channels, 3, stride_3x3, dilation, dilation, groups)
        self.conv3 = ConvNorm(bottleneck_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, on_subgrids: bool = False) -> torch.Tensor:
        """`on_subgrids`: see `ConvNorm.forward`; only the 3x3 conv is dilated (the 1x1 convs are per pixel)."""
        out = F.relu_(self.conv1(x))
        out = F.relu_(self.conv2(out, on_subgrids))
        out = self.conv3(out)
        out += x if self.shortcut is None else self.shortcut(x)
        return F.relu_(out)


def make_stage(cfg, index: int, in_channels: int, first_stride: int, dilation: int = 1) -> nn.Sequential:
    """Stage `index` (0: res2 ... 3: res5) of `cfg`'s ResNet or ResNeXt: its block count, widths
    and groups from the config, its input channels from what feeds it."""
    out_channels, bottleneck_channels = stage_widths(cfg, index)
    blocks = []
    for i in range(cfg.res_blocks[index]):
        blocks.append(Bottleneck(in_channels, out_channels, bottleneck_channels, first_stride if i == 0 else 1,
                                 dilation, cfg.stride_in_1x1, cfg.num_groups))
        in_channels = out_channels
    return nn.Sequential(*blocks)


def stage_widths(cfg, index: int) -> tuple[int, int]:
    """(output, bottleneck) channels of stage `index`: both double from one stage to the next."""
    return cfg.res2_out_channels * 2 ** index, cfg.bottleneck_channels * 2 ** index


class Stem(nn.Module):
    """7x7/2 conv, ReLU, 3x3/2 max-pool. Caffe's pool (pad 0, ceil mode) is what the BUTD weights saw."""

    def __init__(self, out_channels: int, caffe_pool: bool) -> None:
        super().__init__()
        self.conv1 = ConvNorm(3, out_channels, 7, stride=2, padding=3)
        self.caffe_pool = caffe_pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu_(self.conv1(x))
        if self.caffe_pool:
            return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


C4_STRIDES = {"res2": 1, "res3": 2, "res4": 2}  # each stage's first block; the stem divides by 4


class ResNetC4(nn.Module):
    """Stem and res2-res4: the shared trunk of a C4 detector (ResNet or ResNeXt)."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.stem = Stem(cfg.stem_out_channels, cfg.stem_pool == "caffe")
        channels = cfg.stem_out_channels
        for index, (name, stride) in enumerate(C4_STRIDES.items()):
            self.add_module(name, make_stage(cfg, index, channels, stride))
            channels = stage_widths(cfg, index)[0]
        self.output_shape = resnet_c4_shape(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res4(self.res3(self.res2(self.stem(x))))


def resnet_c4_shape(cfg) -> ShapeSpec:
    """What the C4 trunk gives the RPN and the RoI head: res4's channels and stride."""
    return ShapeSpec(stage_widths(cfg, len(C4_STRIDES) - 1)[0], 4 * math.prod(C4_STRIDES.values()))
