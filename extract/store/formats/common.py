"""What every reader of others' feature files shares: the meta.json of an imported store, a record
built from a file's arrays (each checked and given the schema's dtype, in one line naming the file
and the field), base64 and .npy decoding (an object array's pickle only through vlbert/utils/pickles.py),
and another program's LMDB opened read-only once `check_data_file` found that LMDB cannot read
outside it."""

from __future__ import annotations

import base64
import binascii
import io
import itertools
import math
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import lmdb
import numpy as np

from extract.store.lmdb_file import DamagedFileError, check_data_file
from extract.store.schema import FIELDS, StoreError, build_meta
from vlbert.utils.pickles import OBJECT_ARRAYS, loads_pickle

MEAN_IMAGE_FEATURE = "mean of the box features (the source has no whole-image feature)"
# Formats that keep boxes only as fractions of their image give no image size: their boxes become
# fractions of a square this many pixels a side, which keeps the geometry the model sees (box / size).
NOMINAL_IMAGE_SIZE = 1000
NOMINAL_SIZE_KEY = "nominal_image_size"  # meta.json: the side of that square, where one stands in

Records = Iterator[tuple[str, str, dict]]  # (where in the source, image id, record)


def imported_meta(first: dict, feature_dtype: str, source: str, image_feature: str = MEAN_IMAGE_FEATURE,
                  nominal_size: int | None = None) -> dict[str, Any]:
    """meta.json of a store imported from `source`, whose records hold what its `first` record holds."""
    class_probs = first.get("class_probs")
    meta = build_meta(feature_dim=first["features"].shape[1], feature_dtype=feature_dtype, mode="imported",
                      source=source, has_objects="objects_id" in first, has_attributes="attrs_id" in first,
                      image_feature_source=image_feature,
                      num_classes=None if class_probs is None else class_probs.shape[1])
    if nominal_size is not None:
        meta[NOMINAL_SIZE_KEY] = nominal_size
    return meta


def with_first(records: Records, src: Path) -> tuple[tuple[str, str, dict], Records]:
    """The first of `records` (which sets meta.json) and all of them; StoreError when there is none."""
    first = next(records, None)
    if first is None:
        raise StoreError(f"{src}: no records")
    return first, itertools.chain([first], records)


def files_in(src: Path, suffix: str, what: str) -> list[Path]:
    """The files under the folder `src` whose names end with `suffix`, in order."""
    if not src.is_dir():
        raise StoreError(f"{src}: not a folder (a {what} import reads a folder of {suffix} files)")
    files = sorted(path for path in src.rglob(f"*{suffix}") if path.is_file())
    if not files:
        raise StoreError(f"{src}: no {suffix} files")
    return files


def image_id_of(path: Path, root: Path, suffix: str) -> str:
    """The image id a file names: its path under `root` without `suffix`."""
    return path.relative_to(root).as_posix().removesuffix(suffix)


def image_size(value: Any, name: str, where: str) -> int:
    """An image's height or width as a file gives it (text, a number, a 0-d array): a positive whole
    number of pixels; StoreError naming `where` otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number >= 1 and number.is_integer()):
        shown = value.item() if isinstance(value, (np.ndarray, np.generic)) and np.size(value) == 1 else value
        raise StoreError(f"{where}: {name} {shown!r} is not a positive whole number of pixels")
    return int(number)


def mean_image_feature(features: np.ndarray) -> np.ndarray:
    return features.astype(np.float32).mean(axis=0) if len(features) else np.zeros(features.shape[1], np.float32)


def numbers(value: Any, name: str, where: str, shape: tuple[int | str, ...]) -> np.ndarray:
    """`value` as an array of numbers of `shape` (letters: any length, numbers: that length);
    StoreError naming the field otherwise."""
    if value is None:
        raise StoreError(f"{where}: no {name}")
    fits = (isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.ndim == len(shape)
            and all(isinstance(want, str) or have == want for have, want in zip(value.shape, shape)))
    if not fits:
        found = (f"{value.dtype} values of shape {value.shape}" if isinstance(value, np.ndarray)
                 else type(value).__name__)
        raise StoreError(f"{where}: {name} holds {found}, expected numbers of shape ({', '.join(map(str, shape))})")
    return value


def imported_record(where: str, boxes: np.ndarray, features: np.ndarray, image_h: Any, image_w: Any,
                    image_feature: np.ndarray | None = None, **optional: np.ndarray | None) -> dict[str, Any]:
    """A record from a file's arrays: each in the schema's dtype (integers and floats stay what they
    are; a float id is refused), the mean of the box features without a whole-image feature, the
    optional fields (objects_id, class_probs, ...) that are not None."""
    record = {"boxes": _schema_typed(boxes, "boxes", where), "features": features,
              "image_feature": mean_image_feature(features) if image_feature is None else image_feature,
              "image_h": image_size(image_h, "image_h", where), "image_w": image_size(image_w, "image_w", where),
              "box_source": "imported"}
    record.update({name: _schema_typed(value, name, where) for name, value in optional.items() if value is not None})
    return record


def _schema_typed(value: np.ndarray, name: str, where: str) -> np.ndarray:
    kind = FIELDS[name][0]
    if kind in ("feature", "probability"):  # the store's feature dtype: the writer casts them
        return value
    try:
        return value.astype(kind, casting="same_kind", copy=False)
    except TypeError:
        raise StoreError(f"{where}: {name} holds {value.dtype} values, expected {kind}") from None


def boxes_from_fractions(fractions: np.ndarray, height: int, width: int) -> np.ndarray:
    """(N, 4) boxes in pixels from x1/W, y1/H, x2/W, y2/H (the first four columns)."""
    return (fractions[:, :4].astype(np.float64) * (width, height, width, height)).astype(np.float32)


def b64_array(text: Any, dtype: str, rows: int, name: str, where: str, columns: int | None = None) -> np.ndarray:
    """A base64 field holding `rows` rows of little-endian `dtype` values (`columns` each, or as many
    as its bytes make); StoreError naming the field when it is not base64 or its size does not fit."""
    if not isinstance(text, (str, bytes)):
        raise StoreError(f"{where}: {name} is {type(text).__name__}, expected base64 text")
    try:
        data = base64.b64decode(text)
    except (binascii.Error, ValueError) as exc:
        raise StoreError(f"{where}: {name} is not base64 ({exc})") from None
    values, remainder = divmod(len(data), np.dtype(dtype).itemsize)
    width = columns if columns is not None else (values // rows if rows > 0 else 0)
    if rows < 0 or remainder or values != rows * width:
        shape = f"{rows} x {columns if columns is not None else 'D'}"
        raise StoreError(f"{where}: {name} holds {len(data)} bytes, not {shape} {dtype} values (truncated?)")
    return np.frombuffer(data, np.dtype(dtype).newbyteorder("<")).reshape(rows, width).astype(dtype)


def count(value: Any, name: str, where: str) -> int:
    """A box count as a file gives it: a non-negative whole number."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer, str)):
        raise StoreError(f"{where}: {name} {value!r} is not a count")
    try:
        number = int(value)
    except ValueError:
        raise StoreError(f"{where}: {name} {value!r} is not a count") from None
    if number < 0:
        raise StoreError(f"{where}: {name} {value!r} is not a count")
    return number


def npy_array(data: bytes, where: str) -> np.ndarray:
    """The array a .npy file's bytes hold. An object array (what np.save writes for a dict) is a
    pickle: it loads through the safe unpickler (plain data and arrays of numbers in it), so one that
    would run code is refused before anything runs."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(stream)
        if not dtype.hasobject:
            stream.seek(0)
            return np.lib.format.read_array(stream, allow_pickle=False)
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise StoreError(f"{where}: not a readable .npy array ({exc})") from None
    array = loads_pickle(data[stream.tell():], where, StoreError, OBJECT_ARRAYS)
    if not isinstance(array, np.ndarray) or array.shape != shape or array.dtype != dtype:
        raise StoreError(f"{where}: its pickle holds {type(array).__name__}, not the {dtype} array of shape {shape} "
                         "its header names")
    return array


def npz_arrays(source: Path | bytes, where: str) -> dict[str, np.ndarray]:
    """Every array of an .npz archive (a file, or its bytes), each read by `npy_array`."""
    try:
        with zipfile.ZipFile(source if isinstance(source, Path) else io.BytesIO(source)) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
        raise StoreError(f"{where}: not a readable .npz archive ({exc})") from None
    return {name.removesuffix(".npy"): npy_array(data, f"{where} {name}") for name, data in members.items()}


def dict_in(array: np.ndarray, name: str, where: str) -> dict:
    """The dict that np.save stored as a 0-d object array."""
    value = array.item() if array.dtype.hasobject and array.shape == () else None
    if not isinstance(value, dict):
        raise StoreError(f"{where}: {name} holds {array.dtype} values of shape {array.shape}, expected a dict")
    return value


@contextmanager
def lmdb_values(path: Path) -> Iterator[lmdb.Transaction]:
    """A read transaction on another program's LMDB environment (a folder holding data.mdb, or the
    data file itself), opened read-only without a lock file, after `check_data_file` found that LMDB
    cannot read outside the file (a truncated or damaged one would crash the process)."""
    data = path / "data.mdb" if path.is_dir() else path
    try:
        check_data_file(data)
    except DamagedFileError as exc:
        raise StoreError(f"{data}: not an intact LMDB data file ({exc})") from None
    except OSError as exc:
        raise StoreError(f"{data}: unreadable ({exc.strerror or exc})") from None
    try:
        env = lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False, readahead=False, meminit=False)
    except lmdb.Error as exc:
        raise StoreError(f"{path}: LMDB error: {exc}") from None
    try:
        with env.begin() as txn:
            yield txn
    finally:
        env.close()
