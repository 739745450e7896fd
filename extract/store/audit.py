"""Summaries and integrity checks of a FeatureStore (`vlbert cache info` and `vlbert cache verify`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from extract.store.layout import FAILURES
from extract.store.reader import FeatureStore
from extract.store.schema import BOX_SOURCES, SCALAR_FIELDS, expected_shapes


def store_info(root: str | Path) -> dict[str, Any]:
    """records, failures, bytes (on disk), per-shard record counts and data bytes, and meta.json."""
    root = Path(root)
    with FeatureStore(root) as store:
        shards = []
        for i, path in enumerate(store.shards):
            env, db = store.shard_env(i)
            with env.begin() as txn:
                stat = txn.stat(db)
            pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
            shards.append({"name": path.name, "records": stat["entries"], "data_bytes": pages * stat["psize"]})
        failures = len(store.failures())
        records = len(store)
    disk = sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())
    return {"path": str(root), "records": records, "failures": failures, "bytes": disk,
            "bytes_per_record": disk / records if records else None, "shards": shards, "meta": store.meta}


def verify_store(root: str | Path) -> list[str]:
    """Everything wrong with the store, one line each; an empty list when all holds."""
    root = Path(root)
    problems: list[str] = []
    with FeatureStore(root) as store:
        problems += [f"image id {k!r} is stored in more than one shard" for k in store.duplicates]
        entries = 0
        for i, path in enumerate(store.shards):
            env, db = store.shard_env(i)
            with env.begin() as txn:
                entries += txn.stat(db)["entries"]
        if entries != len(store) + len(store.duplicates):
            problems.append(f"shards hold {entries} records, the key index {len(store)}")
        for image_id in store:
            try:
                record = store[image_id]
            except Exception as exc:  # noqa: BLE001 - a record that cannot be decoded is what we report
                problems.append(f"{image_id}: does not decode ({type(exc).__name__}: {exc})")
                continue
            problems += [f"{image_id}: {p}" for p in record_problems(record, store.meta)]
    problems += _failure_log_problems(root / FAILURES)
    return problems


def record_problems(record: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    num_boxes = len(record.get("boxes", ()))
    expected = expected_shapes(meta, num_boxes)
    problems = [f"missing field {name}" for name in expected if name not in record]
    problems += [f"unexpected field {name}" for name in record if name not in expected and name not in SCALAR_FIELDS]
    for name, (dtype, shape) in expected.items():
        value = record.get(name)
        if value is None:
            continue
        if value.dtype != np.dtype(dtype) or value.shape != shape:
            problems.append(f"{name}: {value.dtype} {value.shape}, expected {dtype} {shape}")
        elif value.dtype.kind == "f" and not np.isfinite(value).all():
            problems.append(f"{name}: {int((~np.isfinite(value)).sum())} NaN or Inf value(s)")
    if not (isinstance(record.get("image_h"), int) and isinstance(record.get("image_w"), int)
            and record["image_h"] > 0 and record["image_w"] > 0):
        problems.append(f"image size {record.get('image_w')}x{record.get('image_h')}: expected positive integers")
    if record.get("box_source") not in BOX_SOURCES:
        problems.append(f"box_source {record.get('box_source')!r}: expected one of {', '.join(BOX_SOURCES)}")
    masks = record.get("mask_boxes")
    if masks is not None and num_boxes and not masks.any(axis=1).all():
        problems.append("a mask variant masks no box")
    return problems


def _failure_log_problems(path: Path) -> list[str]:
    if not path.exists():
        return []
    problems = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or not {"image", "error"} <= set(entry):
                raise ValueError("expected an object with image and error")
        except ValueError as exc:
            problems.append(f"{path.name} line {number}: {exc}")
    return problems
