"""RoI head of a C4 detector: pool on res4, run res5, average to one feature per box, predict.

`Res5ROIHeads.box_features` is the one RoI feature path: detection, given boxes, masked-pixel
variants, the end-to-end stage and detector training all call it. Children are named as in
detectron2 (`res5`, `box_predictor.cls_score`, ...); the attribute head follows the
bottom-up-attention port (`cls_embedding`, `fc_attr`, `attr_score`).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_align, roi_pool

from extract.modeling.boxes import BoxCoder
from extract.modeling.parts import ShapeSpec
from extract.modeling.res5_layouts import DEFAULT_RES5_LAYOUT, channels_last_on_cuda, res5_layout
from extract.modeling.resnet import ConvNorm, make_stage, stage_widths
from extract.modeling.speed_paths import BF16_ROI_POOLING, CUDNN_BENCHMARK, FOLDED_RES5_NORMS

# RoIs per res5 pass. res5 over a whole batch's RoIs at once (300 proposals an image at BUTD size
# are 480 MB per fp32 activation) costs memory and, on the CPU, time; each RoI's numbers do not
# depend on the chunk it runs in (tests/extract/test_detector_batching.py). On a GPU each pass costs the
# host some 40 kernel launches: res5 over a batch's 2408 RoIs took 11.3 ms an image in chunks of 64,
# 10.7 in 256 and 10.5 in 1024 (H200, bf16).
ROI_CHUNK = 64
GPU_ROI_CHUNK = 512


@dataclass
class BoxPredictions:
    """Raw head outputs for N boxes; background is the last class, "no attribute" the last attribute."""

    features: torch.Tensor  # (N, D) mean of res5 over the pooled grid
    class_logits: torch.Tensor  # (N, C + 1)
    box_deltas: torch.Tensor  # (N, 4C) class-specific
    attr_logits: torch.Tensor | None  # (N, A + 1)

    def _map(self, fn) -> "BoxPredictions":
        return BoxPredictions(*(None if t is None else fn(t)
                                for t in (self.features, self.class_logits, self.box_deltas, self.attr_logits)))

    def take(self, index) -> "BoxPredictions":
        return self._map(lambda t: t[index])

    def split(self, sizes: list[int]) -> list["BoxPredictions"]:
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [self.take(slice(start, start + size)) for start, size in zip(starts, sizes)]


class BoxPredictor(nn.Module):
    def __init__(self, cfg, feature_dim: int) -> None:
        super().__init__()
        self.cls_score = nn.Linear(feature_dim, cfg.num_classes + 1)
        self.bbox_pred = nn.Linear(feature_dim, cfg.num_classes * 4)
        self.has_attributes = cfg.num_attributes > 0
        if self.has_attributes:
            self.cls_embedding = nn.Embedding(cfg.num_classes + 1, cfg.attr_embed_dim)
            self.fc_attr = nn.Linear(feature_dim + cfg.attr_embed_dim, cfg.attr_hidden_dim)
            self.attr_score = nn.Linear(cfg.attr_hidden_dim, cfg.num_attributes + 1)

    def forward(self, features: torch.Tensor) -> BoxPredictions:
        class_logits = self.cls_score(features)
        attr_logits = None
        if self.has_attributes:
            # At inference the attribute head is conditioned on the predicted class (argmax over all outputs).
            attr_logits = self.attribute_logits(features, class_logits.argmax(dim=1))
        return BoxPredictions(features, class_logits, self.bbox_pred(features), attr_logits)

    def per_image(self, features: torch.Tensor, sizes: list[int]) -> list[BoxPredictions]:
        """Each image's predictions; `sizes[i]` is image i's number of rows in `features`.

        On the CPU each image's rows run in calls of their own, on a copy (a new tensor, aligned as
        one), so that an image's calls are the same alone as in any batch, and so are its bits. MKL
        picks a matrix product's kernel by its shape and kernels round differently: over a batch's
        rows in one call, an image's class head got other bits than alone on an Intel Xeon's AVX-512
        kernels, and rows of 256 -> 33 or more outputs come out three ways under MKL 2024.2 on an
        AMD EPYC (alone, among 2-3 rows, among 4 or more). On CUDA in one call: cuBLAS, like cuDNN,
        may round otherwise for another batch anyway.
        """
        if features.device.type != "cpu":
            return self(features).split(sizes)
        return [self(rows.clone()) for rows in features.split(sizes)]

    def attribute_logits(self, features: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """(N, A + 1) attribute logits of features conditioned on `classes` (N,): the predicted
        class at inference, the ground-truth class in training (teacher forcing)."""
        embedded = self.cls_embedding(classes)
        return self.attr_score(F.relu(self.fc_attr(torch.cat((features, embedded), dim=1))))


def res5_shape(cfg) -> ShapeSpec:
    """res5's output channels: the size of a RoI feature (the mean over its grid)."""
    return ShapeSpec(stage_widths(cfg, 3)[0])


class Res5ROIHeads(nn.Module):
    """res5 as the RoI head of a C4 detector, built by the trunk's block factory for the backbone's
    output: stride 2 (detectron2) or stride 1 with dilation 2 (BUTD). `res5_layout` is how res5
    runs (extract/modeling/res5_layouts.py) and `speed_paths` the speed paths it takes
    (extract/modeling/speed_paths.py: folded-res5-norms, cudnn-benchmark, bf16-roi-pooling): settings,
    not weights."""

    def __init__(self, cfg, input_shape: ShapeSpec) -> None:
        super().__init__()
        self.cfg = cfg
        self.pooler = cfg.pooler
        self.resolution = cfg.pooler_resolution
        self.sampling_ratio = cfg.pooler_sampling_ratio
        self.spatial_scale = 1.0 / input_shape.stride
        self.res5 = make_stage(cfg, 3, input_shape.channels, cfg.res5_stride, cfg.res5_dilation)
        self.box_predictor = BoxPredictor(cfg, res5_shape(cfg).channels)
        self.box_coder = BoxCoder(cfg.bbox_reg_weights)
        self.res5_layout = DEFAULT_RES5_LAYOUT
        self.speed_paths = frozenset()

    @property
    def res5_layout(self) -> str:
        return self._res5_layout.name

    @res5_layout.setter
    def res5_layout(self, name: str) -> None:
        """Res5LayoutError where the layout does not exist or this head's res5 cannot run in it."""
        self._res5_layout = res5_layout(name, self.cfg)

    @property
    def speed_paths(self) -> frozenset[str]:
        return self._speed_paths

    @speed_paths.setter
    def speed_paths(self, names: frozenset[str]) -> None:
        self._speed_paths = frozenset(names)
        for module in self.res5.modules():
            if isinstance(module, ConvNorm):
                module.norm_in_weight = FOLDED_RES5_NORMS in self._speed_paths

    def pool(self, res4: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        """rois: (N, 5) rows of (index into res4's batch, x1, y1, x2, y2) in input pixels.

        Pools in float32 whatever the trunk's precision: box corners in bfloat16 would be up to
        4 pixels off at BUTD sizes.
        """
        res4, rois = res4.float(), rois.float()
        if self.pooler == "roipool":
            return roi_pool(res4, rois, self.resolution, self.spatial_scale)
        # "roialign_legacy" is maskrcnn-benchmark's (the official VL-BERT's Fast R-CNN): no half-pixel
        # offset, RoI sides of at least one cell.
        return roi_align(res4, rois, self.resolution, self.spatial_scale, self.sampling_ratio,
                         aligned=self.pooler == "roialign")

    def box_features(self, res4: Sequence[torch.Tensor], boxes: Sequence[torch.Tensor]) -> torch.Tensor:
        """(N_1 + ... + N_B, D) features of every image's boxes, in order; differentiable.

        `res4[i]` is image i's (1, C, h, w) map (a view into a batched trunk output is fine),
        `boxes[i]` its (N_i, 4) boxes in input pixels. Each box: pool, res5, mean over res5's grid
        (accumulated in float32). res5 runs over the RoIs of all images together (`res5_features`).
        """
        pooled = [self.pool(f, torch.cat((b.new_zeros(len(b), 1), b), dim=1)) for f, b in zip(res4, boxes)]
        if BF16_ROI_POOLING in self.speed_paths and pooled and under_bf16_autocast(pooled[0].device):
            # What res5's first convs would cast them to under autocast: the same rounding, once, in half the bytes.
            pooled = [rois.to(torch.bfloat16) for rois in pooled]
        return self.res5_features(torch.cat(pooled))

    def res5_features(self, pooled: torch.Tensor) -> torch.Tensor:
        """(N, D) float32 means over the grid of res5 run on (N, C, r, r) pooled RoIs, in chunks, in
        the head's `res5_layout`."""
        pooled = channels_last_on_cuda(pooled)
        chunk = GPU_ROI_CHUNK if pooled.is_cuda else ROI_CHUNK
        mean, dilation = self._res5_layout.mean, self.cfg.res5_dilation
        with CUDNN_BENCHMARKING.on() if CUDNN_BENCHMARK in self.speed_paths else nullcontext():
            return torch.cat([mean(self.res5, rois, dilation) for rois in pooled.split(chunk)])

    def forward(self, res4: Sequence[torch.Tensor], boxes: Sequence[torch.Tensor]) -> list[BoxPredictions]:
        """Per image, the box head's predictions for its boxes (see `box_features` and
        `BoxPredictor.per_image`)."""
        return self.box_predictor.per_image(self.box_features(res4, boxes), [len(b) for b in boxes])


def under_bf16_autocast(device: torch.device) -> bool:
    return torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) == torch.bfloat16


class CudnnBenchmarking:
    """`torch.backends.cudnn.benchmark` on while any caller is inside `on()`, and as it was once the
    last has left, even on an exception: the flag is process-wide, and the job's compute lanes run
    res5 in threads of their own (a lane that restored it on leaving would switch it off under
    another's res5, or leave it on after both)."""

    def __init__(self) -> None:
        self._lock, self._inside, self._before = threading.Lock(), 0, False

    @contextmanager
    def on(self) -> Iterator[None]:
        with self._lock:
            if not self._inside:
                self._before, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, True
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if not self._inside:
                    torch.backends.cudnn.benchmark = self._before


CUDNN_BENCHMARKING = CudnnBenchmarking()
