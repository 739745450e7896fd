"""VinVL's region features, as Oscar reads them (`features.tsv`): one line per image, either
`image id \\t num_boxes \\t base64` (its retrieval, VQA and pre-training data) or `image id \\t JSON
{"num_boxes": N, "features": base64}` (its captioning data), the base64 holding (N, D + 6) float32:
each box's D (2048) features, then x1/W, y1/H, x2/W, y2/H, w/W, h/H. `features.lineidx` beside it
(Oscar's TSVFile) lists the byte offset of each line; where it is there, it must agree with the file.

The image sizes come from its predictions or label TSV (`--labels FILE`: `image id \\t JSON`, a dict
with `image_h`, `image_w` and `objects`); without one, boxes become fractions of a nominal square
(`NOMINAL_IMAGE_SIZE` pixels a side, recorded in meta.json), which keeps their geometry. The
objects in that file (class names, with boxes of their own) are not imported. No whole-image
feature, no class distributions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from extract.store.formats.common import (
    NOMINAL_IMAGE_SIZE, Records, b64_array, boxes_from_fractions, count, image_size, imported_meta, imported_record,
    with_first,
)
from extract.store.schema import StoreError

BOX_COLUMNS = 6  # x1/W, y1/H, x2/W, y2/H, w/W, h/H after each box's features


def read(src: Path, feature_dtype: str, labels: Path | None = None) -> tuple[dict[str, Any], Records]:
    if src.is_dir():
        raise StoreError(f"{src}: a folder; a vinvl-tsv import reads the features.tsv file")
    sizes = None if labels is None else _image_sizes(labels)
    (_, _, first), records = with_first(_records(src, sizes, labels), src)
    meta = imported_meta(first, feature_dtype, f"vinvl-tsv:{src}",
                         nominal_size=NOMINAL_IMAGE_SIZE if sizes is None else None)
    return meta, records


def _records(src: Path, sizes: dict[str, tuple[int, int]] | None, labels: Path | None) -> Records:
    offsets = []
    for number, start, fields in _lines(src):
        offsets.append(start)
        where = f"{src} line {number}"
        image_id, rows, encoded = _fields(fields, where)
        if sizes is not None and image_id not in sizes:
            raise StoreError(f"{labels}: no line for image {image_id!r} of {where}")
        height, width = (NOMINAL_IMAGE_SIZE, NOMINAL_IMAGE_SIZE) if sizes is None else sizes[image_id]
        values = b64_array(encoded, "float32", rows, "features", where)
        if values.shape[1] <= BOX_COLUMNS:
            raise StoreError(f"{where}: {values.shape[1]} values a box, expected the features then {BOX_COLUMNS} "
                             "box coordinates")
        boxes = boxes_from_fractions(values[:, -BOX_COLUMNS:], height, width)
        yield f"line {number}", image_id, imported_record(where, boxes, values[:, :-BOX_COLUMNS], height, width)
    _check_line_index(src, offsets)


def _lines(path: Path) -> Iterator[tuple[int, int, list[str]]]:
    """(line number, its byte offset, its tab-separated fields) of each line of a TSV file."""
    offset = 0
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StoreError(f"{path} line {number}: not UTF-8 text ({exc.reason})") from None
            yield number, start, text.rstrip("\r\n").split("\t")


def _fields(fields: list[str], where: str) -> tuple[str, int, str]:
    """(image id, box count, base64) of a features line, in either of Oscar's layouts."""
    if len(fields) == 3:
        return fields[0], count(fields[1], "num_boxes", where), fields[2]
    if len(fields) == 2:
        data = _json(fields[1], where)
        if not isinstance(data, dict) or not {"num_boxes", "features"} <= set(data):
            raise StoreError(f"{where}: its JSON is no object with num_boxes and features")
        return fields[0], count(data["num_boxes"], "num_boxes", where), data["features"]
    raise StoreError(f"{where}: {len(fields)} tab-separated fields, expected 3 (image id, num_boxes, base64) or 2 "
                     "(image id, JSON)")


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StoreError(f"{where}: not JSON ({exc})") from None


def _image_sizes(labels: Path) -> dict[str, tuple[int, int]]:
    """image id → (image_h, image_w), from each line of a predictions or label TSV."""
    sizes = {}
    for number, _, fields in _lines(labels):
        where = f"{labels} line {number}"
        if len(fields) != 2:
            raise StoreError(f"{where}: {len(fields)} tab-separated fields, expected 2 (image id, JSON)")
        data = _json(fields[1], where)
        if not isinstance(data, dict) or not {"image_h", "image_w"} <= set(data):
            raise StoreError(f"{where}: no image_h and image_w (a bare list of objects gives no image size; "
                             "import without --labels to keep boxes as fractions of a nominal image)")
        sizes[fields[0]] = image_size(data["image_h"], "image_h", where), image_size(data["image_w"], "image_w", where)
    return sizes


def _check_line_index(src: Path, offsets: list[int]) -> None:
    """A `.lineidx` beside the file must list the offset of each of its lines (a truncated or edited
    features.tsv no longer matches the index Oscar seeks by)."""
    index = src.with_suffix(".lineidx")
    if not index.is_file():
        return
    try:
        listed = [int(line) for line in index.read_text(encoding="utf-8").split()]
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{index}: not a list of byte offsets ({exc})") from None
    if listed != offsets:
        wrong = next((i for i, (a, b) in enumerate(zip(listed, offsets)) if a != b), min(len(listed), len(offsets)))
        raise StoreError(f"{index}: lists {len(listed)} lines, {src} has {len(offsets)}; they differ from line "
                         f"{wrong + 1} on (a truncated or edited file?)")
