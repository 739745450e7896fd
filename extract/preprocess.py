"""The network input: resize, channel order, normalisation, and pixel masking of boxes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

# Smallest side of the network input: an extreme aspect ratio can resize one side below what the
# stride-16 trunk can process, so such inputs are padded with zeros (the mean colour) up to this.
MIN_INPUT_SIDE = 32


@dataclass
class PreparedImage:
    tensor: torch.Tensor  # (3, h, w) float32, normalised, possibly zero-padded at the bottom/right
    height: int  # original image size
    width: int
    input_height: int  # resized size, before padding
    input_width: int

    @cached_property
    def scale(self) -> torch.Tensor:
        """Original → input pixels, per coordinate of an xyxy box."""
        sx, sy = self.input_width / self.width, self.input_height / self.height
        return filled((sx, sy, sx, sy), self.tensor.device)

    def to_input(self, boxes: torch.Tensor) -> torch.Tensor:
        return boxes.to(self.tensor.device, torch.float32) * self.scale

    def to_original(self, boxes: torch.Tensor) -> torch.Tensor:
        return boxes.float() / self.scale

    def whole_image_box(self) -> torch.Tensor:
        return filled((0.0, 0.0, self.width, self.height), self.tensor.device).view(1, 4)

    def with_tensor(self, tensor: torch.Tensor) -> "PreparedImage":
        return PreparedImage(tensor, self.height, self.width, self.input_height, self.input_width)


def filled(values: Sequence[float], device: torch.device) -> torch.Tensor:
    """(len(values),) float32 on `device`, each value written by a fill whose value travels as a kernel
    argument: `torch.tensor(values, device=cuda)` copies from pageable host memory, which waits for
    the stream, so an upload queued before it would overlap nothing."""
    out = torch.empty(len(values), dtype=torch.float32, device=device)
    for i, value in enumerate(values):
        out[i].fill_(value)
    return out


def transferred(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """`tensors` (sharing a dtype) on `device` in at most one copy: those elsewhere are concatenated,
    moved (from pinned memory, without waiting, from the host to CUDA) and split again."""
    moving = [i for i, t in enumerate(tensors) if t.device != device]
    if not moving:
        return list(tensors)
    flat = torch.cat([tensors[i].reshape(-1) for i in moving])
    if flat.device.type == "cpu" and device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    else:
        flat = flat.to(device)
    moved = list(tensors)
    for i, part in zip(moving, flat.split([tensors[i].numel() for i in moving])):
        moved[i] = part.view(tensors[i].shape)
    return moved


def resized_size(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """Short side to `min_size` unless the long side would exceed `max_size` (detectron2's rounding)."""
    scale = min_size / min(height, width)
    if max(height, width) * scale > max_size:
        scale = max_size / max(height, width)
    return max(1, int(height * scale + 0.5)), max(1, int(width * scale + 0.5))


def prepare_image(image: np.ndarray | torch.Tensor, cfg, device: torch.device | str = "cpu") -> PreparedImage:
    """(H, W, 3) uint8 RGB → normalised network input in the detector's channel order. `image` is an
    array on the host, or a contiguous tensor on `device` (decoded there: extract/jpeg.py).

    Resizing is bilinear without antialiasing (OpenCV's INTER_LINEAR, which the caffe models were
    run with), applied before normalisation; both are linear, so the order only affects rounding.
    """
    if isinstance(image, torch.Tensor):
        x = image
    else:
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected an (H, W, 3) uint8 RGB array, got {image.dtype} {image.shape}")
        x = torch.from_numpy(np.require(image, requirements=["C", "W"]))
        if torch.device(device).type == "cuda":
            # From pinned memory the upload is asynchronous: the host goes on with the next image.
            x = x.pin_memory().to(device, non_blocking=True)
    height, width = x.shape[:2]
    x = x.to(device).permute(2, 0, 1).float()
    if cfg.input_format == "BGR":
        x = x.flip(0)
    new_h, new_w = resized_size(height, width, cfg.min_size, cfg.max_size)
    if (new_h, new_w) != (height, width):
        x = F.interpolate(x[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
    mean, std = _normalisation(tuple(cfg.pixel_mean), tuple(cfg.pixel_std), x.device, _stream(x.device))
    x = (x - mean) / std
    pad_h, pad_w = max(0, MIN_INPUT_SIDE - new_h), max(0, MIN_INPUT_SIDE - new_w)
    if pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return PreparedImage(x.contiguous(), height, width, new_h, new_w)


@lru_cache(maxsize=None)
def _normalisation(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device,
                   stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, 1, 1) mean and std on `device`, built once: per image they would be uploads that wait.
    One pair per CUDA stream (the job computes on several): on another stream the kernels that fill
    them might not have run yet."""
    return filled(mean, device).view(3, 1, 1), filled(std, device).view(3, 1, 1)


def _stream(device: torch.device) -> int:
    """The current CUDA stream of `device`, as a number (0 elsewhere)."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def mask_pixels(image: torch.Tensor, boxes: torch.Tensor, selected: torch.Tensor | None = None) -> torch.Tensor:
    """A copy of the normalised input (3, h, w) with the pixels inside `boxes` (those `selected`, (K,)
    bool, picks; all without it) set to 0.

    `boxes` (K, 4) are xyxy in input (resized) pixels. Rows int(y1)..int(y2) and columns
    int(x1)..int(x2) are zeroed, both ends included, as the VL-BERT reference code does; zero
    after mean subtraction is the mean colour, so nothing of the box's content reaches the CNN.
    Drawn on the image's device without the host waiting: a pixel is zeroed where some selected
    box covers both its row and its column.
    """
    _, height, width = image.shape
    x1, y1, x2, y2 = boxes.to(image.device, torch.float32).trunc().unbind(dim=1)  # int(): towards zero
    rows = torch.arange(height, device=image.device, dtype=torch.float32)
    columns = torch.arange(width, device=image.device, dtype=torch.float32)
    in_rows = (rows >= y1[:, None]) & (rows <= y2[:, None])  # (K, h), clamped: only the image's rows exist
    if selected is not None:
        in_rows &= selected.to(image.device)[:, None]
    in_columns = (columns >= x1[:, None]) & (columns <= x2[:, None])
    # Counts of covering boxes: whole numbers, so any rounding (autocast) keeps a positive count positive.
    covered = in_rows.t().float() @ in_columns.float() > 0
    return image.masked_fill(covered, 0)


def masked_images(images: Sequence[PreparedImage], boxes: Sequence[torch.Tensor],
                  pixel_masks: Sequence[torch.Tensor | np.ndarray | None] | None) -> list[PreparedImage]:
    """`images` with the pixels of the boxes (input pixels, on the images' device) that
    `pixel_masks[i]` ((N_i,) bool, or None: none) selects zeroed: the masked-RoI variants' inputs.
    The masks travel to the device in one copy."""
    masks = [None if m is None else torch.as_tensor(m, dtype=torch.bool).reshape(-1)
             for m in (pixel_masks or [None] * len(images))]
    given = [i for i, m in enumerate(masks) if m is not None]
    if given:
        for i, m in zip(given, transferred([masks[i] for i in given], images[given[0]].tensor.device)):
            masks[i] = m
    return [image if m is None else image.with_tensor(mask_pixels(image.tensor, b, m))
            for image, b, m in zip(images, boxes, masks)]
