"""Reading a FeatureStore: every shard as one store, random access by image id, iteration.

Environments are opened lazily in each process (a DataLoader worker forked after the index was
built opens its own), read-only, without readahead, and without LMDB's lock table unless a
writer is live on that shard (a lock-free reader could see pages a live writer is reusing).
A shard's data file is checked before it is mapped (`lmdb_file`), and every record's checksum
when it is read: damage is an error naming the file or the record, never a crash or a silently
altered value. The key index is one sorted NumPy array, so forked workers share it without
copy-on-read.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Collection, Iterator

import lmdb
import numpy as np

from extract.store.layout import (
    acquire_shard, data_file, failures_in, lmdb_errors, read_meta, release_shard, shard_dirs, shared_shard,
)
from extract.store.records import decode_record, record_header, widened
from extract.store.schema import DamagedRecordError, RecordLayout, StoreError, stored_id, stored_key


AGREEMENT_TRIES = 100  # records of a shard `check_agreement` reads at most, looking for an intact one
_NOT_FOUND = object()  # a key the index lists and LMDB does not find


class FeatureStore:
    """`store[image_id]` → record dict; `float32` widens float16 fields, `as_torch` gives tensors.
    Fields stored in an encoding come decoded (q8 features as float32, see `schema.FEATURE_ENCODINGS`),
    or with `encoded` as their `schema.Encoded` parts, which training decodes on its device.

    A record that fails its checksum or does not decode raises DamagedRecordError; `checksums=False`
    skips the checksum (only to measure what it costs). `check_layout` also refuses a record that
    disagrees with meta.json, for some microseconds per read (export reads so; training relies on
    `check_agreement`, one record per shard, which finds an edited meta.json). `lock`: None picks
    per shard (locked while a writer is live), True/False forces it. A damaged shard file raises
    StoreError when the store is opened, unless `skip_damaged_shards`, which leaves it out and
    lists it in `damaged_shards`. The key index is built when the store is opened; `refresh()`
    picks up records committed since.
    """

    def __init__(self, root: str | Path, *, float32: bool = False, as_torch: bool = False,
                 lock: bool | None = None, checksums: bool = True, check_layout: bool = False,
                 skip_damaged_shards: bool = False, encoded: bool = False) -> None:
        if encoded and check_layout:
            raise ValueError("check_layout compares decoded fields with meta.json: it reads without encoded")
        self.root = Path(root)
        self.meta = read_meta(self.root)
        self.layout = RecordLayout(self.meta)
        self.float32 = float32
        self.as_torch = as_torch
        self.lock = lock
        self.checksums = checksums
        self.check_layout = check_layout
        self.skip_damaged_shards = skip_damaged_shards
        self.encoded = encoded
        self._acquired: set[Path] = set()  # shards this store holds in the process-wide registry
        self._pid = os.getpid()
        self.refresh()

    def refresh(self) -> None:
        """Rebuilds the key index from every shard (and closes this process's environments)."""
        self.close()
        self.shards, self.damaged_shards = [], []
        keys, owners = [], []
        for path in shard_dirs(self.root):
            self.shards.append(path)
            try:
                shard_keys = self._read(len(self.shards) - 1,
                                        lambda txn: [bytes(k) for k in txn.cursor().iternext(keys=True, values=False)])
            except StoreError as exc:
                if not self.skip_damaged_shards:
                    raise
                self.shards.pop()
                self.damaged_shards.append(str(exc))
                continue
            keys += shard_keys
            owners += [len(self.shards) - 1] * len(shard_keys)
        self.close()  # workers forked from here open their own environments
        key_array = np.array(keys, dtype=bytes) if keys else np.zeros(0, dtype="S1")
        order = np.argsort(key_array, kind="stable")  # stable: the first shard (by name) wins a duplicate
        self._keys, self._owners = key_array[order], np.asarray(owners, dtype=np.int32)[order]
        duplicate = self._keys[1:] == self._keys[:-1]
        self.duplicates = [stored_id(k) for k in np.unique(self._keys[1:][duplicate])]
        if self.duplicates:
            warnings.warn(f"{self.root}: {len(self.duplicates)} image id(s) stored in more than one shard "
                          f"(e.g. {self.duplicates[0]!r}); reading the first shard's record", stacklevel=2)
            keep = np.concatenate(([True], ~duplicate))
            self._keys, self._owners = self._keys[keep], self._owners[keep]

    def shard_env(self, shard: int) -> tuple[lmdb.Environment, Any]:
        """(environment, records database) of shard `shard`, opened in this process on first use."""
        if self._pid != os.getpid():  # forked: the parent's handles are not ours to use or release
            self._acquired, self._pid = set(), os.getpid()
        path = self.shards[shard]
        if path not in self._acquired:
            acquire_shard(path, self.lock)
            self._acquired.add(path)
        return shared_shard(path)

    def _position(self, image_id: str) -> int:
        key = stored_key(image_id)
        i = int(np.searchsorted(self._keys, key))
        if i == len(self._keys) or self._keys[i] != key:
            raise KeyError(image_id)
        return i

    def _read(self, shard: int, read: Callable[[lmdb.Transaction], Any]) -> Any:
        """`read(txn)` in a read transaction whose buffers are views of the map, valid only inside it."""
        env, db = self.shard_env(shard)
        with lmdb_errors(self.shards[shard]):
            while True:
                try:
                    with env.begin(db=db, buffers=True) as txn:
                        return read(txn)
                except lmdb.MapResizedError:  # a live writer grew the map beyond ours: adopt its size
                    env.set_mapsize(0)

    def raw(self, image_id: str) -> bytearray:
        """The encoded record (copied out of the map once, so it outlives the transaction)."""
        return self._in_map(image_id, bytearray)

    def _in_map(self, image_id: str, use: Callable[[memoryview], Any]) -> Any:
        """`use(the record's bytes)`, called in the read transaction, where they are a view of the map
        (what it returns must not keep that view)."""
        i = self._position(image_id)

        def used(txn: lmdb.Transaction) -> Any:
            value = txn.get(self._keys[i])
            return _NOT_FOUND if value is None else use(value)

        result = self._read(int(self._owners[i]), used)
        if result is _NOT_FOUND:
            raise StoreError(f"listed in {data_file(self.shards[self._owners[i]])} but not found by key lookup "
                             "(a damaged key or page)")
        return result

    def box_count(self, image_id: str) -> int:
        """The record's number of boxes, from its header alone: no array is read or checksummed (a
        pass over a corpus's records touches a page of each). DamagedRecordError when it does not decode."""
        i = self._position(image_id)
        try:
            header = self._read(int(self._owners[i]), lambda txn: record_header(txn.get(self._keys[i]) or b""))
            return int(header["arrays"]["boxes"][1][0])
        except (StoreError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise DamagedRecordError(f"{self.root}: record {image_id!r} is damaged: {exc}", image_id) from None

    def __getitem__(self, image_id: str) -> dict[str, Any]:
        record = self.decoded(image_id, self.float32)
        if self.as_torch:
            import torch

            record = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in record.items()}
        return record

    def decoded(self, image_id: str, float32: bool = False, fields: Collection[str] | None = None,
                variant: int | None = None) -> dict[str, Any]:
        """The record as NumPy arrays (float32: float16 ones widened), after checking its checksum
        and, with `check_layout`, that it holds what meta.json says; DamagedRecordError otherwise.
        With `fields`, only those (and the scalar fields) are decoded; with `variant`, that masked
        variant alone, of a record that must hold meta.json's count of them (`decode_record`)."""
        record = self._checksummed(image_id, self.encoded, fields, variant)
        problems = self.layout.problems(record, fields, one_variant=variant is not None) if self.check_layout else []
        if problems:
            raise DamagedRecordError(f"{self.root}: record {image_id!r} disagrees with meta.json: {problems[0]}",
                                     image_id)
        return widened(record) if float32 else record

    def _checksummed(self, image_id: str, encoded: bool = False, fields: Collection[str] | None = None,
                     variant: int | None = None) -> dict[str, Any]:
        count = None if variant is None else self.layout.sizes["K"]
        try:
            # Decoded in the map: only the arrays asked for are copied out of it.
            return self._in_map(image_id, lambda data: decode_record(data, image_id, checksum=self.checksums,
                                                                     encoded=encoded, fields=fields, variant=variant,
                                                                     variant_count=count))
        except StoreError as exc:
            raise DamagedRecordError(f"{self.root}: record {image_id!r} is damaged: {exc}", image_id) from None

    def get(self, image_id: str, default: Any = None) -> dict[str, Any] | Any:
        return self[image_id] if image_id in self else default

    def __contains__(self, image_id: object) -> bool:
        if not isinstance(image_id, str):
            return False
        try:
            self._position(image_id)
        except KeyError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[str]:
        return [stored_id(k) for k in self._keys]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for image_id in self:
            yield image_id, self[image_id]

    def check_agreement(self) -> None:
        """Refuses a store whose records disagree with its meta.json (an edited meta.json, or
        records from elsewhere): checks the first intact record of every shard, which is enough for
        a problem that concerns the whole store (damaged records are their readers' concern);
        `vlbert cache verify` checks every record."""
        for shard in np.unique(self._owners):
            for position in np.flatnonzero(self._owners == shard)[:AGREEMENT_TRIES]:
                image_id = stored_id(self._keys[position])
                try:
                    problems = self.layout.problems(self._checksummed(image_id))
                except DamagedRecordError:
                    continue
                if problems:
                    raise StoreError(f"{self.root}: the records disagree with meta.json ({problems[0]}, e.g. record "
                                     f"{image_id!r}); `vlbert cache verify {self.root}` lists every problem")
                break

    def failures(self) -> list[dict[str, Any]]:
        """Images that could not be processed and have no record: `image`, `id`, `error`."""
        return failures_in([self.shard_env(i)[0] for i in range(len(self.shards))])

    def close(self) -> None:
        if self._pid == os.getpid():
            for path in self._acquired:
                release_shard(path)
        self._acquired = set()

    def __enter__(self) -> "FeatureStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (spawned DataLoader workers) without open environments."""
        return {**self.__dict__, "_acquired": set()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

