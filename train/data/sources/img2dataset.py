"""What img2dataset (github.com/rom1504/img2dataset) writes, for the caption readers of its inputs.

img2dataset numbers the rows of its input from 0 and writes row `i` as sample key `{i:09d}` in shard
`{i // 10000:05d}` (its `--number_sample_per_shard` default, 10,000; its key is 10**4 * shard + index
in the shard). Its `files` output holds that image as `<shard>/<key>.jpg` (beside `<key>.txt`, the
caption, and `<key>.json`); its `webdataset` output holds it as the member `<key>.jpg` of
`<shard>.tar`, which extraction reads as the folder of its name (extract/shards.py): either way the
image's store key is `<shard>/<key>` under the output folder. A failed download leaves no image.

The `img2dataset` source reads that output itself: `--root` is an output folder (`webdataset`
shards, or the `files` output's shard folders, each found by the status table beside it), lying in
`--images` or being it; `--split` names the split (default `training`). A record per sample with an
image and a `.txt` caption (surrounding whitespace removed), its file `<shard>/<key>.<ext>` relative
to `--images`, in shard and key order; a blank, non-UTF-8 or absent caption is skipped with the
reason. Each shard's `<shard>.parquet` (key, status, error_message, ...) gives the failed downloads:
skipped as missing images with their status and error, and counted by status in the split's summary
(`statuses`); a row it calls a success whose image the shard lacks (damage) is a missing image too.
A sample's `.json` repeats the parquet's row and is not read. One shard's keys are held at a time:
memory does not grow with the number of shards.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterable, Iterator

from extract.images import IMAGE_EXTENSIONS
from extract.shards import find_shards, names_shards, read_shard
from train.data.files import DataError
from train.data.prepare import Preparation, SourceOption, SplitWriter, Source
from vlbert.utils.errors import UserError

SHARD_SIZE = 10_000  # img2dataset's --number_sample_per_shard default
EMPTY_CAPTION = "empty or whitespace-only caption"
SPLIT = "training"  # the `img2dataset` source's split unless --split names another
CAPTION_EXTENSION = "txt"
STATUS_COLUMNS = ("key", "status", "error_message")  # of img2dataset's per-shard .parquet
SUCCESS = "success"
SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


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
    """pyarrow.parquet; a UserError saying how to install it where it is not importable (a
    dependency of the project, which an install with --no-deps, as on the GPU hosts, may lack)."""
    try:
        import pyarrow.parquet
    except ImportError:
        raise UserError("reading and writing img2dataset's .parquet tables needs pyarrow, a dependency of "
                        "vlbert-pipeline that is not installed here: pip install 'pyarrow>=14'") from None
    return pyarrow.parquet


# ---- the `img2dataset` source: the captions img2dataset saved beside the images ---------------


@dataclass
class Downloaded:
    """One sample img2dataset wrote: its image id (the store key), its image's extension (None:
    no image), and its caption's bytes (None: no caption saved)."""

    id: str
    extension: str | None
    caption: bytes | None


def shard_samples(shard: Path, images: Path, on_damage: Callable[[str], None]) -> Iterator[Downloaded]:
    """The samples of one webdataset shard, their captions read, image data skipped."""
    for sample in read_shard(shard, images, (CAPTION_EXTENSION,), on_damage):
        yield Downloaded(sample.id, sample.image_extension, sample.members.get(CAPTION_EXTENSION))


def folder_samples(folder: Path, images: Path, on_damage: Callable[[str], None]) -> Iterator[Downloaded]:
    """The samples of one shard folder of img2dataset's `files` output, in key order."""
    members: dict[str, dict[str, str]] = {}  # key → extension → file name
    with os.scandir(folder) as entries:
        for entry in entries:
            key, dot, extension = entry.name.partition(".")
            if dot and entry.is_file():
                members.setdefault(key, {})[extension.lower()] = entry.name
    prefix = folder.relative_to(images).as_posix()
    for key in sorted(members):
        names = members[key]
        extension = next((extension for extension in names if f".{extension}" in IMAGE_EXTENSIONS), None)
        caption = None
        if CAPTION_EXTENSION in names:
            try:
                caption = (folder / names[CAPTION_EXTENSION]).read_bytes()
            except OSError as exc:
                on_damage(f"{folder / names[CAPTION_EXTENSION]}: cannot read ({exc.strerror or exc})")
        yield Downloaded(f"{prefix}/{key}", extension, caption)


def statuses(table: Path) -> Iterator[tuple[str, str, str]]:
    """(key, status, error message) of every row of a shard's status parquet, streamed by batch;
    DataError when it cannot be read or lacks those columns."""
    parquet = pyarrow_parquet()
    try:
        rows = parquet.ParquetFile(table)
        absent = [column for column in STATUS_COLUMNS if column not in rows.schema_arrow.names]
        if absent:
            raise DataError(f"{table}: not img2dataset's status table: no column {', '.join(absent)}")
        for batch in rows.iter_batches(columns=list(STATUS_COLUMNS)):
            yield from zip(*(batch.column(column).to_pylist() for column in STATUS_COLUMNS))
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise DataError(f"{table}: cannot read as parquet ({exc})") from None


def add_shard(writer: SplitWriter, samples: Iterable[Downloaded], table: Path, counts: Counter) -> None:
    """A record per sample with an image and a caption. Skipped as missing images: the failures the
    status table lists (by status and error), its successes without an image in the shard (damage),
    and samples saved without an image that it does not list."""
    written: set[str] = set()  # one shard's keys: at most --number_sample_per_shard
    imageless: dict[str, str] = {}  # key → id
    for sample in samples:
        key = sample.id.rpartition("/")[2]
        if sample.extension is None:
            imageless[key] = sample.id
            continue
        written.add(key)
        try:
            if sample.caption is None:
                raise ValueError(f"no caption (.{CAPTION_EXTENSION}) saved")
            caption = decoded_caption(sample.caption)
        except ValueError as exc:
            writer.skip(sample.id, f"{sample.id}: {exc}")
            continue
        writer.add({"file": f"{sample.id}.{sample.extension}", "captions": [caption]}, 1)
    if table.is_file():
        prefix = table.with_suffix("").relative_to(writer.preparation.images).as_posix()
        for key, status, error in statuses(table):
            counts[status] += 1
            imageless.pop(key, None)
            if status != SUCCESS:
                writer.skip_missing_image(f"{prefix}/{key}", f"{prefix}/{key}",
                                          reason=f"{table}: {key}: img2dataset status {status}: {error}")
            elif key not in written:
                writer.skip_missing_image(f"{prefix}/{key}", f"{prefix}/{key}",
                                          reason=f"{table}: {key}: downloaded, but no image in the shard")
    for sample_id in imageless.values():
        writer.skip_missing_image(sample_id, sample_id, reason=f"{sample_id}: saved without an image")


def prepare_img2dataset(preparation: Preparation) -> None:
    images = preparation.images
    inside = os.path.relpath(preparation.root.resolve(), images.resolve())
    if inside.split(os.sep)[0] == "..":
        raise DataError(f"--root {preparation.root}: img2dataset's output folder must be --images {images} or lie "
                        "inside it, so that its images are named under --images")
    root = images / inside  # in the form of --images: ids are paths relative to it
    split = preparation.options.get("split", SPLIT)
    if not SPLIT_NAME.fullmatch(split):
        raise DataError(f"--split {split!r}: expected a name of letters, digits, '.', '_' and '-' (it names "
                        "the split's file)")
    if names_shards(root):
        shards = [(shard, shard_samples(shard, images, preparation.log)) for shard in find_shards(root)[1]]
    else:
        # The files output's shard folders, found by the status table beside each (only the tables
        # are listed: the output holds millions of files).
        folders = sorted(table.with_suffix("") for table in root.rglob("*.parquet"))
        shards = [(folder, folder_samples(folder, images, preparation.log)) for folder in folders if folder.is_dir()]
    preparation.log(f"img2dataset: {len(shards)} shards under {root}")
    counts: Counter = Counter()
    with preparation.split(split) as writer:
        for shard, samples in preparation.progress(shards, split, total=len(shards)):
            add_shard(writer, samples, shard.with_suffix(".parquet"), counts)
        writer.extra["statuses"] = dict(sorted(counts.items()))


SOURCE = Source("img2dataset", (SPLIT,), prepare_img2dataset,
                "img2dataset's output (webdataset shards or files): the captions saved beside the images, "
                "per-shard status parquet", options=(SourceOption("split", str, "the split name to write "
                                                                  "(default: training)"),),
                image_names="<shard>/<key>")
