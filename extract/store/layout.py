"""Where things live in a FeatureStore directory, and the LMDB settings both sides open shards with."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import lmdb

from extract.store.lmdb_file import DamagedFileError, check_data_file
from extract.store.schema import MAX_KEY_BYTES, StoreError, check_meta
from vlbert.utils.errors import NO_ROOM
from vlbert.utils.locks import is_held
from vlbert.utils.records import read_record

META = "meta.json"
META_LOCK = ".meta.lock"  # held while meta.json is created or updated
FAILURES = "failures.jsonl"
SHARDS = "shards"
RECORDS_DB = b"records"
FAILURES_DB = b"failures"
# Free bytes (or bytes below the file size limit) under which a failed write counts as no room:
# LMDB writes up to 64 pages at once.
_ALMOST_FULL = 1 << 20


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}"


def shard_dirs(root: Path) -> list[Path]:
    """Every shard environment of the store, in name order."""
    shards = root / SHARDS
    return sorted(p for p in shards.glob("shard-*") if p.is_dir() and (p / "data.mdb").is_file())


def writer_lock_path(shard: Path) -> Path:
    return shard.with_name(shard.name + ".writer.lock")


def writer_active(shard: Path) -> bool:
    """Whether a live process holds the shard's writer lock (released by the kernel if it dies)."""
    return is_held(writer_lock_path(shard))


def data_file(shard: Path) -> Path:
    return shard / "data.mdb"


def check_shard(shard: Path) -> None:
    """Refuses a shard whose data file LMDB cannot map safely (truncated, or damaged where LMDB
    would follow it outside the file); see `lmdb_file`."""
    try:
        check_data_file(data_file(shard))
    except DamagedFileError as exc:
        raise StoreError(f"{data_file(shard)}: damaged: {exc}") from None
    except OSError as exc:
        raise StoreError(f"{data_file(shard)}: unreadable ({exc.strerror})") from None


@contextmanager
def lmdb_errors(shard: Path) -> Iterator[None]:
    """LMDB's errors as one-line StoreErrors that name the shard's data file, and a full disk as such."""
    try:
        yield
    except lmdb.Error as exc:
        no_room = _no_room(data_file(shard), exc)
        if no_room is not None:
            raise StoreError(f"{data_file(shard)}: {no_room} (LMDB error: {exc})") from None
        raise StoreError(f"{data_file(shard)}: LMDB error: {exc}") from None


def _no_room(data: Path, exc: lmdb.Error) -> str | None:
    """What ran out, when `exc` is a write that found no room. LMDB reports a write that stopped
    part-way as an I/O error (EIO), which is what a full disk or a file at the process's size limit
    (ulimit -f) gives; the disk's free space and the file's size tell which."""
    code = getattr(exc, "code", 0)
    if code in NO_ROOM:
        return NO_ROOM[code]
    if code != errno.EIO:
        return None
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    size = data.stat().st_size if data.exists() else 0
    if limit != resource.RLIM_INFINITY and size + _ALMOST_FULL > limit:
        return f"the file is too large: it reached the file size limit of this process (ulimit -f), {limit} bytes"
    disk = os.statvfs(data.parent)
    free = disk.f_bavail * disk.f_frsize
    if free < _ALMOST_FULL:
        return f"{NO_ROOM[errno.ENOSPC]}: {free // 1024} KiB free"
    return None


def open_shard(path: Path, *, readonly: bool, lock: bool = True, map_size: int = 1 << 20) -> lmdb.Environment:
    """No readahead: records are read at random, and readahead would pull in neighbours for nothing."""
    with lmdb_errors(path):
        return lmdb.open(str(path), readonly=readonly, lock=lock, readahead=False, meminit=False, max_dbs=2,
                         map_size=map_size, create=not readonly)


# LMDB allows one handle per environment and process, so readers in a process share them. This
# registry holds the only references, so that dropping it after a fork frees every parent handle.
_shared: dict[Path, list] = {}  # path → [environment, records db, users]
_shared_pid = os.getpid()


def acquire_shard(path: Path, lock: bool | None = None) -> tuple[lmdb.Environment, Any]:
    """(read-only environment, records database), shared by this process's readers of the shard.
    `lock`: None uses LMDB's lock table only while a writer is live; a shard without a live writer
    is checked before it is mapped (a live writer checked it when it opened it)."""
    global _shared, _shared_pid
    if _shared_pid != os.getpid():  # forked: the parent's handles must not be used (nor closed) here
        _shared, _shared_pid = {}, os.getpid()
    entry = _shared.get(path)
    if entry is None:
        live = writer_active(path)
        if not live:
            check_shard(path)
        env = open_shard(path, readonly=True, lock=live if lock is None else lock)
        with lmdb_errors(path):
            records = env.open_db(RECORDS_DB, create=False)
        entry = _shared[path] = [env, records, 0]
    entry[2] += 1
    return entry[0], entry[1]


def shared_shard(path: Path) -> tuple[lmdb.Environment, Any]:
    """The handles of a shard this process has acquired (do not keep them: see `_shared`)."""
    env, db, _ = _shared[path]
    return env, db


def release_shard(path: Path) -> None:
    if _shared_pid != os.getpid() or path not in _shared:
        return
    entry = _shared[path]
    entry[2] -= 1
    if entry[2] == 0:
        entry[0].close()
        del _shared[path]


def read_meta(root: Path) -> dict[str, Any]:
    meta = read_record(root / META, f"a FeatureStore's {META}", StoreError)
    if meta is None:
        raise StoreError(f"{root}: not a FeatureStore (no {META})")
    check_meta(meta, str(root / META))
    return meta



def failure_key(image_id: str) -> bytes:
    """Failures are keyed by a digest so that even an id too long for an LMDB key can be recorded."""
    return hashlib.sha1(image_id.encode("utf-8")).hexdigest().encode()


def failures_in(envs: list[lmdb.Environment]) -> list[dict[str, Any]]:
    """The failure entries of these shards whose image has no record in any of them, one per image
    (the latest), sorted by image path."""
    latest: dict[str, dict[str, Any]] = {}
    for env in envs:
        with lmdb_errors(Path(env.path())), env.begin(db=env.open_db(FAILURES_DB, create=False)) as txn:
            for key, value in txn.cursor():
                entry = _failure_entry(Path(env.path()), key, value)
                if entry["id"] not in latest or entry["time"] >= latest[entry["id"]]["time"]:
                    latest[entry["id"]] = entry
    committed = set()
    for env in envs:
        with lmdb_errors(Path(env.path())), env.begin(db=env.open_db(RECORDS_DB, create=False)) as txn:
            committed.update(i for i in latest if len(i.encode()) <= MAX_KEY_BYTES and txn.get(i.encode()) is not None)
    return sorted(({k: e[k] for k in ("image", "id", "error")} for i, e in latest.items() if i not in committed),
                  key=lambda e: e["image"])


def _failure_entry(shard: Path, key: bytes, value: bytes) -> dict[str, Any]:
    try:
        entry = json.loads(value)
        if not (isinstance(entry, dict) and {"image", "id", "error", "time"} <= set(entry)):
            raise ValueError("expected an object with image, id, error and time")
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{data_file(shard)}: failure entry {key.decode(errors='replace')} is damaged ({exc})") from None
    return entry
