"""VL-BERT's precomputed boxes and features (`vgbua_res101_precomputed`, what its datasets read with
`with_precomputed_visual_feat`): one JSON object per image, `<image id>.json`, in a folder or in a
zip (`NAME.zip` with members `NAME/<id>.json`, VL-BERT's zip mode). As its writer (the
tools/generate_tsv_v2.py of VL-BERT's bottom-up-attention fork) lays it out: `image_id`, `image_h`,
`image_w`, `num_boxes`, and the base64 of float32 arrays: `boxes` (N, 4) in original-image pixels,
`features` (N, D), `classes` (N, C) class probabilities (C = 1601 for Visual Genome, background
first) and `attrs` (N, A) attribute probabilities; some add `image_box_feature` (D,), the whole-image
box's feature, which VL-BERT's VQA dataset reads where it is present (and the mean of the box
features where not). `classes` become the store's class distributions, columns as written; a store
keeps no attribute distributions, so `attrs` is not imported."""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterator

from extract.store.formats.common import (
    MEAN_IMAGE_FEATURE, Records, b64_array, count, files_in, image_id_of, imported_meta, imported_record, with_first,
)
from extract.store.schema import StoreError

WHOLE_IMAGE = "image_box_feature"


def read(src: Path, feature_dtype: str) -> tuple[dict[str, Any], Records]:
    objects = _zip_members(src) if zipfile.is_zipfile(src) else _folder_files(src)
    parsed = ((where, image_id, *_record(text, f"{src} {where}")) for where, image_id, text in objects)
    (first_where, _, first, whole), parsed = with_first(parsed, src)

    def records() -> Records:
        for where, image_id, record, has_whole in parsed:
            if has_whole != whole:
                raise StoreError(f"{src} {where}: {'no' if whole else 'an'} {WHOLE_IMAGE}, unlike {first_where}: "
                                 "a store's records all hold a whole-image feature or none does")
            yield where, image_id, record

    meta = imported_meta(first, feature_dtype, f"vlbert-json:{src}", "imported" if whole else MEAN_IMAGE_FEATURE)
    return meta, records()


def _folder_files(src: Path) -> Iterator[tuple[str, str, bytes]]:
    for path in files_in(src, ".json", "vlbert-json"):
        yield f"file {path.relative_to(src).as_posix()}", image_id_of(path, src, ".json"), path.read_bytes()


def _zip_members(src: Path) -> Iterator[tuple[str, str, bytes]]:
    """The zip's .json members; an id drops the folder named after the zip (`NAME.zip@/NAME/<id>.json`)."""
    folder = f"{src.stem}/"
    try:
        with zipfile.ZipFile(src) as archive:
            for name in sorted(n for n in archive.namelist() if n.endswith(".json")):
                yield f"member {name}", name.removeprefix(folder).removesuffix(".json"), archive.read(name)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as exc:
        raise StoreError(f"{src}: not a readable zip archive ({exc})") from None


def _record(text: bytes, where: str) -> tuple[dict[str, Any], bool]:
    """The record, and whether the file gave its whole-image feature."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StoreError(f"{where}: holds a JSON {type(data).__name__}, expected an object")
    for name in ("num_boxes", "boxes", "features", "image_h", "image_w"):
        if name not in data:
            raise StoreError(f"{where}: no {name}")
    rows = count(data["num_boxes"], "num_boxes", where)
    features = b64_array(data["features"], "float32", rows, "features", where)
    whole, classes = data.get(WHOLE_IMAGE), data.get("classes")
    if whole is not None:
        whole = b64_array(whole, "float32", 1, WHOLE_IMAGE, where, features.shape[1])[0]
    record = imported_record(
        where, b64_array(data["boxes"], "float32", rows, "boxes", where, columns=4), features,
        data["image_h"], data["image_w"], image_feature=whole,
        class_probs=None if classes is None else b64_array(classes, "float32", rows, "classes", where))
    return record, whole is not None
