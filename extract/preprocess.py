"""The network input: resize, channel order, normalisation, and pixel masking of boxes."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def scale(self) -> torch.Tensor:
        """Original → input pixels, per coordinate of an xyxy box."""
        sx, sy = self.input_width / self.width, self.input_height / self.height
        return torch.tensor([sx, sy, sx, sy], dtype=torch.float32, device=self.tensor.device)

    def to_input(self, boxes: torch.Tensor) -> torch.Tensor:
        return boxes.to(self.tensor.device, torch.float32) * self.scale

    def to_original(self, boxes: torch.Tensor) -> torch.Tensor:
        return boxes.float() / self.scale

    def whole_image_box(self) -> torch.Tensor:
        return torch.tensor([[0.0, 0.0, self.width, self.height]], device=self.tensor.device)

    def with_tensor(self, tensor: torch.Tensor) -> "PreparedImage":
        return PreparedImage(tensor, self.height, self.width, self.input_height, self.input_width)


def resized_size(height: int, width: int, min_size: int, max_size: int) -> tuple[int, int]:
    """Short side to `min_size` unless the long side would exceed `max_size` (detectron2's rounding)."""
    scale = min_size / min(height, width)
    if max(height, width) * scale > max_size:
        scale = max_size / max(height, width)
    return max(1, int(height * scale + 0.5)), max(1, int(width * scale + 0.5))


def prepare_image(image: np.ndarray, cfg, device: torch.device | str = "cpu") -> PreparedImage:
    """(H, W, 3) uint8 RGB → normalised network input in the detector's channel order.

    Resizing is bilinear without antialiasing (OpenCV's INTER_LINEAR, which the caffe models were
    run with), applied before normalisation; both are linear, so the order only affects rounding.
    """
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 RGB array, got {image.dtype} {image.shape}")
    height, width = image.shape[:2]
    x = torch.from_numpy(np.require(image, requirements=["C", "W"]))
    if torch.device(device).type == "cuda":
        # From pinned memory the upload is asynchronous: the host goes on with the next image.
        x = x.pin_memory().to(device, non_blocking=True)
    x = x.to(device).permute(2, 0, 1).float()
    if cfg.input_format == "BGR":
        x = x.flip(0)
    new_h, new_w = resized_size(height, width, cfg.min_size, cfg.max_size)
    if (new_h, new_w) != (height, width):
        x = F.interpolate(x[None], size=(new_h, new_w), mode="bilinear", align_corners=False)[0]
    mean = torch.tensor(cfg.pixel_mean, device=x.device).view(3, 1, 1)
    std = torch.tensor(cfg.pixel_std, device=x.device).view(3, 1, 1)
    x = (x - mean) / std
    pad_h, pad_w = max(0, MIN_INPUT_SIDE - new_h), max(0, MIN_INPUT_SIDE - new_w)
    if pad_h or pad_w:
        x = F.pad(x, (0, pad_w, 0, pad_h))
    return PreparedImage(x.contiguous(), height, width, new_h, new_w)


def mask_pixels(image: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """A copy of the normalised input (3, h, w) with the pixels inside `boxes` set to 0.

    `boxes` (K, 4) are xyxy in input (resized) pixels. Rows int(y1)..int(y2) and columns
    int(x1)..int(x2) are zeroed, both ends included, as the VL-BERT reference code does; zero
    after mean subtraction is the mean colour, so nothing of the box's content reaches the CNN.
    """
    out = image.clone()
    _, h, w = out.shape
    for x1, y1, x2, y2 in boxes.detach().cpu().tolist():
        c1, c2 = max(int(x1), 0), min(int(x2), w - 1)
        r1, r2 = max(int(y1), 0), min(int(y2), h - 1)
        if c1 <= c2 and r1 <= r2:
            out[:, r1 : r2 + 1, c1 : c2 + 1] = 0
    return out


def masked_images(images: list[PreparedImage], boxes: list[torch.Tensor],
                  pixel_masks: list | None) -> list[PreparedImage]:
    """`images` with the pixels of the boxes that `pixel_masks[i]` ((N_i,) bool, or None: none)
    selects zeroed (boxes in original pixels): the masked-RoI variants' inputs."""
    if pixel_masks is None:
        return list(images)
    return [image if m is None else image.with_tensor(
                mask_pixels(image.tensor, image.to_input(b[torch.as_tensor(m, dtype=torch.bool).cpu()])))
            for image, b, m in zip(images, boxes, pixel_masks)]
