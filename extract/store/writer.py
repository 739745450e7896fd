"""Writing one shard of a FeatureStore: atomic batch commits, a map that grows, failures kept current,
and a commit thread that takes the writes off the caller's critical path."""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import lmdb

from extract.store.layout import (
    FAILURES, FAILURES_DB, META, META_LOCK, RECORDS_DB, SHARDS, acquire_shard, check_shard, failure_key, failures_in,
    lmdb_errors, open_shard, read_meta, release_shard, shard_dirs, shard_name, writer_lock_path,
)
from extract.store.records import encode_record
from extract.store.schema import (
    SCHEMA_VERSION,
    StoreError,
    StoreMismatchError,
    as_stored,
    encode_key,
    meta_mismatches,
)
from vlbert.utils.atomic import made_folder, remove, temporaries, write_atomically
from vlbert.utils.kernels import CPU_CAPABILITIES, with_capabilities
from vlbert.utils.locks import holding, lock_holder, take_lock
from vlbert.utils.paths import checked

DEFAULT_MAP_SIZE = 1 << 30  # grows by doubling when full; LMDB only reserves address space
# meta.json entries that stores written before the entry existed lack: (path, the value they had).
# Entries newer code records that older stores lack, with the value the older code used by default:
# resuming such a store with that value is no mismatch (the precision, res5 layout, JPEG decoding and
# speed path options; ResNeXt groups in the detector config).
ENTRIES_ADDED_LATER = ((("detector", "precision"), "fp32"), (("detector", "res5_layout"), "dilated"),
                       (("detector", "config", "num_groups"), 1), (("detector", "jpeg_decoding"), "workers"),
                       (("detector", "speed_paths"), []))


def ensure_meta(root: Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    """Creates meta.json, or checks that the existing one records the same run parameters.

    Under the store's meta lock, so that of concurrent shard writers exactly one creates it (whole:
    none sees a partial meta.json), and temporaries that killed writers left are swept. A store of
    an older schema version takes this version's records from now on, so its meta.json says this
    version; a run on a CPU of another kernel family adds it to `cpu_capabilities` (a store from
    before that record gets none: its earlier records' families are unknown).
    """
    made_folder(root)
    path = root / META
    with holding(root / META_LOCK):
        remove([tmp for tmp in temporaries(root) if tmp.name.startswith(f".{META}.")])
        if not path.exists():
            write_atomically(path, json.dumps(meta, indent=2) + "\n")
        recorded, assumed = _with_entries_added_later(read_meta(root), meta)
        problems = [problem + (" (the store is older than this entry: taken to have had it so)"
                               if problem.partition(":")[0] in assumed else "")
                    for problem in meta_mismatches(recorded, meta)]
        if problems:
            raise StoreMismatchError(
                f"{root} was written with other settings; refusing to mix records "
                f"(use a new --out, or the original settings):\n  " + "\n  ".join(problems))
        capabilities = with_capabilities(recorded.get(CPU_CAPABILITIES), meta.get(CPU_CAPABILITIES) or ())
        if recorded["schema_version"] != SCHEMA_VERSION or capabilities != recorded.get(CPU_CAPABILITIES):
            recorded["schema_version"] = SCHEMA_VERSION
            if capabilities is not None:
                recorded[CPU_CAPABILITIES] = capabilities
            write_atomically(path, json.dumps(recorded, indent=2) + "\n")
    return recorded


def _with_entries_added_later(recorded: dict[str, Any], wanted: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """`recorded`, with each entry of ENTRIES_ADDED_LATER that it lacks and `wanted` has set to the
    value the older store had, so that resuming it with that value is no mismatch; and the names
    (`detector.precision`) of the entries so set."""
    assumed = set()
    for path, value in ENTRIES_ADDED_LATER:
        *parents, name = path
        have, want = recorded, wanted
        for key in parents:
            have, want = have.get(key), want.get(key)
            if not isinstance(have, dict) or not isinstance(want, Mapping):
                break
        else:
            if name not in have and name in want:
                have[name] = value
                assumed.add(".".join(path))
    return recorded, assumed


class FeatureStoreWriter:
    """Writes one shard (its own LMDB environment under shards/); one live writer per shard."""

    def __init__(self, root: str | Path, meta: Mapping[str, Any], shard: tuple[int, int] = (0, 1),
                 initial_map_size: int = DEFAULT_MAP_SIZE) -> None:
        self.root = Path(root)
        self.meta = ensure_meta(self.root, meta)
        self.path = checked(made_folder(self.root / SHARDS) / shard_name(*shard))
        self._lock = take_lock(writer_lock_path(self.path))
        if self._lock is None:
            raise StoreError(f"{self.path}: another process is writing this shard "
                             f"({lock_holder(writer_lock_path(self.path))})")
        remove([path for path in temporaries(self.root / SHARDS) if path.name.startswith(f".{self.path.name}.")])
        if self.path.exists():
            check_shard(self.path)
        else:
            _create_shard(self.path)
        self.env = open_shard(self.path, readonly=False, map_size=initial_map_size)
        self._records = self._growing(lambda: self.env.open_db(RECORDS_DB))
        self._failures = self._growing(lambda: self.env.open_db(FAILURES_DB))

    def commit(self, records: Mapping[str, Mapping[str, Any]], failures: Mapping[str, tuple[str, str]] = {}) -> int:
        """Stores `records` (image id → record) and `failures` (image id → (image path, error)) in
        one transaction: after a crash either all of them are there or none. A record replaces a
        failure of the same image. Returns the bytes of the encoded records.

        Records may hold their features as computed (float32): they are encoded here into the
        store's feature dtype (`as_stored`; a record already in it is kept as it is), so that with
        a CommitThread the encoding runs off the caller's critical path."""
        dtype = self.meta["features"]["dtype"]
        encoded = [(encode_key(image_id), encode_record(as_stored(record, dtype), image_id))
                   for image_id, record in records.items()]
        now = time.time()
        failed = [
            (failure_key(image_id), json.dumps({"image": image, "id": image_id, "error": error, "time": now}).encode())
            for image_id, (image, error) in failures.items()
        ]
        resolved = [failure_key(image_id) for image_id in records]
        cleared = self._growing(lambda: self._put(encoded, failed, resolved))
        if failed or cleared:
            self.render_failures()
        return sum(len(value) for _, value in encoded)

    def _growing(self, write):
        """Runs a write transaction, doubling the map size whenever it is full (the aborted
        transaction left nothing behind, so it is simply run again)."""
        with lmdb_errors(self.path):
            while True:
                try:
                    return write()
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def _put(self, encoded, failed, resolved) -> bool:
        """Returns whether a failure entry was cleared."""
        with self.env.begin(write=True) as txn:
            for key, value in encoded:
                txn.put(key, value, db=self._records)
            cleared = sum(txn.delete(key, db=self._failures) for key in resolved)
            for key, value in failed:
                txn.put(key, value, db=self._failures)
        return cleared > 0

    def render_failures(self) -> None:
        """Rewrites failures.jsonl from every shard's failure entries whose image has no record.

        Under an exclusive lock, so concurrent shard writers cannot overwrite a newer rendering
        with an older one.
        """
        with holding(self.root / SHARDS / ".failures.lock"):
            remove([path for path in temporaries(self.root) if path.name.startswith(f".{FAILURES}.")])
            others: list[Path] = []
            try:
                envs = [self.env]
                for path in shard_dirs(self.root):
                    if path != self.path:
                        envs.append(acquire_shard(path, lock=True)[0])
                        others.append(path)
                entries = failures_in(envs)
            finally:
                for path in others:
                    release_shard(path)
            write_atomically(self.root / FAILURES, "".join(json.dumps(e) + "\n" for e in entries))

    def close(self) -> None:
        self.render_failures()
        self.env.close()
        self._lock.close()

    def __enter__(self) -> "FeatureStoreWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CommitThread:
    """Commits batches on a thread of its own, so that the caller computes the next batch while
    this one's transaction is written.

    Each batch still commits in one transaction, in the order submitted. At most `depth` batches
    wait; `submit` blocks beyond that, so memory stays bounded. `committed(records, failures,
    bytes)` runs on the thread after each commit. A commit that fails ends the commits: the error
    is raised in the submitting thread by the next `submit` or when the context closes, never
    lost; batches still waiting are dropped, as a killed process would lose them, and a rerun
    computes them again.
    """

    def __init__(self, writer: FeatureStoreWriter, committed: Callable[[Mapping, Mapping, int], None],
                 depth: int = 1) -> None:
        self.writer, self.committed = writer, committed
        self._waiting: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="feature-store-commits", daemon=True)
        self._thread.start()

    def submit(self, records: Mapping[str, Mapping[str, Any]], failures: Mapping[str, tuple[str, str]]) -> None:
        """Queues one batch (the arguments of `FeatureStoreWriter.commit`)."""
        if self._error is not None:
            raise self._error
        self._waiting.put((records, failures))

    def _run(self) -> None:
        while (batch := self._waiting.get()) is not None:
            if self._error is None:  # after a failure the queue is drained so that `submit` never blocks
                try:
                    self.committed(*batch, self.writer.commit(*batch))
                except BaseException as exc:  # noqa: BLE001 - handed to the submitting thread
                    self._error = exc

    def __enter__(self) -> "CommitThread":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        """Waits for the batches already submitted (they are complete, even when the caller
        stops on an error), then raises a commit's failure."""
        self._waiting.put(None)
        self._thread.join()
        if self._error is not None and self._error is not exc:
            raise self._error


def _create_shard(path: Path) -> None:
    """Creates the environment and its databases elsewhere and renames it into place, so readers
    never meet a shard without its databases."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        env = open_shard(tmp, readonly=False)
        with lmdb_errors(tmp):
            env.open_db(RECORDS_DB)
            env.open_db(FAILURES_DB)
            env.close()
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
