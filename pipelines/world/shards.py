"""A world's images as img2dataset would write them, had it downloaded them: its `webdataset` output
(numbered `.tar` shards) and its `files` output (numbered folders), with a caption per image.

What img2dataset writes, per shard NNNNN (5 digits): `NNNNN.tar` holding per sample `KEY.jpg`,
`KEY.json` and `KEY.txt` (webdataset), or the folder `NNNNN/` holding the same three files (files);
beside it `NNNNN.parquet` (one row per input row, failed downloads included: key, status,
error_message, caption, url, width, height, original_width, original_height, exif, sha256) and
`NNNNN_stats.json`. KEY is img2dataset's: shard × samples_per_shard + the row's index in its shard,
zero-padded to ceil(log10(samples_per_shard)) + 5 digits (9 with its default 10000 per shard).

Here the "download" of a row is the world's PNG file: sha256 is that file's, the image is stored as a
JPEG of quality 95 (img2dataset's default encoding) without resizing (its resize_mode=no), and the
url is made up (`https://demo-world.invalid/<file>`). A row listed in `failed` is written as a failed
download: its parquet row says so, and no member or file is written for it, as img2dataset does.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Collection, Iterable

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from pipelines.world.generate import SPLITS, load_split
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.paths import checked

OUTPUT_FORMATS = ("webdataset", "files")
JPEG_QUALITY = 95  # img2dataset's default encode_quality
SHARD_DIGITS = 5  # img2dataset's file names: str(shard).zfill(5) for fewer than 100000 shards
URL_PREFIX = "https://demo-world.invalid/"
PARQUET_SCHEMA = pa.schema([
    ("key", pa.string()), ("status", pa.string()), ("error_message", pa.string()), ("caption", pa.string()),
    ("url", pa.string()), ("width", pa.int64()), ("height", pa.int64()), ("original_width", pa.int64()),
    ("original_height", pa.int64()), ("exif", pa.string()), ("sha256", pa.string()),
])


def image_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """img2dataset's input rows for world image records: each with its url and first caption."""
    return [{"url": URL_PREFIX + record["file"], "caption": record["captions"][0], "file": record["file"]}
            for record in records]


def world_rows(world: Path) -> list[dict[str, Any]]:
    """img2dataset's input rows for a world: each image, train then val."""
    return image_rows([record for split in SPLITS for record in load_split(world, split)])


def write_img2dataset(world: str | Path, out: str | Path, output_format: str = "webdataset",
                      samples_per_shard: int = 10_000, failed: Collection[str] = (),
                      rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Writes the world's images (those of `rows`, img2dataset's input rows; default: every image,
    `world_rows`) to `out` as img2dataset's `output_format` output and returns the parquet rows of
    every shard, in order (with `file`, the world's image file of the row). The rows whose url is in
    `failed` are failed downloads."""
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"output_format {output_format!r}: expected one of {', '.join(OUTPUT_FORMATS)}")
    world, out = Path(world), Path(out)
    made_folder(out)
    rows = world_rows(world) if rows is None else rows
    key_digits = math.ceil(math.log10(samples_per_shard)) + SHARD_DIGITS
    written = []
    for shard, first in enumerate(range(0, len(rows), samples_per_shard)):
        start = time.time()
        name = str(shard).zfill(SHARD_DIGITS)
        results = []
        for index, row in enumerate(rows[first:first + samples_per_shard]):
            key = str(shard * samples_per_shard + index).zfill(key_digits)
            results.append(_download(world, row, key, row["url"] in failed))
        samples = [(result, members) for result, members in results if members]
        if output_format == "webdataset":
            write_tar(out / f"{name}.tar", ((f"{result['key']}.{extension}", members[extension])
                                            for result, members in samples for extension in sorted(members)))
        else:
            for result, members in samples:
                for extension, data in members.items():
                    checked(made_folder(out / name) / f"{result['key']}.{extension}").write_bytes(data)
        table = [result for result, _ in results]
        pq.write_table(pa.Table.from_pylist([{k: r[k] for k in PARQUET_SCHEMA.names} for r in table],
                                            schema=PARQUET_SCHEMA), checked(out / f"{name}.parquet"))
        write_atomically(out / f"{name}_stats.json", json.dumps(_stats(table, start), indent=4) + "\n")
        written += table
    return written


def _download(world: Path, row: dict[str, Any], key: str, failed: bool) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(the row's parquet entry, its members by extension; none for a failed download)."""
    result = {"key": key, "status": "success", "error_message": None, "caption": row["caption"], "url": row["url"],
              "width": None, "height": None, "original_width": None, "original_height": None, "exif": None,
              "sha256": None, "file": row["file"]}
    if failed:
        result.update(status="failed_to_download", error_message="HTTP Error 404: Not Found")
        return result, {}
    original = (world / row["file"]).read_bytes()
    with Image.open(io.BytesIO(original)) as image:
        encoded = io.BytesIO()
        image.convert("RGB").save(encoded, format="JPEG", quality=JPEG_QUALITY)
        width, height = image.size
    result.update(width=width, height=height, original_width=width, original_height=height,
                  sha256=hashlib.sha256(original).hexdigest())
    meta = {k: result[k] for k in PARQUET_SCHEMA.names}
    return result, {"jpg": encoded.getvalue(), "json": json.dumps(meta).encode(), "txt": row["caption"].encode()}


def write_tar(path: Path, members: Iterable[tuple[str, bytes]]) -> None:
    """An uncompressed tar of `members` (name, data), in order, as webdataset shards are."""
    with tarfile.open(checked(path), "w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o444
            archive.addfile(info, io.BytesIO(data))


def _stats(results: list[dict[str, Any]], start: float) -> dict[str, Any]:
    statuses = Counter(result["error_message"] or result["status"] for result in results)
    successes = statuses.get("success", 0)
    return {"count": len(results), "successes": successes, "failed_to_download": len(results) - successes,
            "failed_to_resize": 0, "duration": time.time() - start, "start_time": start, "end_time": time.time(),
            "status_dict": dict(statuses)}
