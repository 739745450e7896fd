"""Checking an LMDB data file with plain reads before LMDB maps it.

LMDB trusts its file: a page past the end of a truncated file is a SIGBUS, and a damaged node size
or page pointer makes it read outside the file. So before a shard is mapped, this module reads the
meta pages and every branch and leaf page of every tree with `pread`, and checks that everything
LMDB could follow stays inside the file: the file is as long as the newest meta page says, every
page number is below the meta's next page, page headers and node offsets fit their page, overflow
values fit the file, sub-database records are whole, and each tree's page and entry counts match
its record. Overflow pages (the record values) are only range-checked: their bytes are covered by
the records' own checksums.

Layout facts (LMDB 0.9, 64-bit): a 16-byte page header (page number u64, pad u16, flags u16,
lower/upper u16 or overflow page count u32); meta pages 0 and 1, the newer (higher txnid) in use,
meta i written by transactions with txnid ≡ i (mod 2); nodes of an 8-byte header (lo, hi, flags,
key size: u16 each) followed by the key and the data.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE_HEADER = struct.Struct("<QHHHH")  # page number, pad, flags, lower, upper
DB_RECORD = struct.Struct("<IHHQQQQQ")  # pad (page size in the free DB), flags, depth, branch, leaf, overflow, entries, root
META = struct.Struct("<IIQQ" + DB_RECORD.format[1:] * 2 + "QQ")  # magic, version, address, map size, 2 DBs, last page, txnid
HEADER_SIZE = 16
NODE_HEADER = 8
MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
P_BRANCH, P_LEAF, P_META = 0x01, 0x02, 0x08
F_BIGDATA, F_SUBDATA = 0x01, 0x02
NO_ROOT = 2**64 - 1
PAGE_SIZES = tuple(2**i for i in range(9, 16))  # 512 .. 32 KiB, what LMDB accepts
MAX_DEPTH = 64
PAGES_PER_READ = 4096  # pages checked together: 16 MiB at LMDB's usual 4 KiB pages
PAGE_HEADER_DTYPE = np.dtype([("pgno", "<u8"), ("pad", "<u2"), ("flags", "<u2"), ("lower", "<u2"), ("upper", "<u2")])
# The kinds of tree in a FeatureStore shard and the node flags each may hold: the main database
# holds the named databases' records (F_SUBDATA), they and the free-page database hold values.
FREE_PAGES, MAIN, RECORDS = "free pages", "main", "records"
NODE_FLAGS = {FREE_PAGES: F_BIGDATA, MAIN: F_BIGDATA | F_SUBDATA, RECORDS: F_BIGDATA}


class DamagedFileError(ValueError):
    """The file is not an intact LMDB data file; the message says what is wrong, without the path."""


@dataclass(frozen=True)
class Tree:
    """An LMDB database record (MDB_db): where its tree starts and what it holds."""

    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int

    @classmethod
    def unpack(cls, values: tuple) -> "Tree":
        return cls(*values[1:])


@dataclass(frozen=True)
class Meta:
    txnid: int
    last_page: int
    page_size: int
    free: Tree
    main: Tree


_checked: dict[tuple, None] = {}  # (path, inode, size, mtime) of files that passed; forked workers inherit it


def check_data_file(path: str | Path) -> None:
    """Raises DamagedFileError when LMDB could read outside `path` (or find a broken tree) in it.
    A file that passed is not read again while its size and modification time stay the same."""
    path = Path(path)
    stat = path.stat()
    identity = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if identity in _checked:
        return
    with path.open("rb") as f:
        _DataFile(f.fileno(), stat.st_size).check()
    _checked[identity] = None


class _DataFile:
    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.visited: set[int] = set()  # branch and leaf pages met so far: a page reached twice is damage

    def check(self) -> None:
        meta = self.current_meta()
        self.page_size, self.next_page = meta.page_size, meta.last_page + 1
        needed = self.next_page * self.page_size
        if self.size < needed:
            raise DamagedFileError(f"truncated: {self.size} bytes, its meta page says the data reaches {needed} bytes")
        self.check_tree(meta.free, "the free-page database", FREE_PAGES)
        self.check_tree(meta.main, "the main database", MAIN)

    # ---- meta pages --------------------------------------------------------------------------

    def current_meta(self) -> Meta:
        if self.size < 2 * PAGE_SIZES[0]:
            raise DamagedFileError(f"truncated: {self.size} bytes, less than LMDB's two meta pages")
        first = self.read_meta(0, None)
        second = self.read_meta(1, first.page_size)
        for index, meta in enumerate((first, second)):
            if meta.txnid % 2 != index and meta.txnid != 0:
                raise DamagedFileError(f"meta page {index}: transaction id {meta.txnid} cannot be written there")
        if abs(first.txnid - second.txnid) > 1:
            raise DamagedFileError(f"meta pages disagree: transaction ids {first.txnid} and {second.txnid}")
        return second if second.txnid > first.txnid else first  # as LMDB picks

    def read_meta(self, index: int, page_size: int | None) -> Meta:
        offset = 0 if page_size is None else page_size
        data = self.read(offset, HEADER_SIZE + META.size)
        _, _, flags, _, _ = PAGE_HEADER.unpack_from(data)
        values = META.unpack_from(data, HEADER_SIZE)
        magic, version = values[0], values[1]
        if not flags & P_META or magic != MAGIC:
            raise DamagedFileError(f"meta page {index} is damaged (not an LMDB meta page)")
        if version != DATA_VERSION:
            raise DamagedFileError(f"meta page {index}: LMDB data version {version}, expected {DATA_VERSION}")
        free, main = Tree.unpack(values[4:12]), Tree.unpack(values[12:20])
        size = values[4]  # the free DB's pad field holds the page size
        if size not in PAGE_SIZES or (page_size is not None and size != page_size):
            raise DamagedFileError(f"meta page {index}: page size {size}")
        return Meta(txnid=values[21], last_page=values[20], page_size=size, free=free, main=main)

    # ---- trees, a level at a time (vectorised over every node of the level) ---------------------

    def check_tree(self, tree: Tree, name: str, kind: str) -> None:
        if tree.root == NO_ROOT:
            if tree.entries or tree.depth:
                raise DamagedFileError(f"{name}: no root page but {tree.entries} entries")
            return
        if not 1 <= tree.depth <= MAX_DEPTH:
            raise DamagedFileError(f"{name}: depth {tree.depth}")
        counts = {"branch": 0, "leaf": 0, "overflow": 0, "entries": 0}
        level = np.array([tree.root], dtype=np.int64)
        for depth in range(1, tree.depth + 1):
            leaf = depth == tree.depth
            children = []
            for first in range(0, len(level), PAGES_PER_READ):
                numbers = level[first : first + PAGES_PER_READ]
                pages = self.read_pages(numbers, name)
                nodes = self.nodes(pages, numbers, P_LEAF if leaf else P_BRANCH, name)
                counts["leaf" if leaf else "branch"] += len(numbers)
                if leaf:
                    counts["entries"] += len(nodes["flags"])
                    self.check_values(pages, numbers, nodes, name, kind, counts)
                else:
                    children.append(nodes["child"])
            level = np.concatenate(children) if children else level[:0]
        found = (counts["branch"], counts["leaf"], counts["overflow"], counts["entries"])
        recorded = (tree.branch_pages, tree.leaf_pages, tree.overflow_pages, tree.entries)
        if found != recorded:
            raise DamagedFileError(f"{name}: its record says (branch, leaf, overflow pages, entries) = {recorded}, "
                                   f"the tree holds {found}")

    def read_pages(self, numbers: np.ndarray, name: str) -> np.ndarray:
        """(pages, page size) bytes, after checking that each page lies in the data and is met once."""
        outside = (numbers < 2) | (numbers >= self.next_page)
        if outside.any():
            raise DamagedFileError(f"{name}: page number {int(numbers[outside][0])} outside the data "
                                   f"(pages 2..{self.next_page - 1})")
        listed = numbers.tolist()
        if len(set(listed)) != len(listed) or not self.visited.isdisjoint(listed):
            raise DamagedFileError(f"{name}: a page is reached twice")
        self.visited.update(listed)
        data = b"".join(self.read(n * self.page_size, self.page_size) for n in listed)
        return np.frombuffer(data, dtype=np.uint8).reshape(len(listed), self.page_size)

    def nodes(self, pages: np.ndarray, numbers: np.ndarray, page_type: int, name: str) -> dict[str, np.ndarray]:
        """Every node's page (row), offset and header fields, after checking that page headers,
        node offsets, node headers and keys lie inside their page."""
        header = np.ascontiguousarray(pages[:, :HEADER_SIZE]).view(PAGE_HEADER_DTYPE)[:, 0]
        lower, upper = header["lower"].astype(np.int64), header["upper"].astype(np.int64)
        bad = ((header["pgno"] != numbers) | (header["flags"] & (P_BRANCH | P_LEAF) != page_type)
               | (lower < HEADER_SIZE + 2) | (lower > upper) | (upper > self.page_size) | (lower % 2 != 0))
        self.refuse(bad, numbers, name, "has a damaged header")
        per_page = (lower - HEADER_SIZE) // 2
        row = np.repeat(np.arange(len(numbers)), per_page)
        index = np.arange(len(row)) - np.repeat(np.cumsum(per_page) - per_page, per_page)
        position = HEADER_SIZE + 2 * index
        offsets = pages[row, position].astype(np.int64) | pages[row, position + 1].astype(np.int64) << 8
        bad = (offsets < upper[row]) | (offsets > self.page_size - NODE_HEADER) | (offsets % 2 != 0)
        self.refuse(bad, numbers[row], name, "has a node offset outside its node area")
        fields = np.ascontiguousarray(pages[row[:, None], offsets[:, None] + np.arange(NODE_HEADER)])
        lo, hi, flags, key_size = fields.view("<u2").astype(np.int64).T
        key_end = offsets + NODE_HEADER + key_size
        self.refuse(key_end > self.page_size, numbers[row], name, "has a key that runs past the page")
        return {"row": row, "offsets": offsets, "flags": flags, "key_end": key_end, "size": lo | hi << 16,
                "child": lo | hi << 16 | flags << 32}

    def check_values(self, pages: np.ndarray, numbers: np.ndarray, nodes: dict, name: str, kind: str,
                     counts: dict) -> None:
        row, flags, size, start = nodes["row"], nodes["flags"], nodes["size"], nodes["key_end"]
        self.refuse((flags & ~NODE_FLAGS[kind]) != 0, numbers[row], name, "has a node with unknown flags")
        big = (flags & F_BIGDATA) != 0
        self.refuse(start + np.where(big, 8, size) > self.page_size, numbers[row], name,
                    "has a value that runs past the page")
        if big.any():
            first = np.ascontiguousarray(pages[row[big, None], start[big, None] + np.arange(8)]).view("<u8")[:, 0]
            first = first.astype(np.int64)  # a damaged number beyond 2**63 turns negative: refused below
            spanned = (HEADER_SIZE - 1 + size[big]) // self.page_size + 1
            self.refuse((first < 2) | (first + spanned > self.next_page), numbers[row[big]], name,
                        "has a value whose overflow pages lie outside the data")
            counts["overflow"] += int(spanned.sum())
        for i in np.flatnonzero(flags & F_SUBDATA).tolist():
            page, where = pages[row[i]], f"{name}: page {int(numbers[row[i]])}"
            if size[i] != DB_RECORD.size:
                raise DamagedFileError(f"{where}: a database record of {size[i]} bytes")
            key = page[nodes["offsets"][i] + NODE_HEADER : start[i]].tobytes().decode("utf-8", "replace")
            self.check_tree(Tree.unpack(DB_RECORD.unpack_from(page, int(start[i]))), f"database {key!r}", RECORDS)
        if kind == FREE_PAGES:
            for i in np.flatnonzero(~big).tolist():
                self.check_free_list(pages[row[i], start[i] : start[i] + size[i]], f"{name}: page {int(numbers[row[i]])}")

    def check_free_list(self, value: np.ndarray, where: str) -> None:
        """An inline free-page list (a count, then page numbers): a writer reuses these pages, so a
        damaged list would let it overwrite live data."""
        if len(value) < 8 or len(value) % 8:
            raise DamagedFileError(f"{where}: a free-page list of {len(value)} bytes")
        ids = value.view("<u8").astype(np.int64)
        if ids[0] != len(ids) - 1 or ((ids[1:] < 2) | (ids[1:] >= self.next_page)).any():
            raise DamagedFileError(f"{where}: a damaged free-page list")

    @staticmethod
    def refuse(bad: np.ndarray, pages: np.ndarray, name: str, what: str) -> None:
        if bad.any():
            raise DamagedFileError(f"{name}: page {int(pages[np.argmax(bad)])} {what}")

    def read(self, offset: int, length: int) -> bytes:
        data = os.pread(self.fd, length, offset)
        if len(data) != length:
            raise DamagedFileError(f"truncated: {self.size} bytes, a page at byte {offset} is missing")
        return data
