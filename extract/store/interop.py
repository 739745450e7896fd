"""FeatureStore ⇄ the formats other VL code reads: per-image .npz, bottom-up-attention TSV, VQA-style HDF5;
and, import only, the files other projects write (extract/store/formats: bottom-up-attention.pytorch's
npz, VL-BERT's JSON, MMF's npy and LMDB, UNITER's LMDB, VinVL's TSV).

TSV (LXMERT's ten fields) and HDF5 carry no whole-image feature: exports drop it (HDF5 keeps it in
an extra `whole_image_features` dataset), imports without one store the mean of the box features
and say so in meta.json (`features.image_feature`). What a format cannot carry is named, field by
field, in a warning on export and on import.

A TSV field cannot hold a tab or a line break: an image id's tabs, newlines, carriage returns and
backslashes are written as the escapes `\\t`, `\\n`, `\\r` and `\\\\` (PostgreSQL's text format), with a
warning that names the first such id; `import` reverses them.

Exports refuse a damaged record or a store whose records disagree with its meta.json, and write
under a temporary name renamed into place at the end, so a refused export leaves no partial file.

Files from others are checked as they are read: an image id that could name a file outside an npz
export's folder (vlbert/utils/paths.py) is refused at import and at export, and so is an id met twice
in one source, an image size that is not a positive whole number, or a record whose fields, shapes
or sizes disagree with the meta.json that the source's first record set (one line naming the record
and the field). An import builds the store in a staging folder beside `--out`
(`.<name>.importing-<pid>`) and renames it into place only when every record is in: a failed import
leaves no store that `cache verify` could accept, and the staging folder of a killed one is removed
by the next import into the same `--out`. Neither command writes where it reads (`--out` apart from
the source and the files beside it that a format reads).
"""

from __future__ import annotations

import base64
import glob
import json
import os
import re
import shutil
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from extract.store.formats import bua_npz, mmf, uniter, vinvl, vlbert_json
from extract.store.formats.common import (
    MEAN_IMAGE_FEATURE, NOMINAL_IMAGE_SIZE, NOMINAL_SIZE_KEY, Records, b64_array, count, files_in, image_id_of,
    image_size, imported_meta, imported_record, mean_image_feature, with_first,
)
from extract.store.formats.image_ids import row_ids
from extract.store.layout import META, read_meta, shard_dirs, writer_active
from extract.store.reader import FeatureStore
from extract.store.schema import FIELDS, RecordLayout, StoreError
from extract.store.writer import FeatureStoreWriter
from vlbert.utils.errors import UserError
from vlbert.utils.paths import check_apart, outside_reason, path_inside

TSV_FIELDS = ("img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf",
              "num_boxes", "boxes", "features")
TSV_FIELDS_ORIGINAL = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
# What a TSV field cannot hold as it is, and how it is written instead (`\\` first when reversing).
TSV_ID_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_TSV_ID_ESCAPED = re.compile(r"\\[\\tnr]")
_TSV_ID_UNESCAPES = {escaped: character for character, escaped in TSV_ID_ESCAPES.items()}
IMPORT_BATCH = 256
# The files beside a source that some formats read (Format.options), by their `cache import` option.
IMPORT_FILES = {"ids": "the image ids of an h5 file without image_ids",
                "labels": "vinvl-tsv's predictions or label TSV"}


@dataclass(frozen=True)
class Content:
    """Something a store may hold beyond boxes and features, which a format may not carry."""

    what: str
    without: str  # what a store imported without it cannot do, or holds instead
    present: Callable[[dict], bool]  # whether a meta.json records it


CONTENTS = {
    "image_feature": Content("the whole-image feature", "the mean of the box features stands in for it",
                             lambda meta: meta["features"]["image_feature"] != MEAN_IMAGE_FEATURE),
    "objects": Content("objects_id/objects_conf", "no detected classes per box", lambda meta: meta["objects"]),
    "attributes": Content("attrs_id/attrs_conf", "no detected attributes per box", lambda meta: meta["attributes"]),
    "class_probs": Content("the class distributions", "masked RoI classification cannot be trained from it",
                           lambda meta: meta["class_probs"] is not None),
    "mask_variants": Content("the masked-pixel variants", "pre-training from it needs roi_masking: feature",
                             lambda meta: meta["mask_variants"]["count"] > 0),
    "detector": Content("the detector config", "end-to-end stages cannot use it",
                        lambda meta: bool((meta.get("detector") or {}).get("config"))),
    "image_size": Content("the image sizes", f"boxes are fractions of a nominal {NOMINAL_IMAGE_SIZE}-pixel square "
                          f"(meta.json {NOMINAL_SIZE_KEY}): their geometry is kept, their pixels are not",
                          lambda meta: meta.get(NOMINAL_SIZE_KEY) is None),
}


@dataclass(frozen=True)
class Format:
    source: str  # what `cache import` reads: "a folder of .npz files"
    # (source, feature dtype, the `options` given) → (meta, records as (where in the source, image id, record))
    read: Callable[..., tuple[dict[str, Any], Records]]
    carries: tuple[str, ...]  # the CONTENTS it can hold
    export: Callable[[FeatureStore, Path], None] | None = None  # None: read by `cache import` only
    export_notes: Callable[[FeatureStore], list[str]] = lambda store: []  # how it changes what it exports
    options: tuple[str, ...] = ()  # the IMPORT_FILES its reader takes


def export_store(root: str | Path, fmt: str, out: str | Path) -> int:
    """Writes every record of the store at `root` to `out` in `fmt`; returns the record count.
    A damaged record, or records that disagree with meta.json, stop it with nothing written."""
    out = Path(out)
    form = _format(fmt)
    if form.export is None:
        raise StoreError(f"format {fmt!r} is read by `cache import` only; export to one of {', '.join(EXPORT_FORMATS)}")
    check_apart(out, (("CACHE", root),))
    if fmt == "npz" and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"{out}: exists and is not an empty directory; export npz files to a new one")
    if fmt != "npz" and out.is_dir():
        raise StoreError(f"{out}: a folder; a {fmt} export is one file")
    with FeatureStore(root, check_layout=True) as store:
        store.check_agreement()
        for image_id in store.keys():
            _check_id(image_id, str(root))
        for name, content in CONTENTS.items():
            if name not in form.carries and content.present(store.meta):
                warnings.warn(f"{out}: not exported: {content.what}; the {fmt} format does not carry it", stacklevel=2)
        for note in form.export_notes(store):
            warnings.warn(f"{out}: {note}", stacklevel=2)
        partial = _beside(out, "partial")
        try:
            form.export(store, partial)
            os.replace(partial, out)
        finally:
            _remove(partial)
        return len(store)


def import_store(src: str | Path, fmt: str, out: str | Path, feature_dtype: str = "float16",
                 ids: str | Path | None = None, labels: str | Path | None = None) -> int:
    """Writes the records in `src` (what `FORMATS[fmt].source` says) into a new FeatureStore `out`
    (absent, or an empty folder) and returns how many it holds; warns, field by field, what the
    result lacks and why. `ids` and `labels` name the files beside it that some formats read
    (`IMPORT_FILES`). Any problem in the source leaves no `out`."""
    form = _format(fmt)
    src, out = Path(src), Path(out)
    files = {name: Path(path) for name, path in (("ids", ids), ("labels", labels)) if path is not None}
    if not src.exists():
        raise StoreError(f"{src}: no such file or folder (the {fmt} format reads {form.source})")
    for name, path in files.items():
        if name not in form.options:
            raise UserError(f"--{name} {path}: the {fmt} format reads no such file (--{name}: {IMPORT_FILES[name]})")
        if not path.is_file():
            raise StoreError(f"{path}: no such file (--{name})")
    check_apart(out, (("SRC", src), *((f"--{name}", path) for name, path in files.items())))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StoreError(f"{out}: exists and is not an empty folder; import into a new one")
    meta, records = form.read(src, feature_dtype, **files)
    for name, content in CONTENTS.items():
        if not content.present(meta):
            reason = "not in the source" if name in form.carries else f"the {fmt} format does not carry it"
            warnings.warn(f"{src}: imported without {content.what} ({content.without}); {reason}", stacklevel=2)
    _sweep_killed_imports(out)
    staging = _beside(out, "importing")
    try:
        stored = 0
        with FeatureStoreWriter(staging, meta) as writer:
            for batch in _chunks(_checked(src, records, meta), IMPORT_BATCH):
                writer.commit(dict(batch))
                stored += len(batch)
        os.rename(staging, out.resolve())  # replaces an empty folder, as a whole
    finally:
        _remove(staging)
    return stored


def _checked(src: Path, records: Iterable[tuple[str, str, dict]], meta: dict) -> Iterator[tuple[str, dict]]:
    """(image id, record) of each of `records`; StoreError for an id met twice, naming both places, or
    a record whose fields and shapes disagree with `meta` (which the source's first record set)."""
    layout = RecordLayout({**meta, "features": {**meta["features"], "dtype": "float32"}})
    seen: dict[str, str] = {}
    for where, image_id, record in records:
        _check_id(image_id, f"{src} {where}")
        if image_id in seen:
            raise StoreError(f"{src}: image id {image_id!r} is on {seen[image_id]} and again on {where}; a store "
                             "holds each id once")
        problems = layout.problems(_widened(record))
        if problems:
            raise StoreError(f"{src} {where}: {'; '.join(problems)} (every record of a store holds the fields and "
                             "shapes that its meta.json names: here, those of the source's first record)")
        seen[image_id] = where
        yield image_id, record


def _widened(record: dict) -> dict:
    """The record with its feature and probability fields as float32, which the check of its layout
    expects: the writer casts them to the store's dtype, whatever the source's was."""
    return {name: value.astype(np.float32, copy=False) if FIELDS.get(name, ("",))[0] in ("feature", "probability")
            else value for name, value in record.items()}


def _check_id(image_id: str, where: str) -> None:
    """StoreError for an id that could name a file outside an npz export's folder, or another id's."""
    reason = outside_reason(image_id)
    if reason is not None:
        raise StoreError(f"{where}: image id {image_id!r} {reason}; an npz export writes <id>.npz, which must "
                         "stay inside its folder")


def _beside(out: Path, doing: str) -> Path:
    """A hidden folder or file beside `out` for this process to build it in."""
    out = out.resolve()
    return out.with_name(f".{out.name}.{doing}-{os.getpid()}")


def _sweep_killed_imports(out: Path) -> None:
    """Removes the staging folders of imports into `out` that no live process writes any more."""
    out = out.resolve()
    for staging in out.parent.glob(f".{glob.escape(out.name)}.importing-*"):
        if staging.is_dir() and not any(writer_active(shard) for shard in shard_dirs(staging)):
            shutil.rmtree(staging, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise StoreError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# ---- npz: one file per image, plus the store's meta.json -------------------------------------------

def _export_npz(store: FeatureStore, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / META).write_text(json.dumps(store.meta, indent=2) + "\n")
    for image_id, record in store.items():
        path = path_inside(out, f"{image_id}.npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {k: v for k, v in record.items() if isinstance(v, np.ndarray)}
        np.savez(path, **arrays, image_h=np.int64(record["image_h"]), image_w=np.int64(record["image_w"]),
                 num_boxes=np.int64(len(record["boxes"])), box_source=np.str_(record["box_source"]))


def _import_npz(src: Path, feature_dtype: str) -> tuple[dict[str, Any], Records]:
    files = files_in(src, ".npz", "npz")
    parsed = ((f"file {path.relative_to(src).as_posix()}", image_id_of(path, src, ".npz"), *_npz_record(path))
              for path in files)
    (_, _, first, whole), parsed = with_first(parsed, src)
    if (src / META).is_file():  # exported by a FeatureStore: keep what it recorded
        meta = {**read_meta(src), "source": f"npz:{src}"}
        meta["features"] = {**meta["features"], "dtype": feature_dtype}
    else:
        meta = imported_meta(first, feature_dtype, f"npz:{src}", "imported" if whole else MEAN_IMAGE_FEATURE)
        if "mask_boxes" in first:
            meta["mask_variants"]["count"] = first["mask_boxes"].shape[0]
    return meta, ((where, image_id, record) for where, image_id, record, _ in parsed)


def _npz_record(path: Path) -> tuple[dict[str, Any], bool]:
    """The record of one image's .npz file, and whether the file held its whole-image feature."""
    arrays = _read_npz(path)
    record = {k: v for k, v in arrays.items() if k in FIELDS}
    whole = "image_feature" in record
    record.setdefault("image_feature", mean_image_feature(record["features"]))
    record.update(image_h=image_size(arrays.get("image_h"), "image_h", str(path)),
                  image_w=image_size(arrays.get("image_w"), "image_w", str(path)),
                  box_source=str(arrays["box_source"]) if "box_source" in arrays else "imported")
    return record, whole


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of one image's .npz file, which holds at least its boxes and features (N, D)."""
    if not zipfile.is_zipfile(path):
        raise StoreError(f"{path}: not a .npz file (not a zip archive)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise StoreError(f"{path}: not a readable .npz file ({exc})") from None
    for name in ("boxes", "features"):
        if name not in arrays or arrays[name].ndim != 2:
            raise StoreError(f"{path}: no {name} array of two dimensions (N, {'4' if name == 'boxes' else 'D'})")
    return arrays


# ---- TSV: bottom-up-attention / LXMERT --------------------------------------------------------------

def _b64(array: np.ndarray | None, dtype: str) -> str:
    if array is None:
        return ""
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()).decode()


def escape_tsv_id(image_id: str) -> str:
    return "".join(TSV_ID_ESCAPES.get(character, character) for character in image_id)


def unescape_tsv_id(field: str) -> str:
    """Reverses `escape_tsv_id`; a backslash before any other character stays as it is."""
    return _TSV_ID_ESCAPED.sub(lambda match: _TSV_ID_UNESCAPES[match.group()], field)


def _tsv_export_notes(store: FeatureStore) -> list[str]:
    escaped = [image_id for image_id in store.keys() if escape_tsv_id(image_id) != image_id]
    if not escaped:
        return []
    return [f"{len(escaped)} image id(s) hold a tab, line break or backslash (e.g. {escaped[0]!r}); written with the "
            "escapes \\t \\n \\r \\\\, which `vlbert cache import` reverses and other readers keep as they are"]


def _export_tsv(store: FeatureStore, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for image_id, r in store.items():
            row = [escape_tsv_id(image_id), str(r["image_h"]), str(r["image_w"]),
                   _b64(r.get("objects_id"), "int64"), _b64(r.get("objects_conf"), "float32"),
                   _b64(r.get("attrs_id"), "int64"), _b64(r.get("attrs_conf"), "float32"),
                   str(len(r["boxes"])), _b64(r["boxes"], "float32"), _b64(r["features"], "float32")]
            f.write("\t".join(row) + "\n")


def _import_tsv(src: Path, feature_dtype: str) -> tuple[dict[str, Any], Records]:
    # Split by hand rather than with csv: base64 fields exceed csv's default field size limit.
    def rows():
        with src.open(encoding="utf-8") as f:
            try:
                for number, line in enumerate(f, 1):
                    if line.strip():
                        image_id, record = _tsv_row(src, number, line)
                        yield f"line {number}", image_id, record
            except UnicodeDecodeError as exc:
                raise StoreError(f"{src}: not UTF-8 text ({exc})") from None

    (_, _, first), records = with_first(rows(), src)
    return imported_meta(first, feature_dtype, f"tsv:{src}"), records


def _tsv_row(src: Path, number: int, line: str) -> tuple[str, dict[str, Any]]:
    fields = line.rstrip("\n").split("\t")
    names = {len(TSV_FIELDS): TSV_FIELDS, len(TSV_FIELDS_ORIGINAL): TSV_FIELDS_ORIGINAL}.get(len(fields))
    if names is None:
        raise StoreError(f"{src} line {number}: {len(fields)} tab-separated fields, expected "
                         f"{len(TSV_FIELDS)} ({', '.join(TSV_FIELDS)}) or {len(TSV_FIELDS_ORIGINAL)}")
    row = dict(zip(names, fields))
    where = f"{src} line {number}"
    n = count(row["num_boxes"], "num_boxes", where)
    optional = {name: b64_array(row[name], dtype, n, name, where, columns=1)[:, 0]
                for name, dtype in (("objects_id", "int64"), ("objects_conf", "float32"),
                                    ("attrs_id", "int64"), ("attrs_conf", "float32")) if row.get(name)}
    record = imported_record(where, b64_array(row["boxes"], "float32", n, "boxes", where, columns=4),
                             b64_array(row["features"], "float32", n, "features", where),
                             image_size(row.get("img_h", row.get("image_h")), "img_h", where),
                             image_size(row.get("img_w", row.get("image_w")), "img_w", where), **optional)
    return unescape_tsv_id(row.get("img_id", row.get("image_id"))), record


# ---- HDF5: VQA bottom-up ports ----------------------------------------------------------------------

def spatial_features(boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    """(N, 6): x1/W, y1/H, x2/W, y2/H, w/W, h/H."""
    x1, y1, x2, y2 = boxes.T
    return np.stack([x1 / width, y1 / height, x2 / width, y2 / height, (x2 - x1) / width, (y2 - y1) / height],
                    axis=1).astype(np.float32)


def _export_h5(store: FeatureStore, out: Path) -> None:
    import h5py

    ids = store.keys()
    counts = [len(store[i]["boxes"]) for i in ids]
    rows, width, dim = len(ids), max(counts, default=0), store.meta["features"]["dim"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(out, "w") as f:
        features = f.create_dataset("image_features", (rows, width, dim), dtype="float32")
        boxes = f.create_dataset("image_bb", (rows, width, 4), dtype="float32")
        spatial = f.create_dataset("spatial_features", (rows, width, 6), dtype="float32")
        whole = f.create_dataset("whole_image_features", (rows, dim), dtype="float32")
        f.create_dataset("image_ids", data=np.array(ids, dtype=h5py.string_dtype()))
        f.create_dataset("num_boxes", data=np.array(counts, dtype=np.int64))
        sizes = np.zeros((rows, 2), dtype=np.int64)
        for row, image_id in enumerate(ids):
            r, n = store[image_id], counts[row]
            features[row, :n] = r["features"]
            boxes[row, :n] = r["boxes"]
            spatial[row, :n] = spatial_features(r["boxes"], r["image_h"], r["image_w"])
            whole[row] = r["image_feature"]
            sizes[row] = r["image_h"], r["image_w"]
        f.create_dataset("image_h", data=sizes[:, 0])
        f.create_dataset("image_w", data=sizes[:, 1])


def _import_h5(src: Path, feature_dtype: str, ids: Path | None = None) -> tuple[dict[str, Any], Records]:
    """An HDF5 file of padded rows; its image ids in its `image_ids` dataset, or in the file `ids`."""
    import h5py

    try:
        f = h5py.File(src, "r")
    except OSError as exc:
        raise StoreError(f"{src}: not a readable HDF5 file ({exc})") from None
    try:
        image_ids = _h5_layout_and_ids(f, src, ids)
    except StoreError:
        f.close()
        raise
    (_, _, first), records = with_first(_h5_records(f, src, image_ids), src)
    whole = "imported" if "whole_image_features" in f else MEAN_IMAGE_FEATURE
    return imported_meta(first, feature_dtype, f"h5:{src}", whole), records


def _h5_layout_and_ids(f: Any, src: Path, ids: Path | None) -> list[str]:
    """The file's image ids, one a row, after checking that it holds the datasets an import reads."""
    needed = ("image_features", "image_bb") + (() if ids else ("image_ids",))
    missing = [name for name in needed if name not in f]
    if "image_ids" in missing:
        missing[missing.index("image_ids")] = "image_ids (or give --ids FILE: imgid2idx.pkl or a .json of the ids)"
    if "image_h" not in f and "spatial_features" not in f:
        missing.append("image_h (or spatial_features, to recover the image size from)")
    if missing:
        raise StoreError(f"{src}: missing dataset(s) {', '.join(missing)}")
    if f["image_features"].ndim != 3:
        raise StoreError(f"{src}: image_features has shape {f['image_features'].shape}, expected (images, boxes, D) "
                         "(a file of all boxes in one list, indexed by pos_boxes, is not read)")
    if ids is not None:
        return row_ids(ids, len(f["image_features"]))
    image_ids = []
    for row, stored_id in enumerate(f["image_ids"][:]):
        try:
            image_ids.append(stored_id.decode() if isinstance(stored_id, bytes) else str(stored_id))
        except UnicodeDecodeError as exc:
            raise StoreError(f"{src} row {row}: image id {stored_id!r} is not UTF-8 text ({exc.reason})") from None
    return image_ids


def _h5_records(f: Any, src: Path, image_ids: list[str]) -> Records:
    with f:
        counts = f["num_boxes"][:] if "num_boxes" in f else np.full(len(image_ids), f["image_bb"].shape[1])
        for row, image_id in enumerate(image_ids):
            where = f"{src} row {row}"
            try:
                n = int(counts[row])
                boxes = f["image_bb"][row, :n].astype(np.float32)
                features = f["image_features"][row, :n]
                if "image_h" in f:
                    size = f["image_h"][row], f["image_w"][row]
                else:
                    size = _size_from_spatial(src, image_id, boxes, f["spatial_features"][row, :n])
                whole = f["whole_image_features"][row] if "whole_image_features" in f else None
            except StoreError:
                raise
            except (IndexError, KeyError, ValueError, TypeError, OverflowError) as exc:
                raise StoreError(f"{where}: malformed ({exc})") from None
            yield f"row {row}", image_id, imported_record(where, boxes, features, *size, image_feature=whole)


def _size_from_spatial(src: Path, image_id: str, boxes: np.ndarray, spatial: np.ndarray) -> tuple[float, float]:
    """The image size the spatial features were normalised by: box width / (w/W), height / (h/H),
    rounded (NaN or infinite as the file gives them)."""
    usable = (spatial[:, 4] > 0) & (spatial[:, 5] > 0)
    if not usable.any():
        raise StoreError(f"{src}: image {image_id!r} has no image_h/image_w and no box to derive its size from")
    i = int(np.argmax(usable))
    width = (boxes[i, 2] - boxes[i, 0]) / spatial[i, 4]
    height = (boxes[i, 3] - boxes[i, 1]) / spatial[i, 5]
    return np.round(float(height)), np.round(float(width))


FORMATS: dict[str, Format] = {
    "npz": Format("a folder of .npz files", _import_npz, carries=tuple(CONTENTS), export=_export_npz),
    "tsv": Format("a TSV file", _import_tsv, carries=("objects", "attributes", "image_size"), export=_export_tsv,
                  export_notes=_tsv_export_notes),
    "h5": Format("an HDF5 file", _import_h5, carries=("image_feature", "image_size"), export=_export_h5,
                 options=("ids",)),
    "bua-npz": Format("a folder of bottom-up-attention.pytorch's .npz files", bua_npz.read,
                      carries=("objects", "attributes", "image_size")),
    "vlbert-json": Format("a folder or a zip of VL-BERT's per-image .json files", vlbert_json.read,
                          carries=("image_feature", "class_probs", "image_size")),
    "mmf-npy": Format("a folder of MMF's <id>.npy and <id>_info.npy files", mmf.read_npy,
                      carries=("objects", "class_probs", "image_size")),
    "mmf-lmdb": Format("MMF's LMDB (a folder, or its data file)", mmf.read_lmdb,
                       carries=("objects", "class_probs", "image_size")),
    "uniter-lmdb": Format("UNITER's img_db LMDB (a folder, or its data file)", uniter.read, carries=("class_probs",)),
    "vinvl-tsv": Format("VinVL's features.tsv", vinvl.read, carries=("image_size",), options=("labels",)),
}
EXPORT_FORMATS = [name for name, form in FORMATS.items() if form.export is not None]
