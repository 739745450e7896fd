"""Reading image files into RGB uint8 arrays, with a clear error for anything unusable.

Conversions (documented in the README): EXIF orientation is applied; grayscale, palette, CMYK
and YCbCr images are converted to RGB; an alpha channel is dropped (colour channels are kept as
they are, as OpenCV's imread does); 16- and 32-bit integer images are scaled to 8 bits.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")


class ImageError(ValueError):
    """An image file that cannot be used; the message names the file and the reason."""


def load_image(path: str | Path) -> np.ndarray:
    """(H, W, 3) uint8 RGB."""
    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()
                image = ImageOps.exif_transpose(image)
                array = _to_rgb(image)
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file") from None
    except UnidentifiedImageError:
        raise ImageError(f"{path}: not an image file (or a format Pillow cannot read)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"{path}: too many pixels to decode safely ({exc})") from None
    except OSError as exc:
        raise ImageError(f"{path}: unreadable or truncated image ({exc})") from None
    if array.shape[0] < 1 or array.shape[1] < 1:
        raise ImageError(f"{path}: image has no pixels ({array.shape[1]}x{array.shape[0]})")
    return array


def _to_rgb(image: Image.Image) -> np.ndarray:
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        values = np.asarray(image)
        top = 65535.0 if values.dtype == np.uint16 or values.max(initial=0) <= 65535 else float(values.max())
        gray = np.clip(values.astype(np.float64) * (255.0 / top) + 0.5, 0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if image.mode == "F":
        raise ImageError(f"floating-point images are not supported (mode {image.mode})")
    return np.array(image.convert("RGB"), dtype=np.uint8)


def list_images(root: str | Path) -> list[Path]:
    """Image files under `root`, recursively, in a stable order."""
    root = Path(root)
    if not root.is_dir():
        raise ImageError(f"{root}: not a directory")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def image_id(path: str | Path, root: str | Path) -> str:
    """The path relative to the images root, without its extension, with '/' separators."""
    return Path(path).relative_to(root).with_suffix("").as_posix()
