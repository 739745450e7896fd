"""Summaries and integrity checks of a FeatureStore (`vlbert cache info` and `vlbert cache verify`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from extract.store.layout import FAILURES, lmdb_errors
from extract.store.reader import FeatureStore
from extract.store.records import decode_record, record_version
from extract.store.schema import StoreError

EXAMPLES = 3  # record ids named in a line that summarises a problem of many records


def store_info(root: str | Path) -> dict[str, Any]:
    """records, failures, bytes (on disk), per-shard record counts and data bytes, damaged shards,
    and meta.json."""
    root = Path(root)
    with FeatureStore(root, skip_damaged_shards=True) as store:
        shards = []
        for i, path in enumerate(store.shards):
            env, db = store.shard_env(i)
            with lmdb_errors(path), env.begin() as txn:
                stat = txn.stat(db)
            pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
            shards.append({"name": path.name, "records": stat["entries"], "data_bytes": pages * stat["psize"]})
        failures = len(store.failures())
        records = len(store)
    disk = sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())
    return {"path": str(root), "records": records, "failures": failures, "bytes": disk,
            "bytes_per_record": disk / records if records else None, "shards": shards,
            "damaged_shards": store.damaged_shards, "meta": store.meta}


@dataclass
class Verification:
    records: int
    unchecked: int  # records written before checksums existed (schema 1): decoded, but not checksummed
    problems: list[str] = field(default_factory=list)  # one line each; empty when all holds


def verify_store(root: str | Path) -> Verification:
    """Checks every shard file, every record's checksum and its agreement with meta.json, and the
    failure log. Each damaged record is named; a disagreement shared by many records (an edited
    meta.json, say) is one line with their count."""
    root = Path(root)
    found: list[tuple[str | None, str]] = []  # (record id, or None for the store, problem)
    unchecked = 0
    with FeatureStore(root, skip_damaged_shards=True) as store:
        found += [(None, damage) for damage in store.damaged_shards]
        found += [(None, f"image id {k!r} is stored in more than one shard") for k in store.duplicates]
        entries = 0
        for i, path in enumerate(store.shards):
            env, db = store.shard_env(i)
            with lmdb_errors(path), env.begin() as txn:
                entries += txn.stat(db)["entries"]
        if entries != len(store) + len(store.duplicates):
            found.append((None, f"shards hold {entries} records, the key index {len(store)}"))
        for image_id in store:
            try:
                raw = store.raw(image_id)
                unchecked += record_version(raw) < 2
                record = decode_record(raw, image_id)
            except StoreError as exc:
                found.append((None, f"{shown(image_id)}: damaged: {exc}"))  # named one by one, never summarised
                continue
            found += [(shown(image_id), p) for p in store.layout.problems(record) + value_problems(record)]
        records = len(store)
    found += [(None, p) for p in _failure_log_problems(root / FAILURES)]
    return Verification(records, unchecked, summarize(found, records))


def shown(image_id: str) -> str:
    """An id as it can be printed: quoted when damage left undecodable bytes in it."""
    return image_id if image_id.isprintable() else repr(image_id)


def value_problems(record: dict[str, Any]) -> list[str]:
    """What is wrong with a record's values (its layout is `RecordLayout.problems`)."""
    problems = [f"{name}: {int((~np.isfinite(value)).sum())} NaN or Inf value(s)" for name, value in record.items()
                if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all()]
    masks = record.get("mask_boxes")
    if isinstance(masks, np.ndarray) and masks.ndim == 2 and masks.shape[1] and not masks.any(axis=1).all():
        problems.append("a mask variant masks no box")
    return problems


def summarize(found: list[tuple[str | None, str]], records: int) -> list[str]:
    """Store-wide problems first, then each record problem: on its own line when one record has
    it, else once with the number of records and a few of their ids."""
    lines = [problem for subject, problem in found if subject is None]
    by_problem: dict[str, list[str]] = {}
    for subject, problem in found:
        if subject is not None:
            by_problem.setdefault(problem, []).append(subject)
    for problem, ids in by_problem.items():
        if len(ids) == 1:
            lines.append(f"{ids[0]}: {problem}")
        else:
            lines.append(f"{len(ids)} of {records} records: {problem} (e.g. {', '.join(ids[:EXAMPLES])})")
    return lines


def _failure_log_problems(path: Path) -> list[str]:
    if not path.exists():
        return []
    problems = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or not {"image", "error"} <= set(entry):
                raise ValueError("expected an object with image and error")
        except ValueError as exc:
            problems.append(f"{path.name} line {number}: {exc}")
    return problems
