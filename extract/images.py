"""Reading image files into RGB uint8 arrays, with a clear error for anything unusable.

Conversions (documented in docs/extraction.md): EXIF orientation is applied; grayscale, palette, CMYK
and YCbCr images are converted to RGB; an alpha channel is dropped (colour channels are kept as
they are, as OpenCV's imread does); 16- and 32-bit integer images are scaled to 8 bits.
"""

from __future__ import annotations

import io
import itertools
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from vlbert.utils.errors import FAILED, UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")
# The extraction job refuses images with more pixels from their header, before decoding: a PNG of
# 62 KB can declare 8000x8000 pixels (64 MP, 2.5 GB of job memory), and the detector sees at most
# 600x1000 anyway. 40 MP admits 8K video frames (33 MP) and most camera photos. Pillow's own
# decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS, ~89 MP) stays the ceiling of every read.
DEFAULT_MAX_PIXELS = 40_000_000


class ImageError(UserError):
    """An image file that cannot be used; the message names the file and the reason."""

    exit_status = FAILED


def is_utf8(text: str) -> bool:
    """Whether `text` can be written as UTF-8: no lone surrogate, which is how Python spells a file
    name's undecodable bytes (and what a JSON escape such as "\\ud800" reads as)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class EncodedImage:
    """An image file's bytes read from elsewhere (a tar shard's member), and the name messages give it."""

    name: str
    data: bytes = field(repr=False)

    def __str__(self) -> str:
        return self.name


def load_image(path: str | Path | EncodedImage, max_pixels: int | None = None) -> np.ndarray:
    """(H, W, 3) uint8 RGB of an image file or of an image file's bytes (`EncodedImage`), with the same
    conversions. An image whose header declares more than `max_pixels` pixels is refused before it is
    decoded."""
    path = path if isinstance(path, EncodedImage) else Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(path.data) if isinstance(path, EncodedImage) else path) as image:
                width, height = image.size
                if max_pixels is not None and width * height > max_pixels:
                    raise ImageError(f"{path}: {width}x{height} is {width * height} pixels, more than the limit of "
                                     f"{max_pixels} (vlbert extract --max-pixels); refused before decoding")
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
    """Image files under `root`, recursively, in a stable order. Symlinked folders are followed; a
    folder met a second time (a symlink loop, or two links to one folder) is skipped with a
    warning, so that no image is listed twice. A dangling link named like an image is listed (it
    then fails as a missing file, in the failure log)."""
    return sorted(_images_under(root))


def count_images(root: str | Path, most: int) -> int:
    """How many images `list_images` lists under `root`, counted up to `most` + 1 (the walk stops
    there, holding none of them): enough to tell whether there are more than `most`."""
    return sum(1 for _ in itertools.islice(_images_under(root), most + 1))


def _images_under(root: str | Path) -> Iterator[Path]:
    """`list_images`' images, in the order the walk meets them."""
    root = Path(root)
    if not root.is_dir():
        raise ImageError(f"{root}: not a directory")
    seen = {_identity(root): root}
    for folder, subfolders, files in os.walk(root, followlinks=True, onerror=_warn_unlistable):
        subfolders.sort()  # the first of two links to one folder, by name, is the one listed
        for name in list(subfolders):
            path = Path(folder) / name
            first = seen.setdefault(_identity(path), path)
            if first != path:
                warnings.warn(f"{path}: skipped, it is the folder {first} again (a symlink loop or a second link)",
                              stacklevel=2)
                subfolders.remove(name)
        for name in files:
            path = Path(folder) / name
            # Regular files, and dangling links; not FIFOs or devices, which would block or never end.
            if path.suffix.lower() in IMAGE_EXTENSIONS and (path.is_file() or not path.exists()):
                yield path


def _identity(folder: Path) -> tuple[int, int]:
    info = folder.stat()
    return info.st_dev, info.st_ino


def _warn_unlistable(error: OSError) -> None:
    warnings.warn(f"{error.filename}: cannot be listed ({error.strerror}); its images are left out", stacklevel=2)


def image_id(path: str | Path, root: str | Path) -> str:
    """The path relative to the images root, without its extension, with '/' separators."""
    return Path(path).relative_to(root).with_suffix("").as_posix()
