"""The FeatureStore schema: meta.json, record fields, and the binary record encoding.

This is the one place that defines what a record holds; the writer, reader, verifier and
interop modules all go through it. A record is a dict of NumPy arrays plus `image_h`, `image_w`
and `box_source`. Encoded, it is self-describing: magic, version, a JSON header naming every
array's dtype, shape and offset, then the raw little-endian bytes.
"""

from __future__ import annotations

import json
import math
import struct
from datetime import datetime, timezone
from typing import Any, Mapping

import numpy as np

from extract.config import SELECTION_FIELDS

SCHEMA_NAME = "vlbert-feature-store"
SCHEMA_VERSION = 1
MAGIC = b"VLFS"
FEATURE_DTYPES = ("float16", "float32")
MAX_KEY_BYTES = 511  # LMDB's compiled-in key size limit

# name: (dtype, shape). "feature" is the store's feature dtype (meta.json); shape letters:
# N boxes, D feature dimension, C classes with background, k top-k classes, K mask variants.
FIELDS: dict[str, tuple[str, tuple[str | int, ...]]] = {
    "boxes": ("float32", ("N", 4)),
    "features": ("feature", ("N", "D")),
    "image_feature": ("feature", ("D",)),
    "objects_id": ("int64", ("N",)),
    "objects_conf": ("float32", ("N",)),
    "attrs_id": ("int64", ("N",)),
    "attrs_conf": ("float32", ("N",)),
    "class_probs": ("feature", ("N", "C")),
    "class_topk_id": ("int32", ("N", "k")),
    "class_topk_prob": ("feature", ("N", "k")),
    "mask_boxes": ("bool", ("K", "N")),
    "masked_features": ("feature", ("K", "N", "D")),
    "masked_image_feature": ("feature", ("K", "D")),
}
REQUIRED_FIELDS = ("boxes", "features", "image_feature")
OBJECT_FIELDS = ("objects_id", "objects_conf")
ATTRIBUTE_FIELDS = ("attrs_id", "attrs_conf")
VARIANT_FIELDS = ("mask_boxes", "masked_features", "masked_image_feature")
SCALAR_FIELDS = ("image_h", "image_w", "box_source")
BOX_SOURCES = ("proposals", "regressed", "given", "imported")

# meta.json entries that may differ between runs writing the same store (see `meta_mismatches`).
VOLATILE_META = ("created", "detector.source", "detector.checkpoint", "images_root", "source")


class StoreError(ValueError):
    """A FeatureStore that cannot be opened, written or decoded; the message says which and why."""


class StoreMismatchError(StoreError):
    """A run whose detector, checkpoint or parameters differ from what the store's meta.json records."""


def encode_key(image_id: str) -> bytes:
    key = image_id.encode("utf-8")
    if not key or len(key) > MAX_KEY_BYTES:
        raise StoreError(f"image id {image_id!r}: {len(key)} bytes, LMDB keys must have 1..{MAX_KEY_BYTES}")
    return key


def build_meta(*, feature_dim: int, feature_dtype: str = "float16", mode: str,
               detector: Mapping[str, Any] | None = None, top_k_classes: int | None = None,
               num_classes: int | None = None, class_names=(), attribute_names=(),
               has_objects: bool = True, has_attributes: bool = True,
               mask_variants: int = 0, mask_prob: float = 0.15, mask_seed: int = 0, images_root: str | None = None,
               source: str | None = None, image_feature_source: str = "detector") -> dict[str, Any]:
    """meta.json for a new store. `detector` holds source, config (a `DetectorConfig.to_dict()`),
    checkpoint and checkpoint_sha256; `num_classes` counts background (the C of class_probs)."""
    if feature_dtype not in FEATURE_DTYPES:
        raise StoreError(f"feature dtype {feature_dtype!r}: expected one of {', '.join(FEATURE_DTYPES)}")
    if top_k_classes is not None and num_classes is not None and top_k_classes >= num_classes:
        top_k_classes = None  # k covering every class is the full distribution
    config = (detector or {}).get("config")
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mode": mode,  # "detect", "given" (boxes from a file) or "imported"
        "detector": dict(detector) if detector else None,
        "selection": {k: config[k] for k in SELECTION_FIELDS} if config and mode == "detect" else None,
        "features": {"dtype": feature_dtype, "dim": int(feature_dim), "image_feature": image_feature_source},
        "class_probs": None if num_classes is None else {"num_classes": int(num_classes), "top_k": top_k_classes},
        "objects": bool(has_objects),  # objects_id/conf in every record
        "attributes": bool(has_attributes),  # attrs_id/conf in every record
        "vocabulary": {"classes": list(class_names), "attributes": list(attribute_names)},
        "mask_variants": {"count": int(mask_variants), "prob": float(mask_prob), "seed": int(mask_seed)},
        "images_root": images_root,
        "source": source,
    }


def check_meta(meta: Mapping[str, Any], where: str) -> None:
    if meta.get("schema") != SCHEMA_NAME:
        raise StoreError(f"{where}: not a FeatureStore meta.json (schema {meta.get('schema')!r})")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise StoreError(f"{where}: schema version {meta.get('schema_version')}, this code reads {SCHEMA_VERSION}")


def meta_mismatches(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two meta.json dicts, ignoring `VOLATILE_META`."""
    a, b = _flatten(recorded), _flatten(wanted)
    return [
        f"{name}: store has {a.get(name, '(absent)')!r}, this run has {b.get(name, '(absent)')!r}"
        for name in sorted(set(a) | set(b))
        if a.get(name) != b.get(name) and not any(name == v or name.startswith(v + ".") for v in VOLATILE_META)
    ]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def expected_shapes(meta: Mapping[str, Any], num_boxes: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The dtype and shape of every field a record of this store must hold."""
    sizes = {
        "N": num_boxes, "D": meta["features"]["dim"], "K": meta["mask_variants"]["count"],
        "C": (meta.get("class_probs") or {}).get("num_classes"), "k": (meta.get("class_probs") or {}).get("top_k"),
    }
    names = list(REQUIRED_FIELDS)
    if meta.get("objects"):
        names += OBJECT_FIELDS
    if meta.get("attributes"):
        names += ATTRIBUTE_FIELDS
    if meta.get("class_probs"):
        names += ["class_probs"] if sizes["k"] is None else ["class_topk_id", "class_topk_prob"]
    if sizes["K"]:
        names += VARIANT_FIELDS
    out = {}
    for name in names:
        dtype, shape = FIELDS[name]
        out[name] = (meta["features"]["dtype"] if dtype == "feature" else dtype,
                     tuple(sizes[s] if isinstance(s, str) else s for s in shape))
    return out


def record_from_regions(regions: Mapping[str, Any], feature_dtype: str, top_k_classes: int | None,
                        masks: np.ndarray | None = None, masked: list[Mapping[str, Any]] | None = None) -> dict:
    """A record from `RegionFeatures.numpy()` output, plus the mask draws and their re-run regions."""
    feature = np.dtype(feature_dtype)
    record = {
        "boxes": regions["boxes"].astype(np.float32),
        "features": regions["features"].astype(feature),
        "image_feature": regions["image_feature"].astype(feature),
        "objects_id": regions["objects_id"].astype(np.int64),
        "objects_conf": regions["objects_conf"].astype(np.float32),
        "image_h": int(regions["image_height"]),
        "image_w": int(regions["image_width"]),
        "box_source": regions["box_source"],
    }
    if regions.get("attrs_id") is not None:
        record["attrs_id"] = regions["attrs_id"].astype(np.int64)
        record["attrs_conf"] = regions["attrs_conf"].astype(np.float32)
    probs = regions["class_probs"]
    if top_k_classes is None or top_k_classes >= probs.shape[1]:
        record["class_probs"] = probs.astype(feature)
    else:
        # Stable sort so equal probabilities keep class order (identical records on every run).
        top = np.argsort(-probs, axis=1, kind="stable")[:, :top_k_classes]
        record["class_topk_id"] = top.astype(np.int32)
        record["class_topk_prob"] = np.take_along_axis(probs, top, axis=1).astype(feature)
    if masks is not None:
        record["mask_boxes"] = np.asarray(masks, dtype=bool).reshape(len(masks), len(record["boxes"]))
        dim = record["features"].shape[1]
        record["masked_features"] = np.stack(
            [m["features"].astype(feature) for m in masked]).reshape(len(masks), len(record["boxes"]), dim)
        record["masked_image_feature"] = np.stack([m["image_feature"].astype(feature) for m in masked])
    return record


def dense_class_probs(record: Mapping[str, Any], num_classes: int) -> np.ndarray:
    """(N, C) class distributions of a record: the stored full ones, or top-k scattered into zeros."""
    if "class_probs" in record:
        return np.asarray(record["class_probs"], dtype=np.float32)
    ids = np.asarray(record["class_topk_id"], dtype=np.int64)
    dense = np.zeros((len(ids), num_classes), dtype=np.float32)
    np.put_along_axis(dense, ids, np.asarray(record["class_topk_prob"], dtype=np.float32), axis=1)
    return dense


def encode_record(record: Mapping[str, Any]) -> bytes:
    """Bytes of a record. Masked-variant rows whose bits equal the unmasked feature row are not
    stored again: `masked_rows` marks the rows that are, so decoding is exact."""
    arrays = {name: np.ascontiguousarray(record[name]) for name in FIELDS if name in record}
    unknown = set(record) - set(FIELDS) - set(SCALAR_FIELDS)
    if unknown:
        raise StoreError(f"record has unknown field(s) {', '.join(sorted(unknown))}")
    if "masked_features" in arrays:
        masked, base = arrays.pop("masked_features"), arrays["features"]
        changed = (masked.view(np.uint8).reshape(*masked.shape[:2], -1)
                   != base.view(np.uint8).reshape(1, base.shape[0], -1)).any(axis=2)
        arrays["masked_rows"] = changed
        arrays["masked_row_features"] = np.ascontiguousarray(masked[changed])
    header: dict[str, Any] = {"version": SCHEMA_VERSION, **{k: record[k] for k in SCALAR_FIELDS}, "arrays": {}}
    offset, chunks = 0, []
    for name, array in arrays.items():
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header["arrays"][name] = [array.dtype.str.lstrip("<>|="), list(array.shape), offset]
        pad = -len(data) % 8  # keeps every array 8-byte aligned
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(len(head) + 8) % 8)
    return MAGIC + struct.pack("<I", len(head)) + head + b"".join(chunks)


def decode_record(data: bytes | bytearray | memoryview, float32: bool = False) -> dict[str, Any]:
    """A record from its bytes; `float32` widens float16 fields. Arrays are writable views of
    `data` when it is a bytearray (which the record then owns), else of a copy."""
    buffer = data if isinstance(data, bytearray) else bytearray(data)
    if buffer[:4] != MAGIC:
        raise StoreError("record does not start with the FeatureStore magic bytes")
    (head_len,) = struct.unpack_from("<I", buffer, 4)
    header = json.loads(buffer[8 : 8 + head_len])
    if header.get("version") != SCHEMA_VERSION:
        raise StoreError(f"record schema version {header.get('version')}, this code reads {SCHEMA_VERSION}")
    start = 8 + head_len
    arrays = {}
    for name, (dtype, shape, offset) in header["arrays"].items():
        dt = np.dtype("<" + dtype) if dtype[0] in "fiu" else np.dtype(dtype)
        arrays[name] = np.frombuffer(buffer, dtype=dt, count=math.prod(shape), offset=start + offset).reshape(shape)
    if "masked_rows" in arrays:
        changed = arrays.pop("masked_rows")
        masked = np.repeat(arrays["features"][None], len(changed), axis=0)
        masked[changed] = arrays.pop("masked_row_features")
        arrays["masked_features"] = masked
    record = {name: arrays[name] for name in FIELDS if name in arrays}
    if float32:
        record = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in record.items()}
    record.update({k: header[k] for k in SCALAR_FIELDS})
    return record
