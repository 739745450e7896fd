"""The bytes of one FeatureStore record, and the checksum that guards them.

A record (see `schema.FIELDS`) is encoded self-describing: magic, header length (u32), a JSON
header naming every array's dtype, shape and offset and the scalar fields, then the arrays'
little-endian bytes, 8-byte aligned. Since version 2 the last 8 bytes are an XXH3-64 checksum of
everything before them, seeded by the record's key, so that a record is refused both when its
bytes change and when it is read under a damaged key. Since version 3 a feature field may be
stored in an encoding (`schema.FEATURE_ENCODINGS`): its parts are arrays named `field.part` (the
changed masked-variant rows: `masked_row_features.part`), the header's `encoded` maps the field to
the encoding, and decoding gives the encoding's values.
Version 1 records (stores written before checksums) are still read; they are reported as unchecked.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, Collection, Mapping

import numpy as np
import xxhash

from extract.store.schema import (
    FEATURE_ENCODINGS, FIELDS, SCALAR_FIELDS, VARIANT_FIELDS, Encoded, StoreError, encode_key, stored_key,
)

RECORD_VERSION = 3
# Version by magic. Each differs from version 1's, whose records have no checksum, in three bits or more.
MAGICS = {b"VLFS": 1, b"VLF2": 2, b"VLFe": 3}
MAGIC = {version: magic for magic, version in MAGICS.items()}
HEADER_LENGTH = struct.Struct("<I")
CHECKSUM = struct.Struct("<Q")
PREFIX = 4 + HEADER_LENGTH.size
# Stored arrays that are no field's own: `masked_features` is stored as the rows that differ from
# `features` (`masked_rows` marks them, `masked_row_features` holds them).
STORED_FOR = {"masked_rows": "masked_features", "masked_row_features": "masked_features"}


def record_checksum(key: bytes, body: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(body, seed=xxhash.xxh3_64_intdigest(key))


def record_version(data: bytes | bytearray | memoryview) -> int:
    version = MAGICS.get(bytes(data[:4]))
    if version is None:
        raise StoreError("does not start with a FeatureStore record's magic bytes")
    return version


def encode_record(record: Mapping[str, Any], image_id: str) -> bytes:
    """Bytes of the record stored under `image_id`; its fields are arrays or `Encoded` values.
    Masked-variant rows whose stored bits equal the unmasked feature row's are not stored again:
    `masked_rows` marks the rows that are, so decoding is exact."""
    unknown = set(record) - set(FIELDS) - set(SCALAR_FIELDS)
    if unknown:
        raise StoreError(f"record has unknown field(s) {', '.join(sorted(unknown))}")
    fields = {name: record[name] for name in FIELDS if name in record}
    encoded = {name: value.encoding for name, value in fields.items() if isinstance(value, Encoded)}
    parts = {name: _parts(value) for name, value in fields.items()}  # field → part name → array
    if "masked_features" in parts:
        masked, base = parts.pop("masked_features"), parts["features"]
        if encoded.get("masked_features") != encoded.get("features") or _dtypes(masked) != _dtypes(base):
            raise StoreError("masked_features and features must be stored alike")
        changed = np.zeros(masked[next(iter(masked))].shape[:2], dtype=bool)
        for part, values in masked.items():
            changed |= (_row_bytes(values, 2) != _row_bytes(base[part][None], 2)).any(axis=2)
        parts["masked_rows"] = {"": changed}
        parts["masked_row_features"] = {part: np.ascontiguousarray(values[changed]) for part, values in masked.items()}
    header: dict[str, Any] = {"version": RECORD_VERSION, **{k: record[k] for k in SCALAR_FIELDS}, "arrays": {},
                              "encoded": encoded}
    arrays = {f"{name}.{part}" if part else name: array
              for name, field_parts in parts.items() for part, array in field_parts.items()}
    offset, chunks = 0, []
    for name, array in arrays.items():
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header["arrays"][name] = [array.dtype.str.lstrip("<>|="), list(array.shape), offset]
        pad = -len(data) % 8  # keeps every array 8-byte aligned
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(len(head) + PREFIX) % 8)
    body = MAGIC[RECORD_VERSION] + HEADER_LENGTH.pack(len(head)) + head + b"".join(chunks)
    return body + CHECKSUM.pack(record_checksum(encode_key(image_id), body))


def record_header(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """A record's JSON header (every array's dtype, shape and offset; the scalar fields), read
    without its arrays or checksum: StoreError when it does not decode."""
    try:
        record_version(data)
        (head_len,) = HEADER_LENGTH.unpack_from(data, 4)
        header = json.loads(bytes(data[PREFIX : PREFIX + head_len]))
    except (ValueError, struct.error) as exc:
        raise StoreError(f"its header does not decode ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), dict):
        raise StoreError("its header lists no arrays")
    return header


def decode_record(data: bytes | bytearray | memoryview, image_id: str, checksum: bool = True,
                  encoded: bool = False, fields: Collection[str] | None = None, variant: int | None = None,
                  variant_count: int | None = None) -> dict[str, Any]:
    """The record stored under `image_id` from its bytes, after checking its checksum (unless
    `checksum` is False). Arrays are writable views of `data` when it is a bytearray (which the
    record then owns), else copies of the bytes of the arrays decoded (a view of LMDB's map is
    decoded so: a record's arrays are copied out one by one, those skipped never); fields stored in an
    encoding come decoded, or with `encoded` as their `Encoded` parts. With `fields`, only those of
    them that the record holds are decoded (and the scalar fields): a reader skips the arrays it never
    reads, such as the masked variants, whose rebuilding costs most; the checksum still covers every
    byte. With `variant`, the masked-variant fields (`VARIANT_FIELDS`) hold that variant alone (a K axis
    of 1): only its mask row, whole-image feature and rows are decoded (pre-training uses one a sample);
    `variant_count` (meta.json mask_variants.count) is then the number of variants the record must hold.
    Raises StoreError saying what is wrong when the bytes are damaged."""
    owned = isinstance(data, bytearray)
    buffer = data if owned else memoryview(data)
    version = record_version(buffer)
    end = len(buffer)
    if version >= 2:
        end -= CHECKSUM.size
        if end < PREFIX:
            raise StoreError(f"{len(buffer)} bytes, too short for a record")
        if checksum and CHECKSUM.unpack_from(buffer, end)[0] != record_checksum(
                stored_key(image_id), memoryview(buffer)[:end]):
            raise StoreError("checksum mismatch: its bytes changed after it was written")
    try:
        return _decode_body(buffer, end, version, encoded, fields, owned, variant, variant_count)
    except StoreError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError, struct.error) as exc:
        raise StoreError(f"does not decode ({type(exc).__name__}: {exc})") from None


def _decode_body(buffer: bytearray | memoryview, end: int, version: int, keep_encoded: bool,
                 fields: Collection[str] | None, owned: bool, variant: int | None,
                 variant_count: int | None) -> dict[str, Any]:
    (head_len,) = HEADER_LENGTH.unpack_from(buffer, 4)
    if PREFIX + head_len > end:
        raise ValueError(f"header of {head_len} bytes in a record of {end}")
    header = json.loads(bytes(buffer[PREFIX : PREFIX + head_len]))
    if header.get("version") != version:
        raise ValueError(f"header says version {header.get('version')}, the magic bytes {version}")
    start = PREFIX + head_len
    if variant is not None:
        _check_variant(header["arrays"], variant, variant_count)
    # The arrays to read: masked variants are rebuilt from `features`.
    wanted = None if fields is None else {*fields, *(["features"] if "masked_features" in fields else [])}
    arrays = {}
    for name, (dtype, shape, offset) in header["arrays"].items():
        field = name.partition(".")[0]
        if wanted is not None and STORED_FOR.get(field, field) not in wanted:
            continue
        dt = np.dtype("<" + dtype) if dtype[0] in "fiu" else np.dtype(dtype)
        count = math.prod(shape)
        if start + offset + count * dt.itemsize > end:
            raise ValueError(f"array {name} runs past the record")
        array = np.frombuffer(buffer, dtype=dt, count=count, offset=start + offset).reshape(shape)
        if variant is not None and field in VARIANT_FIELDS:
            array = array[variant : variant + 1]
        # The masked rows are read only to rebuild the variants, which copies them where it must.
        arrays[name] = array if owned or field in STORED_FOR else array.copy()
    parts: dict[str, dict[str, np.ndarray]] = {}  # field → part name → array
    for key, array in arrays.items():
        name, _, part = key.partition(".")
        parts.setdefault(name, {})[part] = array
    if "masked_rows" in parts:
        changed = parts.pop("masked_rows")[""]
        rows = parts.pop("masked_row_features")
        if variant is not None:  # the stored rows are the changed ones, variant after variant
            first = int(np.count_nonzero(changed[:variant]))
            changed = changed[variant : variant + 1]
            rows = {part: values[first : first + int(np.count_nonzero(changed))] for part, values in rows.items()}
        parts["masked_features"] = {}
        for part, base in parts["features"].items():
            if changed.all():  # every row differs (BUTD's variants): the stored rows, in order, are the variants
                masked = rows[part].reshape(*changed.shape, *base.shape[1:])
                masked = masked if owned else masked.copy()
            else:
                masked = np.repeat(base[None], len(changed), axis=0)
                masked[changed] = rows[part]
            parts["masked_features"][part] = masked
    encoded = header.get("encoded", {})
    record = {name: _decoded(parts[name], encoded.get(name), keep_encoded) for name in FIELDS
              if name in parts and (fields is None or name in fields)}
    record.update({k: header[k] for k in SCALAR_FIELDS})
    return record


def _check_variant(arrays: Mapping[str, Any], variant: int, variant_count: int | None) -> None:
    held = int(arrays["mask_boxes"][1][0]) if "mask_boxes" in arrays else 0
    if variant_count is not None and held != variant_count:
        raise StoreError(f"it holds {held} masked-pixel variants, the store {variant_count} "
                         "(meta.json mask_variants.count)")
    if not 0 <= variant < held:
        raise StoreError(f"masked-pixel variant {variant} asked for, of the {held} it holds")


def _parts(value: Any) -> dict[str, np.ndarray]:
    """A field's stored arrays by part name; a plain array is the one part named ""."""
    parts = value.parts if isinstance(value, Encoded) else {"": value}
    return {part: np.require(array, requirements="C") for part, array in parts.items()}  # 0-d stays 0-d


def _dtypes(parts: dict[str, np.ndarray]) -> dict[str, np.dtype]:
    return {part: array.dtype for part, array in parts.items()}


def _row_bytes(values: np.ndarray, axes: int) -> np.ndarray:
    """`values` (contiguous) as bytes per row of its first `axes` axes."""
    width = values.dtype.itemsize * math.prod(values.shape[axes:])
    return values.view(np.uint8).reshape(*values.shape[:axes], width)


def _decoded(parts: dict[str, np.ndarray], encoding: str | None, keep_encoded: bool) -> np.ndarray | Encoded:
    if encoding is None:
        return parts[""]
    if encoding not in FEATURE_ENCODINGS or FEATURE_ENCODINGS[encoding].decode is None:
        raise ValueError(f"feature encoding {encoding!r} is unknown to this code "
                         f"(it reads {', '.join(e for e, c in FEATURE_ENCODINGS.items() if c.decode)})")
    return Encoded(encoding, parts) if keep_encoded else FEATURE_ENCODINGS[encoding].decode(parts)


def widened(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its float16 arrays as float32."""
    return {k: v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float16 else v
            for k, v in record.items()}
