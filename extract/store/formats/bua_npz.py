"""bottom-up-attention.pytorch's per-image .npz, as its utils/extract_utils.py `save_roi_features`
writes it (np.savez_compressed, `<image id>.npz`): `x` (N, D) float32 RoI features, `bbox` (N, 4)
float32 boxes (x1, y1, x2, y2) in original-image pixels, `num_bbox` (N), `image_h`, `image_w`, and
`info`, a dict that np.savez pickles in a 0-d object array: image_id, image_h, image_w, num_boxes,
`objects_id` (N,) int64 and `objects_conf` (N,) float32 (the argmax and max over every class column,
the background column 0 of its caffe model included), and from a model with an attribute head
`attrs_id`/`attrs_conf` likewise. `info` loads only through the safe unpickler. No whole-image
feature, no class distributions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from extract.store.formats.common import (
    Records, count, dict_in, files_in, image_id_of, imported_meta, imported_record, npz_arrays, numbers, with_first,
)
from extract.store.schema import StoreError

REQUIRED = {"x": "the RoI features", "bbox": "the boxes", "image_h": "the image height", "image_w": "the image width"}


def read(src: Path, feature_dtype: str) -> tuple[dict[str, Any], Records]:
    files = files_in(src, ".npz", "bua-npz")
    records = ((f"file {path.relative_to(src).as_posix()}", image_id_of(path, src, ".npz"), _record(path))
               for path in files)
    (_, _, first), records = with_first(records, src)
    return imported_meta(first, feature_dtype, f"bua-npz:{src}"), records


def _record(path: Path) -> dict[str, Any]:
    where = str(path)
    arrays = npz_arrays(path, where)
    for name, what in REQUIRED.items():
        if name not in arrays:
            raise StoreError(f"{where}: no {name} array ({what})")
    features = numbers(arrays["x"], "x", where, ("N", "D"))
    if "num_bbox" in arrays and count(arrays["num_bbox"].item(), "num_bbox", where) != len(features):
        raise StoreError(f"{where}: num_bbox is {arrays['num_bbox'].item()}, x holds {len(features)} rows")
    info = dict_in(arrays["info"], "info", where) if "info" in arrays else {}
    optional = {name: numbers(info[name], f"info {name}", where, ("N",))
                for pair in (("objects_id", "objects_conf"), ("attrs_id", "attrs_conf")) if all(n in info for n in pair)
                for name in pair}
    return imported_record(where, numbers(arrays["bbox"], "bbox", where, ("N", 4)), features,
                           arrays["image_h"], arrays["image_w"], **optional)
