"""Images by FeatureStore key, found under an images root as extraction finds them: a file whose
path under the root, without its extension, is the key (any of extract.images.IMAGE_EXTENSIONS, any
case); or, where the root holds img2dataset's tar shards (a `.tar` file, a folder of them, a glob or
a brace range: extract/shards.py), the image member `KEY.jpg` of the shard `a/00000.tar` for the key
`a/00000/KEY`. Each shard a key needs is read once, up to the last key it holds.

What is not found, not readable as an image, or of more pixels than extraction reads by default
(extract.images.DEFAULT_MAX_PIXELS, refused before decoding), is named by key with the reason, never
raised: a picture of the others can still be drawn.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from extract.images import DEFAULT_MAX_PIXELS, EncodedImage, ImageError, load_image
from extract.shards import IMAGE_MEMBER_EXTENSIONS, ShardError, find_shards, names_shards, read_shard, shard_id
from train.data.prepare import ImageFinder
from vlbert.utils.paths import outside_reason


@dataclass
class FoundImages:
    pixels: dict[str, np.ndarray] = field(default_factory=dict)  # key → (H, W, 3) uint8 RGB
    missing: dict[str, str] = field(default_factory=dict)  # key → why it has no image
    files: dict[str, Path] = field(default_factory=dict)  # key → the file (or tar shard) its image was read from


def load_images(images: str | Path, keys: list[str], log: Callable[[str], None]) -> FoundImages:
    """The images of `keys` under `images` (see the module's docstring); damage met in a tar shard
    goes to `log`."""
    found = FoundImages()
    wanted = []
    for key in dict.fromkeys(keys):
        reason = outside_reason(key)
        if reason is None:
            wanted.append(key)
        else:
            found.missing[key] = f"no image: the key {reason}"
    if names_shards(images):
        _from_shards(images, wanted, found, log)
    else:
        _from_files(Path(images), wanted, found)
    return found


def _from_files(root: Path, keys: list[str], found: FoundImages) -> None:
    finder = ImageFinder(root)
    for key in keys:
        folder, _, stem = key.rpartition("/")
        name = finder.stems(folder).get(stem)
        if name is None:
            found.missing[key] = f"no image {key}.* under {root}"
            continue
        found.files[key] = root / folder / name
        _decoded(key, found.files[key], found)


def _from_shards(images: str | Path, keys: list[str], found: FoundImages, log: Callable[[str], None]) -> None:
    try:
        root, shards = find_shards(images)
    except ShardError as exc:
        found.missing.update(dict.fromkeys(keys, str(exc)))
        return
    by_folder = {shard_id(shard, root): shard for shard in shards}
    needed: dict[Path, set[str]] = defaultdict(set)
    for key in keys:
        shard = by_folder.get(key.rpartition("/")[0])
        if shard is None:
            found.missing[key] = f"no image: no tar shard {key.rpartition('/')[0] or '(none)'}.tar under {root}"
        else:
            needed[shard].add(key)
    for shard, wanted in needed.items():
        left = set(wanted)
        for sample in read_shard(shard, root, IMAGE_MEMBER_EXTENSIONS, log):
            if sample.id not in left:
                continue
            left.discard(sample.id)
            extension = sample.image_extension
            if extension is None or extension not in sample.members:
                found.missing[sample.id] = f"no image member in the sample {sample.id} of {shard}"
            else:
                name = f"{shard}:{sample.id.rpartition('/')[2]}.{extension}"
                found.files[sample.id] = shard
                _decoded(sample.id, EncodedImage(name, sample.members[extension]), found)
            if not left:
                break
        found.missing.update({key: f"no image: {shard} holds no sample {key.rpartition('/')[2]}" for key in left})


def _decoded(key: str, source: Path | EncodedImage, found: FoundImages) -> None:
    try:
        found.pixels[key] = load_image(source, DEFAULT_MAX_PIXELS)  # what extraction reads, and no more
    except ImageError as exc:
        found.missing[key] = str(exc)
