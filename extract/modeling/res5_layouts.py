"""Ways to run the RoI head's res5: the same weights and, up to float rounding, the same features.

A way of running, not a model: a layout is no config field and no checkpoint key, and a detector
switches layouts without reloading (`Detector.res5_layout`). "dilated" (the default) runs res5 as
built; "polyphase" runs a res5 of stride 1 whose 3x3 convs have dilation d > 1 (BUTD: d = 2, padding
2) as standard 3x3 convs (padding 1) on each RoI's d x d sub-grids of rows i = a and columns j = b
(mod d), stacked in the batch: (N, C, 14, 14) -> (4N, C, 7, 7). A dilated conv's output at (i, j)
reads only its own sub-grid's pixels, its zero padding included, so each sub-grid's products are the
dilated conv's; the 1x1 convs, frozen norms, ReLUs and shortcuts work per pixel. res5's output is only
averaged over the grid, so the mean over the sub-grids' outputs is the RoI's feature, without
interleaving them back. Standard 3x3 convs get more fast kernels than dilated ones (cuDNN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from vlbert.utils.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn


class Res5LayoutError(UserError):
    """A res5 layout that does not exist, or that the detector's res5 cannot run in."""


def channels_last_on_cuda(x: torch.Tensor) -> torch.Tensor:
    """On CUDA the layout cuDNN's tensor-core convolutions take; elsewhere `x` as it is."""
    import torch  # here, not at the top: the layouts' names are read by `vlbert extract --help`

    return x.contiguous(memory_format=torch.channels_last) if x.is_cuda else x


def dilated_mean(res5: nn.Sequential, rois: torch.Tensor, dilation: int) -> torch.Tensor:
    """(N, D) float32 mean over each RoI's grid of res5 run as built."""
    import torch

    return res5(rois).mean(dim=(2, 3), dtype=torch.float32)


def polyphase_mean(res5: nn.Sequential, rois: torch.Tensor, dilation: int) -> torch.Tensor:
    """`dilated_mean`'s features, res5 run undilated on each RoI's `dilation`² sub-grids (module doc)."""
    import torch

    n, c, h, w = rois.shape
    d = dilation
    # (N, C, h/d, d, w/d, d) -> (d, d, N, C, h/d, w/d): sub-grid (a, b) holds rows a, a + d, ... and columns b, ...
    subgrids = rois.reshape(n, c, h // d, d, w // d, d).permute(3, 5, 0, 1, 2, 4).reshape(d * d * n, c, h // d, w // d)
    x = channels_last_on_cuda(subgrids)
    for block in res5:
        x = block(x, on_subgrids=True)
    return x.unflatten(0, (d * d, n)).mean(dim=(0, 3, 4), dtype=torch.float32)


def polyphase_unfit(cfg) -> str | None:
    if cfg.res5_stride != 1 or cfg.res5_dilation < 2:
        return (f"res5 has stride {cfg.res5_stride} and dilation {cfg.res5_dilation}; it needs stride 1 and "
                "dilation 2 or more (the BUTD layout)")
    if cfg.pooler_resolution % cfg.res5_dilation:
        return f"pooler_resolution {cfg.pooler_resolution} is not a multiple of res5's dilation {cfg.res5_dilation}"
    return None


@dataclass(frozen=True)
class Res5Layout:
    name: str
    summary: str
    mean: Callable[[nn.Sequential, torch.Tensor, int], torch.Tensor]  # (res5, pooled RoIs, its dilation) -> (N, D)
    unfit: Callable[[object], str | None] = lambda cfg: None  # why a detector config's res5 cannot run so


RES5_LAYOUTS: dict[str, Res5Layout] = {layout.name: layout for layout in (
    Res5Layout("dilated", "res5 as built: the reference numbers", dilated_mean),
    Res5Layout("polyphase", "res5's dilated 3x3 convs as standard ones on each RoI's sub-grids (stride 1, "
               "dilation d > 1, pooler resolution a multiple of d); the same features up to float rounding",
               polyphase_mean, polyphase_unfit),
)}
DEFAULT_RES5_LAYOUT = "dilated"


def res5_layout(name: str, cfg) -> Res5Layout:
    """The layout `name` for detector config `cfg`; Res5LayoutError in one line where it does not
    exist or does not apply (refused rather than ignored: a no-op would hide that nothing changed)."""
    if name not in RES5_LAYOUTS:
        raise Res5LayoutError(f"res5 layout {name!r}: expected one of {', '.join(RES5_LAYOUTS)}")
    layout = RES5_LAYOUTS[name]
    why_not = layout.unfit(cfg)
    if why_not:
        raise Res5LayoutError(f"res5 layout {name} does not apply to detector {cfg.name}: {why_not}")
    return layout
