"""UNITER's image database, as its scripts/convert_imgdir.py writes it: an LMDB whose keys are the
feature files' names (`<name>.npz`, imported as the id `<name>`) and whose values hold each image's
arrays, float32 ones narrowed to float16: a map packed by msgpack (`use_bin_type=True`) in which
msgpack_numpy writes each array as a map {nd: True, type: its dtype's array-protocol text (`<f2`),
kind: b'', shape, data: its bytes}; or, in a `_compressed` database, the bytes of
np.savez_compressed. The arrays: `features` (N, D), `norm_bb` (N, 6): x1/W, y1/H, x2/W, y2/H, w/W,
h/H, `conf` (N,) each box's top class score, and `soft_labels` (N, 1601) class probabilities, which
become the store's class distributions, columns as written. The key `__keys__` holds a JSON list of
the names.

The database records no image size: boxes become fractions of a nominal square
(`NOMINAL_IMAGE_SIZE` pixels a side, recorded in meta.json), which keeps the geometry the model sees.
No whole-image feature, no class or attribute ids. A msgpack_numpy array of Python objects (kind
`O`, a pickle) is refused, not unpickled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from extract.store.formats.common import (
    NOMINAL_IMAGE_SIZE, Records, boxes_from_fractions, imported_meta, imported_record, lmdb_values, npz_arrays,
    numbers, with_first,
)
from extract.store.schema import StoreError

KEYS = b"__keys__"
ZIP_MAGIC = b"PK\x03\x04"  # np.savez_compressed's bytes: a zip archive


def read(src: Path, feature_dtype: str) -> tuple[dict[str, Any], Records]:
    (_, _, first), records = with_first(_records(src), src)
    meta = imported_meta(first, feature_dtype, f"uniter-lmdb:{src}", nominal_size=NOMINAL_IMAGE_SIZE)
    return meta, records


def _records(src: Path) -> Records:
    with lmdb_values(src) as txn:
        for key, value in txn.cursor():
            if key == KEYS:
                continue
            where = f"key {key!r}"
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError:
                raise StoreError(f"{src}: {where} is not UTF-8 text") from None
            yield where, name.removesuffix(".npz"), _record(_arrays(value, f"{src} {where}"), f"{src} {where}")


def _record(arrays: dict[str, Any], where: str) -> dict[str, Any]:
    features = numbers(arrays.get("features"), "features", where, ("N", "D"))
    fractions = numbers(arrays.get("norm_bb"), "norm_bb", where, ("N", 6))
    probs = arrays.get("soft_labels")
    return imported_record(where, boxes_from_fractions(fractions, NOMINAL_IMAGE_SIZE, NOMINAL_IMAGE_SIZE), features,
                           NOMINAL_IMAGE_SIZE, NOMINAL_IMAGE_SIZE,
                           class_probs=None if probs is None else numbers(probs, "soft_labels", where, ("N", "C")))


def _arrays(value: bytes, where: str) -> dict[str, Any]:
    """The named arrays of one value: npz bytes, or a msgpack map of msgpack_numpy arrays."""
    if value.startswith(ZIP_MAGIC):
        return npz_arrays(value, where)
    import msgpack

    try:
        packed = msgpack.unpackb(value, raw=False, ext_hook=_no_extension)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise StoreError(f"{where}: not msgpack data ({type(exc).__name__}: {exc})") from None
    if not isinstance(packed, dict):
        raise StoreError(f"{where}: holds a msgpack {type(packed).__name__}, expected a map of arrays")
    return {_text(name): _ndarray(array, _text(name), where) for name, array in packed.items()}


def _no_extension(code: int, data: bytes) -> None:
    raise ValueError(f"a msgpack extension type {code}, which msgpack_numpy does not write")


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _ndarray(value: Any, name: str, where: str) -> Any:
    """The array msgpack_numpy encoded as {nd, type, kind, shape, data} (older versions: text keys,
    no kind); other values as they are."""
    if not isinstance(value, dict):
        return value
    fields = {_text(key): field for key, field in value.items()}
    if fields.get("nd") is not True or not {"type", "shape", "data"} <= set(fields):
        raise StoreError(f"{where}: {name} is a map, not an array as msgpack_numpy writes one")
    if fields.get("kind", b"") not in (b"", ""):
        raise StoreError(f"{where}: {name} is an array of kind {fields['kind']!r}, which msgpack_numpy pickles: "
                         "only arrays of numbers are read")
    dtype, shape, data = _number_dtype(fields["type"]), fields["shape"], fields["data"]
    shaped = isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
    if dtype is None or not isinstance(data, bytes) or not shaped:
        raise StoreError(f"{where}: {name} is not an array of numbers as msgpack_numpy writes one")
    if len(data) != int(np.prod(shape)) * dtype.itemsize:
        raise StoreError(f"{where}: {name} holds {len(data)} bytes for {shape} {dtype} values")
    return np.frombuffer(data, dtype).reshape(shape)


def _number_dtype(text: Any) -> np.dtype | None:
    """The dtype an array-protocol text names, where it is one of numbers."""
    try:
        dtype = np.dtype(_text(text)) if isinstance(text, (str, bytes)) else None
    except TypeError:
        return None
    return dtype if dtype is not None and dtype.kind in "biuf" else None
