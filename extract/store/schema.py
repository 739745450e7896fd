"""The FeatureStore schema: meta.json and the fields of a record.

This is the one place that defines what a store records and what a record holds; the writer,
reader, verifier and interop modules all go through it (`records` encodes a record as bytes).
A record is a dict of NumPy arrays plus `image_h`, `image_w` and `box_source`; the writer puts a
record's feature fields into the store's encoding (`as_stored`), which may be `Encoded` parts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from extract.config import SELECTION_FIELDS
from extract.store import q8
from vlbert.utils.errors import FAILED, USAGE, UserError
from vlbert.utils.kernels import CPU_CAPABILITIES
from vlbert.utils.versions import VERSIONS, environment_versions

SCHEMA_NAME = "vlbert-feature-store"
SCHEMA_VERSION = 3  # 2: records carry checksums; 3: feature fields may be stored encoded (q8)
READABLE_SCHEMA_VERSIONS = (1, 2, 3)
MODES = ("detect", "given", "imported")
MAX_KEY_BYTES = 511  # LMDB's compiled-in key size limit

# name: (dtype, shape). "feature" and "probability" follow the store's feature dtype (meta.json
# features.dtype, a `FEATURE_ENCODINGS` entry); shape letters: N boxes, D feature dimension,
# C classes with background, k top-k classes, K mask variants.
FIELDS: dict[str, tuple[str, tuple[str | int, ...]]] = {
    "boxes": ("float32", ("N", 4)),
    "features": ("feature", ("N", "D")),
    "image_feature": ("feature", ("D",)),
    "objects_id": ("int64", ("N",)),
    "objects_conf": ("float32", ("N",)),
    "attrs_id": ("int64", ("N",)),
    "attrs_conf": ("float32", ("N",)),
    "class_probs": ("probability", ("N", "C")),
    "class_topk_id": ("int32", ("N", "k")),
    "class_topk_prob": ("probability", ("N", "k")),
    "mask_boxes": ("bool", ("K", "N")),
    "masked_features": ("feature", ("K", "N", "D")),
    "masked_image_feature": ("feature", ("K", "D")),
}
REQUIRED_FIELDS = ("boxes", "features", "image_feature")
OBJECT_FIELDS = ("objects_id", "objects_conf")
ATTRIBUTE_FIELDS = ("attrs_id", "attrs_conf")
VARIANT_FIELDS = ("mask_boxes", "masked_features", "masked_image_feature")
CLASS_FIELDS = ("class_probs", "class_topk_id", "class_topk_prob")  # a record holds these in full or as top-k
SCALAR_FIELDS = ("image_h", "image_w", "box_source")
BOX_SOURCES = ("proposals", "regressed", "given", "imported")

# meta.json entries that may differ between runs writing the same store (see `meta_mismatches`).
# cpu_capabilities: the CPU kernel families of the runs that wrote a store; a resume on another CPU
# adds its own (extract/store/writer.py). versions: the environment that created it (vlbert.utils.versions), a
# record: a resume with other versions writes the same records.
VOLATILE_META = ("created", "detector.source", "detector.checkpoint", "images_root", "source", "schema_version",
                 CPU_CAPABILITIES, VERSIONS)


class StoreError(UserError):
    """A FeatureStore that cannot be opened, written or decoded; the message says which and why."""

    exit_status = FAILED


class StoreMismatchError(StoreError):
    """A run whose detector, checkpoint or parameters differ from what the store's meta.json records."""

    exit_status = USAGE


class DamagedRecordError(StoreError):
    """A record whose bytes fail their checksum, do not decode, or disagree with meta.json."""

    def __init__(self, message: str, image_id: str) -> None:
        super().__init__(message)
        self.image_id = image_id

    def __reduce__(self):  # keeps `image_id` when raised in a DataLoader worker
        return type(self), (str(self), self.image_id)


@dataclass(frozen=True, eq=False)
class Encoded:
    """Values as an encoding keeps them (`ENCODED_VALUES`): `parts`, arrays whose leading axes are the
    values' rows (so that masked-variant rows can be compared and kept row by row). Rows are picked
    (`encoded[index]`, an index of leading axes) and joined (`joined`) part by part, without decoding
    them; readers that decode on a device carry the parts there as torch tensors."""

    encoding: str
    parts: Mapping[str, Any]  # part name → NumPy array (or torch tensor)
    width: int | None = None  # the decoded rows' length, where the parts do not give it (sparse rows)

    def decoded(self) -> Any:
        return ENCODED_VALUES[self.encoding](self)

    def with_parts(self, parts: Mapping[str, Any]) -> Encoded:
        return replace(self, parts=parts)

    def __getitem__(self, rows: Any) -> Encoded:
        return self.with_parts({name: part[rows] for name, part in self.parts.items()})


def joined(values: Sequence[np.ndarray | Encoded], axis: int = 0) -> np.ndarray | Encoded:
    """Values concatenated along a row axis (encoded ones part by part, all in one encoding)."""
    if not isinstance(values[0], Encoded):
        return np.concatenate(values, axis)
    return values[0].with_parts({name: np.concatenate([v.parts[name] for v in values], axis)
                                 for name in values[0].parts})


@dataclass(frozen=True)
class FeatureEncoding:
    """How a store keeps its feature fields (FIELDS type "feature"); meta.json features.dtype
    names one. Without `encode` the values are stored as `dtype` arrays; with it, `encode` turns
    values (..., D) into parts and `decode` turns the parts back into `dtype` values, which is
    what readers get (or, asking for the parts, decode on the training device: `decode` takes NumPy
    arrays or torch tensors, and turns parts of zeros, a batch's padding, into zeros). Class
    probabilities are kept as `probability_dtype` arrays."""

    name: str
    summary: str  # for --feature-dtype's help
    dtype: str
    probability_dtype: str
    row_bytes: Callable[[int], int]  # stored bytes of one row of D features
    encode: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None
    decode: Callable[[Mapping[str, np.ndarray]], np.ndarray] | None = None

    def stored(self, values: np.ndarray | Encoded) -> np.ndarray | Encoded:
        if isinstance(values, Encoded):
            if values.encoding == self.name:
                return values
            values = values.decoded()
        return np.asarray(values, self.dtype) if self.encode is None else Encoded(self.name, self.encode(values))


def _plain(dtype: str, summary: str) -> FeatureEncoding:
    return FeatureEncoding(dtype, summary, dtype, dtype, lambda dim: dim * np.dtype(dtype).itemsize)


FEATURE_ENCODINGS = {encoding.name: encoding for encoding in (
    _plain("float16", "2 bytes a value"),
    _plain("float32", "4 bytes a value, the detector's numbers as computed"),
    # Class distributions stay float16: 8-bit codes would move them by a total variation of about
    # 1e-2 (bench/bench_feature_encoding.py), to save 1% of a record at top-10 classes.
    FeatureEncoding("q8", "1 byte a value + 8 a row, read as float32 (per-row square-root codes, cosine >= "
                    "0.9999 to float16 for non-negative features; class probabilities stay float16)",
                    dtype="float32", probability_dtype="float16", row_bytes=q8.row_bytes,
                    encode=q8.encode, decode=q8.decode),
)}


def feature_encoding(name: Any) -> FeatureEncoding:
    if not isinstance(name, str) or name not in FEATURE_ENCODINGS:
        raise StoreError(f"feature dtype {name!r}: expected one of {', '.join(FEATURE_ENCODINGS)}")
    return FEATURE_ENCODINGS[name]


def feature_dtype_help() -> str:
    return "How features are stored: " + "; ".join(f"{e.name}: {e.summary}" for e in FEATURE_ENCODINGS.values())


def as_stored(record: Mapping[str, Any], feature_dtype: str) -> dict[str, Any]:
    """The record with its feature and probability fields as a store of `feature_dtype` keeps
    them (what `FeatureStoreWriter.commit` stores); fields already so are kept as they are."""
    encoding = feature_encoding(feature_dtype)
    keep = {"feature": encoding.stored, "probability": lambda values: np.asarray(values, encoding.probability_dtype)}
    return {k: keep[FIELDS[k][0]](v) if FIELDS.get(k, ("",))[0] in keep else v for k, v in record.items()}


def stored_key(image_id: str) -> bytes:
    """The LMDB key of an id read back from a store. A key that damage made invalid UTF-8 comes
    back as a str with surrogate escapes, so it still names (and finds) its bytes."""
    return image_id.encode("utf-8", "surrogateescape")


def stored_id(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")


def encode_key(image_id: str) -> bytes:
    """The LMDB key for a new record's id (which must be valid UTF-8)."""
    try:
        key = image_id.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreError(f"image id {image_id!r} is not valid UTF-8") from None
    if not key or len(key) > MAX_KEY_BYTES:
        raise StoreError(f"image id {image_id!r}: {len(key)} bytes, LMDB keys must have 1..{MAX_KEY_BYTES}")
    return key


def build_meta(*, feature_dim: int, feature_dtype: str = "float16", mode: str,
               detector: Mapping[str, Any] | None = None, top_k_classes: int | None = None,
               num_classes: int | None = None, class_names=(), attribute_names=(),
               has_objects: bool = True, has_attributes: bool = True,
               mask_variants: int = 0, mask_prob: float = 0.15, mask_seed: int = 0, images_root: str | None = None,
               source: str | None = None, image_feature_source: str = "detector",
               cpu_capabilities: Sequence[str] | None = None) -> dict[str, Any]:
    """meta.json for a new store. `detector` holds source, config (a `DetectorConfig.to_dict()`),
    checkpoint and checkpoint_sha256; `num_classes` counts background (the C of class_probs);
    `cpu_capabilities` the CPU kernel families computing its records (`vlbert.utils.kernels`; None where
    they are unknown, as for imported features)."""
    feature_encoding(feature_dtype)
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
        CPU_CAPABILITIES: None if cpu_capabilities is None else list(cpu_capabilities),
        VERSIONS: [environment_versions()],  # the environments that wrote it, as run.json's (one: creating it)
    }


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# meta.json entries every reader relies on: (dotted key, test, what is expected). An entry under a
# key whose value is null (class_probs of a store without class distributions) is not looked at.
META_ENTRIES = (
    ("mode", lambda v: v in MODES, f"one of {', '.join(MODES)}"),
    ("features", lambda v: isinstance(v, Mapping), "a mapping"),
    ("features.dtype", lambda v: isinstance(v, str) and v in FEATURE_ENCODINGS, f"one of {', '.join(FEATURE_ENCODINGS)}"),
    ("features.dim", lambda v: _is_count(v) and v > 0, "a positive integer"),
    ("class_probs", lambda v: v is None or isinstance(v, Mapping), "null or a mapping"),
    ("class_probs.num_classes", lambda v: _is_count(v) and v > 1, "an integer > 1"),
    ("class_probs.top_k", lambda v: v is None or _is_count(v) and v > 0, "null or a positive integer"),
    ("objects", lambda v: isinstance(v, bool), "true or false"),
    ("attributes", lambda v: isinstance(v, bool), "true or false"),
    ("mask_variants", lambda v: isinstance(v, Mapping), "a mapping"),
    ("mask_variants.count", _is_count, "a non-negative integer"),
)
_ABSENT = object()


def check_meta(meta: Any, where: str) -> None:
    """Refuses a meta.json that is not a FeatureStore's, of a schema version this code cannot
    read, or without an entry that readers rely on; the message names the entry."""
    if not isinstance(meta, Mapping) or meta.get("schema") != SCHEMA_NAME:
        found = meta.get("schema") if isinstance(meta, Mapping) else type(meta).__name__
        raise StoreError(f"{where}: not a FeatureStore meta.json (schema {found!r})")
    if meta.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise StoreError(f"{where}: schema version {meta.get('schema_version')!r}, this code reads "
                         f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}")
    for key, test, expected in META_ENTRIES:
        parent, _, name = key.rpartition(".")
        container = meta.get(parent) if parent else meta
        if container is None:
            continue
        value = container.get(name, _ABSENT)
        if value is _ABSENT:
            raise StoreError(f"{where}: `{key}` is missing (expected {expected})")
        if not test(value):
            raise StoreError(f"{where}: `{key}` is {value!r}, expected {expected}")


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


# What each shape letter counts, for messages: (label, the meta.json entry that sets it).
AXES = {"D": ("features per row", "features.dim"), "K": ("mask variants", "mask_variants.count"),
        "C": ("classes", "class_probs.num_classes"), "k": ("top-k classes", "class_probs.top_k")}


class RecordLayout:
    """The fields, dtypes and shapes that meta.json says every record holds, computed once per
    store so that checking a record costs a few comparisons."""

    def __init__(self, meta: Mapping[str, Any]) -> None:
        class_probs = meta.get("class_probs") or {}
        self.sizes = {"D": meta["features"]["dim"], "K": meta["mask_variants"]["count"],
                      "C": class_probs.get("num_classes"), "k": class_probs.get("top_k")}
        names = list(REQUIRED_FIELDS)
        if meta.get("objects"):
            names += OBJECT_FIELDS
        if meta.get("attributes"):
            names += ATTRIBUTE_FIELDS
        if class_probs:
            names += ["class_probs"] if self.sizes["k"] is None else ["class_topk_id", "class_topk_prob"]
        if self.sizes["K"]:
            names += VARIANT_FIELDS
        encoding = FEATURE_ENCODINGS[meta["features"]["dtype"]]
        dtypes = {"feature": encoding.dtype, "probability": encoding.probability_dtype}
        self.fields = {name: (np.dtype(dtypes.get(FIELDS[name][0], FIELDS[name][0])), FIELDS[name][0] in dtypes,
                              FIELDS[name][1]) for name in names}

    def problems(self, record: Mapping[str, Any], fields: Collection[str] | None = None,
                 one_variant: bool = False) -> list[str]:
        """What in `record` disagrees with meta.json and the schema, one message each; the
        messages do not depend on the record's box count, so a systematic problem reads the same
        in every record. `fields`: the record was read with only these; `one_variant`: with one
        masked variant, of the count that its read checked (`decode_record`)."""
        sizes = {**self.sizes, "K": 1} if one_variant else self.sizes
        problems = [f"missing field {name}" for name in self.fields
                    if name not in record and (fields is None or name in fields)]
        problems += [f"unexpected field {name}" for name in record
                     if name not in self.fields and name not in SCALAR_FIELDS]
        boxes = record.get("boxes")
        num_boxes = len(boxes) if isinstance(boxes, np.ndarray) and boxes.ndim else None
        for name, (dtype, follows_meta, shape) in self.fields.items():
            value = record.get(name)
            if value is None:
                continue
            if value.dtype != dtype:
                source = " (meta.json features.dtype)" if follows_meta else ""
                problems.append(f"{name}: {value.dtype} values, expected {dtype}{source}")
            if value.ndim != len(shape):
                problems.append(f"{name}: {value.ndim} axes, expected {len(shape)}")
                continue
            for axis, (letter, actual) in enumerate(zip(shape, value.shape)):
                if letter == "N":
                    if num_boxes is not None and actual != num_boxes:
                        problems.append(f"{name}: {actual} rows for {num_boxes} boxes")
                elif isinstance(letter, int):
                    if actual != letter:
                        problems.append(f"{name}: axis {axis} has {actual} entries, expected {letter}")
                elif actual != sizes[letter]:
                    label, key = AXES[letter]
                    problems.append(f"{name}: {actual} {label}, expected {sizes[letter]} (meta.json {key})")
        if not all(isinstance(record.get(k), int) and record[k] > 0 for k in ("image_h", "image_w")):
            problems.append(f"image size {record.get('image_w')!r}x{record.get('image_h')!r}: "
                            "expected positive integers")
        if record.get("box_source") not in BOX_SOURCES:
            problems.append(f"box_source {record.get('box_source')!r}: expected one of {', '.join(BOX_SOURCES)}")
        return problems


# What a record keeps of a masked-pixel variant's regions (`record_from_regions`): its features.
MASKED_REGION_ARRAYS = ("features", "image_feature")


def record_from_regions(regions: Mapping[str, Any], top_k_classes: int | None,
                        masks: np.ndarray | None = None, masked: list[Mapping[str, Any]] | None = None) -> dict:
    """A record to write from `RegionFeatures.numpy()` output, plus the mask draws and their re-run
    regions; features as computed (`FeatureStoreWriter.commit` encodes them)."""
    record = {
        "boxes": regions["boxes"].astype(np.float32),
        "features": regions["features"],
        "image_feature": regions["image_feature"],
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
        record["class_probs"] = probs
    else:
        top = top_classes(probs, top_k_classes)
        record["class_topk_id"] = top.astype(np.int32)
        record["class_topk_prob"] = np.take_along_axis(probs, top, axis=1)
    if masks is not None:
        record["mask_boxes"] = np.asarray(masks, dtype=bool).reshape(len(masks), len(record["boxes"]))
        dim = record["features"].shape[1]
        record["masked_features"] = np.stack(
            [m["features"] for m in masked]).reshape(len(masks), len(record["boxes"]), dim)
        record["masked_image_feature"] = np.stack([m["image_feature"] for m in masked])
    return record


def top_classes(probs: np.ndarray, k: int) -> np.ndarray:
    """(N, k) each row's k most probable classes, most probable first, equal probabilities in class
    order (identical records on every run): `np.argsort(-probs, kind="stable")[:, :k]` without sorting
    whole rows (1601 classes). A partition finds each row's k largest; a row whose k-th largest value
    is tied beyond them is sorted whole."""
    top = np.argpartition(-probs, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(probs, top, axis=1)
    # Largest first, then class order: lexsort's last key is the primary one.
    top = np.take_along_axis(top, np.lexsort((top, -values), axis=1), axis=1)
    tied = (probs >= values.min(axis=1, keepdims=True)).sum(axis=1) > k
    if tied.any():
        top[tied] = np.argsort(-probs[tied], axis=1, kind="stable")[:, :k]
    return top


def dense_class_probs(record: Mapping[str, Any], num_classes: int) -> np.ndarray:
    """(N, C) class distributions of a record: the stored full ones, or top-k scattered into zeros."""
    if "class_probs" in record:
        return np.asarray(record["class_probs"], dtype=np.float32)
    return scattered(np.asarray(record["class_topk_id"], dtype=np.int64), np.asarray(record["class_topk_prob"]),
                     num_classes)


def scattered(ids: Any, values: Any, width: int) -> Any:
    """(..., width) float32 zeros with `values` (..., k) widened to float32 at the columns `ids`: NumPy
    arrays, or torch tensors scattered where they are (training's device). A row that names a column
    twice must carry one value there (`sparse_class_probs`) for the device to give NumPy's bits."""
    if isinstance(ids, np.ndarray):
        dense = np.zeros((*ids.shape[:-1], width), np.float32)
        np.put_along_axis(dense, ids, values.astype(np.float32), axis=-1)
        return dense
    values = values.float()
    return values.new_zeros((*ids.shape[:-1], width)).scatter_(-1, ids.long(), values)


def sparse_class_probs(record: Mapping[str, Any], num_classes: int) -> Encoded:
    """A top-k record's class distributions as `Encoded` parts (`ids`, `probs` as stored), which decode to
    `dense_class_probs`'s bits: an id named twice in a row carries the value that NumPy's scatter leaves,
    its last; ids outside the C classes are refused (ValueError)."""
    ids, probs = record["class_topk_id"], record["class_topk_prob"]
    if ids.size and (ids.min() < 0 or ids.max() >= num_classes):
        raise ValueError(f"class_topk_id holds {ids.min() if ids.min() < 0 else ids.max()}, "
                         f"outside the {num_classes} classes (meta.json class_probs.num_classes)")
    ordered = np.sort(ids, axis=1)
    rows = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))  # rows naming an id twice
    if rows.size:  # there, each entry takes the value of its id's last entry in the row
        named, probs = ids[rows], probs.copy()
        last = ids.shape[1] - 1 - np.argmax((named[:, :, None] == named[:, None, :])[:, :, ::-1], axis=2)
        probs[rows] = np.take_along_axis(probs[rows], last, axis=1)
    return Encoded(TOP_CLASSES, {"ids": ids, "probs": probs}, width=num_classes)


TOP_CLASSES = "class_topk"
# How an `Encoded` decodes, by encoding: a store's features (`FEATURE_ENCODINGS`), and the top-k class
# distributions that pre-training carries to its device as they are stored (`sparse_class_probs`).
ENCODED_VALUES: dict[str, Callable[[Encoded], Any]] = {
    **{name: (lambda value, decode=encoding.decode: decode(value.parts))
       for name, encoding in FEATURE_ENCODINGS.items() if encoding.decode is not None},
    TOP_CLASSES: lambda value: scattered(value.parts["ids"], value.parts["probs"], value.width),
}
