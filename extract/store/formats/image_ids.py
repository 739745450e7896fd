"""The image ids of an HDF5 file that keeps them apart (`cache import --format h5 --ids FILE`):
hengyuan-hu/bottom-up-attention-vqa's tools/detection_features_converter.py writes `train36.hdf5`
with rows only (`image_features`, `image_bb`, `spatial_features`) and `train36_imgid2idx.pkl`, a dict
{image id (an int): row} that Python 2's cPickle wrote. The file is a .pkl, read through the safe
unpickler (plain data only: a pickle that would run code is refused), or a .json file; it holds that
dict, or a list of the ids in row order. It must name every row once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from extract.store.schema import StoreError
from vlbert.utils.pickles import load_pickle


def row_ids(path: Path, rows: int) -> list[str]:
    """The image id of each of the `rows` rows, as `path` names them."""
    value = _load(path)
    if isinstance(value, list):
        ids = value
    elif isinstance(value, dict):
        ids = _ids_by_row(value, rows, path)
    else:
        raise StoreError(f"{path}: holds a {type(value).__name__}, expected a dict of image id → row or a list "
                         "of ids")
    if len(ids) != rows:
        raise StoreError(f"{path}: names {len(ids)} rows, the HDF5 file has {rows}")
    bad = next((i for i in ids if isinstance(i, bool) or not isinstance(i, (int, str))), None)
    if bad is not None:
        raise StoreError(f"{path}: image id {bad!r} is not a number or text")
    return [str(i) for i in ids]


def _load(path: Path) -> Any:
    if path.suffix == ".json":
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"{path}: not JSON ({exc})") from None
    return load_pickle(path, StoreError)


def _ids_by_row(index: dict, rows: int, path: Path) -> list:
    ids: list = [None] * rows
    for image_id, row in index.items():
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < rows:
            raise StoreError(f"{path}: image {image_id!r} names row {row!r}; the HDF5 file has rows 0..{rows - 1}")
        if ids[row] is not None:
            raise StoreError(f"{path}: images {ids[row]!r} and {image_id!r} both name row {row}")
        ids[row] = image_id
    missing = ids.count(None)
    if missing:
        raise StoreError(f"{path}: names {rows - missing} of the HDF5 file's {rows} rows (row {ids.index(None)} "
                         "has no image id)")
    return ids
