"""What img2dataset (github.com/rom1504/img2dataset) writes, for the caption readers of its inputs.

img2dataset numbers the rows of its input from 0 and writes row `i` as sample key `{i:09d}` in shard
`{i // 10000:05d}` (its `--number_sample_per_shard` default, 10,000; its key is 10**4 * shard + index
in the shard). Its `files` output holds that image as `<shard>/<key>.jpg` (beside `<key>.txt`, the
caption, and `<key>.json`); its `webdataset` output holds it as the member `<key>.jpg` of
`<shard>.tar`, which extraction reads as the folder of its name (extract/shards.py): either way the
image's store key is `<shard>/<key>` under the output folder. A failed download leaves no image.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from train.data.prepare import SplitWriter
from vlbert.errors import UserError

SHARD_SIZE = 10_000  # img2dataset's --number_sample_per_shard default
EMPTY_CAPTION = "empty or whitespace-only caption"


def img2dataset_stem(folder: str, row: int) -> str:
    """The image path without extension that img2dataset writes for its input's 0-based row `row`,
    with `--output_folder` the images root's `folder` ("" for the root itself)."""
    stem = f"{row // SHARD_SIZE:05d}/{row:09d}"
    return f"{folder}/{stem}" if folder else stem


def decoded_caption(field: bytes) -> str:
    """A published caption's text, surrounding whitespace removed; ValueError saying why it is none."""
    try:
        caption = field.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("the caption is not UTF-8 text") from None
    if not caption:
        raise ValueError(EMPTY_CAPTION)
    return caption


def add_caption_row(writer: SplitWriter, row: int, where: str, caption: Callable[[], str], stem: str) -> None:
    """One published row of one caption: a record when `caption()` gives its text and the image
    `stem` (any extension) exists; else skipped, named by `row`, with `where` (file:line) and the
    ValueError's reason, or counted as a missing image."""
    try:
        text = caption()
    except ValueError as exc:
        writer.skip(row, f"{where}: {exc}")
        return
    file = writer.find_image(row, stem + ".jpg")
    if file is not None:
        writer.add({"file": file, "captions": [text]}, 1)


def pyarrow_parquet() -> ModuleType:
    """pyarrow.parquet; a UserError naming the extra that installs it where it is not importable."""
    try:
        import pyarrow.parquet
    except ImportError:
        raise UserError("reading and writing img2dataset's .parquet tables needs pyarrow: "
                        "pip install 'vlbert-pipeline[img2dataset]'") from None
    return pyarrow.parquet
