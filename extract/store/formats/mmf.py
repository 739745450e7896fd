"""MMF's region features, as its tools/scripts/features/extract_features_vmb.py and lmdb_conversion.py
write them.

`mmf-npy`: per image, `<id>.npy`, the (N, D) float32 box features, beside `<id>_info.npy`, a dict
that np.save pickles in a 0-d object array: `bbox` (N, 4) float32 in original-image pixels,
`num_boxes` (the boxes above the confidence threshold; MMF reads every row), `objects` (N,) int64,
each box's most probable class, `cls_prob` (N, C) float32 class probabilities (without the background
column, unless extracted with --background: then it is column 0 and `objects` counts it),
`image_width`, `image_height`. `mmf-lmdb` (`lmdb_conversion.py --mode convert`): each image's dict
pickled, keyed by its .npy path under the features folder without `.npy`: `features` and the info's
entries (`cls_prob` None where the info had none); the key `keys` holds the pickled list of keys.

Pickles load only through the safe unpickler. MMF keeps no confidence: objects_conf is read from
`cls_prob` at the `objects` column, so objects are imported only where `cls_prob` is there. No
whole-image feature, no attributes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from extract.store.formats.common import (
    Records, dict_in, files_in, image_id_of, imported_meta, imported_record, lmdb_values, npy_array, numbers,
    with_first,
)
from extract.store.schema import StoreError
from vlbert.utils.pickles import ARRAYS, loads_pickle

INFO = "_info.npy"
KEYS = b"keys"


def read_npy(src: Path, feature_dtype: str) -> tuple[dict[str, Any], Records]:
    files = [path for path in files_in(src, ".npy", "mmf-npy") if not path.name.endswith(INFO)]
    records = ((f"file {path.relative_to(src).as_posix()}", image_id_of(path, src, ".npy"), _npy_record(path))
               for path in files)
    (_, _, first), records = with_first(records, src)
    return imported_meta(first, feature_dtype, f"mmf-npy:{src}"), records


def _npy_record(path: Path) -> dict[str, Any]:
    info = path.with_name(path.name.removesuffix(".npy") + INFO)
    if not info.is_file():
        raise StoreError(f"{path}: no {info.name} beside it (MMF keeps the boxes and the image size there)")
    features = npy_array(path.read_bytes(), str(path))
    return _record({**dict_in(npy_array(info.read_bytes(), str(info)), "it", str(info)), "features": features},
                   f"{path} (with {info.name})")


def read_lmdb(src: Path, feature_dtype: str) -> tuple[dict[str, Any], Records]:
    (_, _, first), records = with_first(_lmdb_records(src), src)
    return imported_meta(first, feature_dtype, f"mmf-lmdb:{src}"), records


def _lmdb_records(src: Path) -> Records:
    with lmdb_values(src) as txn:
        keys = txn.get(KEYS)
        if keys is None:
            raise StoreError(f"{src}: no entry {KEYS.decode()!r} (MMF's pickled list of the image keys)")
        keys = loads_pickle(keys, f"{src} entry {KEYS.decode()!r}", StoreError, ARRAYS)
        if not isinstance(keys, list) or not all(isinstance(key, bytes) for key in keys):
            raise StoreError(f"{src}: entry {KEYS.decode()!r} holds no list of keys")
        for key in keys:
            where = f"key {key!r}"
            value = txn.get(key)
            if value is None:
                raise StoreError(f"{src}: {KEYS.decode()!r} lists {key!r}, which the LMDB does not hold")
            item = loads_pickle(value, f"{src} {where}", StoreError, ARRAYS)
            if not isinstance(item, dict):
                raise StoreError(f"{src} {where}: holds a {type(item).__name__}, expected MMF's dict of arrays")
            yield where, _image_id(key, src), _record(item, f"{src} {where}")


def _image_id(key: bytes, src: Path) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        raise StoreError(f"{src}: key {key!r} is not UTF-8 text") from None


def _record(item: dict, where: str) -> dict[str, Any]:
    """A record from MMF's dict of one image: its features and its info's entries."""
    for name in ("bbox", "image_height", "image_width"):
        if item.get(name) is None:
            raise StoreError(f"{where}: no {name} (MMF writes it from the image's _info.npy)")
    features = numbers(item.get("features"), "features", where, ("N", "D"))
    optional: dict[str, np.ndarray] = {}
    if item.get("cls_prob") is not None:
        probs = optional["class_probs"] = numbers(item["cls_prob"], "cls_prob", where, ("N", "C"))
        if item.get("objects") is not None:
            objects = numbers(item["objects"], "objects", where, (len(probs),))
            inside = not objects.size or 0 <= objects.min() <= objects.max() < probs.shape[1]
            if objects.dtype.kind not in "iu" or not inside:
                raise StoreError(f"{where}: objects holds {objects.dtype} values outside cls_prob's "
                                 f"{probs.shape[1]} columns")
            optional.update(objects_id=objects, objects_conf=np.take_along_axis(probs, objects[:, None], axis=1)[:, 0])
    return imported_record(where, numbers(item["bbox"], "bbox", where, ("N", 4)), features,
                           item["image_height"], item["image_width"], **optional)

