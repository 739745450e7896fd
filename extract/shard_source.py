"""The extraction job's images from tar shards (`extract.shards`): work items carrying each image's
bytes, read shard after shard in one pass; the failures a shard's damage makes; and the store's
ledger of the tar shards whose every sample is committed, which a rerun skips without reading.

Every tar shard is one unit of work: `--shard i/n` takes every n-th of the sorted shards, so an array
task reads whole shards. A tar shard is recorded in the ledger (`tar-shards/<writer shard>.jsonl` in
the store, one line a shard, with its size and modification time) once each of its samples is
committed as a record or a failure; a shard whose file has changed since is read again (its stored
images skipped, as every rerun skips them).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from extract.images import EncodedImage
from extract.loader import WorkItem
from extract.shards import IMAGE_MEMBER_EXTENSIONS, ShardSample, find_shards, read_shard, shard_id
from extract.store.layout import shard_name
from vlbert.utils.atomic import made_folder, write_atomically

LEDGER = "tar-shards"  # the folder of the ledgers in the store, one file per writer shard


def read_ledgers(out: Path) -> dict[str, dict]:
    """Every writer shard's ledger entries, by tar shard id."""
    entries = {}
    for ledger in sorted((Path(out) / LEDGER).glob("*.jsonl")):
        entries.update(read_ledger(ledger))
    return entries


def read_ledger(ledger: Path) -> dict[str, dict]:
    """One ledger's entries by tar shard id (none when it does not exist). A line a killed writer
    left half is left out: its shard is read again."""
    entries = {}
    lines = ledger.read_text(encoding="utf-8").splitlines() if ledger.exists() else []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        entries[entry["shard"]] = entry
    return entries


def file_state(path: Path) -> dict[str, int]:
    info = path.stat()
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}


@dataclass
class ShardSource:
    """The job's tar shards (`images`: a shard, a folder of them or a pattern) for writer shard
    `shard` of the store `out`: every `shard[1]`-th tar shard from the `shard[0]`-th."""

    images: str | Path
    out: Path
    shard: tuple[int, int]
    listed: set[str] | None = None  # the only ids to extract (an image list), None: every image
    root: Path = field(init=False)
    tars: list[Path] = field(init=False)  # this task's tar shards
    pending: list[Path] = field(init=False)  # those not in the ledger
    failed: list[tuple[WorkItem, str]] = field(default_factory=list)  # not decoded, taken by `take_failures`
    skipped: int = 0  # images already stored
    damaged: int = 0  # messages of damage in the shards read
    finished: int = 0  # tar shards recorded in the ledger by this run
    on_finished: Callable[[int], None] = lambda count: None  # told how many tar shards were just recorded

    def __post_init__(self) -> None:
        self.root, every = find_shards(self.images)
        self.tars = every[self.shard[0]::self.shard[1]]
        # The listed ids by the tar shard that would hold them; those of no shard at all are `unknown`.
        every_id = {shard_id(tar, self.root) for tar in every}
        self._listed_in: dict[str, list[str]] = {}
        self.unknown: list[str] = []
        for image_id in sorted(self.listed or ()):
            parts = image_id.split("/")
            tar_id = next(("/".join(parts[:k]) for k in range(1, len(parts)) if "/".join(parts[:k]) in every_id), None)
            if tar_id is None:
                self.unknown.append(image_id)
            else:
                self._listed_in.setdefault(tar_id, []).append(image_id)
        self.ledger = Path(self.out) / LEDGER / f"{shard_name(*self.shard)}.jsonl"
        done = read_ledgers(self.out)
        self.pending = [tar for tar in self.tars
                        if {k: done.get(shard_id(tar, self.root), {}).get(k) for k in ("size", "mtime_ns")}
                        != file_state(tar)]
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()  # tar shard id → its samples handed on and not committed
        self._owner: dict[str, str] = {}  # image (or damage) id handed on → its tar shard id
        self._read: dict[str, dict] = {}  # tar shard id → its ledger entry, once read to its end

    def items(self, stored: set[str]) -> Iterator[WorkItem]:
        """The images of the pending shards to decode, in order; the images in `stored` are skipped,
        a sample without a usable image, a shard's damage and a listed image that its shard lacks
        become failures (`take_failures`)."""
        for tar in self.pending:
            tar_id = shard_id(tar, self.root)
            state, damage, samples = file_state(tar), [], 0
            unmet = set(self._listed_in.get(tar_id, ()))
            for sample in read_shard(tar, self.root, IMAGE_MEMBER_EXTENSIONS, damage.append):
                samples += 1
                unmet.discard(sample.id)
                if (self.listed is not None and sample.id not in self.listed) or sample.id in stored:
                    self.skipped += sample.id in stored
                    continue
                item, problem = self._item(sample, tar_id)
                if problem:
                    self._fail(tar_id, item, problem)
                else:
                    self._hand_on(tar_id, item.image_id)
                    yield item
            for number, message in enumerate(damage, 1):
                # Numbered within the shard, so that a rerun names the same damage with the same id.
                self._fail(tar_id, WorkItem(f"{tar_id}.tar", f"{tar_id}.tar#{number}"), message)
            self.damaged += len(damage)
            for image_id in sorted(unmet - stored):
                self._fail(tar_id, WorkItem(image_id, image_id), f"listed, but the tar shard {tar} holds no sample "
                                                                 f"{image_id[len(tar_id) + 1:]}")
            self._finish_reading(tar_id, {"shard": tar_id, **state, "samples": samples})

    def _item(self, sample: ShardSample, tar_id: str) -> tuple[WorkItem, str | None]:
        extension = sample.image_extension
        key = sample.id[len(tar_id) + 1:]
        item = WorkItem(f"{tar_id}.tar:{key}.{extension or '*'}", sample.id)
        if extension is None:
            return item, (f"{tar_id}.tar: sample {key} has no image member (its members: "
                          f"{', '.join(sample.extensions) or 'none'})")
        if extension not in sample.members:
            return item, f"{tar_id}.tar: the image member {key}.{extension} of sample {key} could not be read"
        item.file = EncodedImage(f"{sample.shard}:{key}.{extension}", sample.members[extension])
        return item, None

    def _hand_on(self, tar_id: str, image_id: str) -> None:
        with self._lock:
            self._open[tar_id] += 1
            self._owner[image_id] = tar_id

    def _fail(self, tar_id: str, item: WorkItem, error: str) -> None:
        self._hand_on(tar_id, item.image_id)
        self.failed.append((item, error))

    def take_failures(self) -> list[tuple[WorkItem, str]]:
        """The failures met while reading since the last call: damage, samples without an image."""
        failed, self.failed = self.failed, []
        return failed

    def committed(self, ids: Iterable[str]) -> None:
        """Notes the commit of `ids` (records and failures); a tar shard read to its end whose every
        sample is committed is recorded in the ledger."""
        with self._lock:
            for image_id in ids:
                tar_id = self._owner.pop(image_id, None)
                if tar_id is not None:
                    self._open[tar_id] -= 1
            self._record_finished()

    def _finish_reading(self, tar_id: str, entry: dict) -> None:
        with self._lock:
            self._read[tar_id] = entry
            self._record_finished()

    def _record_finished(self) -> None:
        finished = [tar_id for tar_id in self._read if self._open[tar_id] == 0]
        if finished:
            entries = read_ledger(self.ledger) | {tar_id: self._read.pop(tar_id) for tar_id in finished}
            made_folder(self.ledger.parent)
            write_atomically(self.ledger, "".join(json.dumps(entry) + "\n" for entry in entries.values()))
            self.finished += len(finished)
            self.on_finished(len(finished))


def unfinished_tar_shards(images: str | Path, out: Path) -> list[str]:
    """The tar shards of `images` that no ledger of the store `out` records as committed whole."""
    root, tars = find_shards(images)
    done = read_ledgers(out)
    return [f"{shard_id(tar, root)}.tar" for tar in tars if shard_id(tar, root) not in done]
