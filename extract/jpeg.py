"""JPEG files decoded on the job's device: nvJPEG through torchvision, a batch at a time.

The decoding workers read a JPEG's header and bytes only (`jpeg_for_device`); the batch is decoded
where the detector runs (`decode_batch`), one `torchvision.io.decode_jpeg` call for all its JPEGs, so
that the workers hand over ~10x fewer bytes than decoded pixels and the host's cores are left to
the rest of the job. Only what the device decodes as Pillow does takes this path: baseline JPEG in
YCbCr colour, upright (no EXIF rotation), within the pixel limit. Anything else (other formats,
progressive JPEG, grayscale, CMYK, Adobe RGB-coded, rotated, too large, cut short, unreadable) is
decoded by Pillow in the worker as before, and a JPEG the device refuses is decoded by Pillow in the
job, so an image that cannot be decoded at all is a failure with Pillow's reason, never a stopped job.

The two decoders differ (nvJPEG's IDCT and chroma upsampling are not libjpeg's): on smooth
pictures, as photographs are, by a few levels of 255; on pixel noise, where chroma upsampling
matters most, by up to 144 (measured on an H200). tests/extract/test_extract_cuda.py measures what this does
to boxes and features.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
from PIL import Image

from extract.images import EncodedImage, ImageError, load_image

if TYPE_CHECKING:
    import torch

# Where the job decodes JPEGs (`vlbert extract --jpeg-decoding`): on a CUDA device that can, on the
# job's device, or by Pillow in the decoding workers. Light to import: the CLI's choices.
JPEG_DECODING = ("auto", "device", "workers")
# Pillow by default: nvJPEG's pixels are not libjpeg's, and on an H200 the tiny detector's features from
# them came within cosine 0.9994 of Pillow's, short of 0.9999 (docs/extraction.md); the device is opt-in.
DEFAULT_JPEG_DECODING = "workers"
# torchvision 0.29 deprecates its decoders in favour of TorchCodec, warning at every call.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torchvision\.io\.image")
EXIF_ORIENTATION = 0x0112


@dataclass(frozen=True)
class EncodedJpeg:
    """A JPEG file's bytes, for decoding on the device."""

    name: str  # the file, for messages
    data: bytes = field(repr=False)
    height: int
    width: int


def jpeg_for_device(file: Path | EncodedImage, max_pixels: int | None) -> EncodedJpeg | None:
    """The file's bytes when the device can decode it as Pillow would (see the module's doc); None
    when Pillow should (load_image then also gives the error of a file that cannot be read)."""
    try:
        data = file.data if isinstance(file, EncodedImage) else Path(file).read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            upright = image.getexif().get(EXIF_ORIENTATION, 1) == 1
            ycbcr = image.info.get("adobe_transform", 1) != 0  # Adobe's transform 0: the channels are RGB
            decodable = (image.format == "JPEG" and image.mode == "RGB" and ycbcr and upright
                         and not image.info.get("progressive"))
    except Exception:  # noqa: BLE001 - unreadable here: load_image reads it again and names the problem
        return None
    # A file cut short (no end-of-image marker) is Pillow's: it fails there, as it must.
    complete = data.rstrip(b"\0").endswith(b"\xff\xd9")
    if not (decodable and complete) or (max_pixels is not None and width * height > max_pixels):
        return None
    return EncodedJpeg(str(file), data, height, width)


def decode_batch(images: Sequence[np.ndarray | EncodedJpeg],
                 device: torch.device) -> list[np.ndarray | torch.Tensor | ImageError]:
    """Each image as (H, W, 3) uint8 RGB: arrays as they are, JPEGs decoded on `device` (a
    contiguous tensor there), in one call for the batch. A JPEG the device refuses is decoded by
    Pillow (an array), and one Pillow cannot decode either is its ImageError."""
    decoded: list = list(images)
    encoded = [i for i, image in enumerate(images) if isinstance(image, EncodedJpeg)]
    if not encoded:
        return decoded
    try:
        pixels = _decode([images[i] for i in encoded], device)
    except RuntimeError:
        # One bad JPEG fails the whole call: decode them one by one to find it.
        pixels = [_decode_one(images[i], device) for i in encoded]
    for i, image in zip(encoded, pixels):
        decoded[i] = image if image is not None else _with_pillow(images[i])
    return decoded


def _decode(jpegs: Sequence[EncodedJpeg], device: torch.device) -> list[torch.Tensor | None]:
    """The JPEGs decoded on `device` as (H, W, 3) (None where the size is not the header's)."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    data = [torch.frombuffer(bytearray(jpeg.data), dtype=torch.uint8) for jpeg in jpegs]
    decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    # Channels last, as an array uploaded from the host is: the resize then runs the same kernel.
    return [x.permute(1, 2, 0).contiguous() if tuple(x.shape) == (3, jpeg.height, jpeg.width) else None
            for x, jpeg in zip(decoded, jpegs)]


def _decode_one(jpeg: EncodedJpeg, device: torch.device) -> torch.Tensor | None:
    try:
        return _decode([jpeg], device)[0]
    except RuntimeError:
        return None


def _with_pillow(jpeg: EncodedJpeg) -> np.ndarray | ImageError:
    try:
        return load_image(EncodedImage(jpeg.name, jpeg.data))
    except ImageError as exc:
        return exc


def device_decodes_jpeg(device: torch.device) -> str | None:
    """None when `device` decodes a JPEG here (torchvision's decoder, nvJPEG on CUDA); else why not."""
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 90)).save(buffer, format="JPEG")
    try:
        pixels = _decode([EncodedJpeg("probe", buffer.getvalue(), 16, 16)], device)[0]
    except (ImportError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None if pixels is not None else "decoded to another size than the file's"
