"""Text-only corpora (BookCorpus, English Wikipedia) after extraction to plain text.

The layout read: UTF-8 text files (a leading BOM is dropped), one sentence (or paragraph) a line,
documents separated by one or more blank lines (lines of ASCII whitespace only); `path` is one such
file or a folder whose `*.txt` files, found recursively and read in sorted path order, make the
corpus. A file starts a new document. A corpus with no blank line at all (one sentence a line, as
BookCorpus is often distributed) is one document per file.

`TextCorpus` indexes the non-blank lines in one streaming pass, in chunks, with NumPy: per line only
its byte offset (8 bytes); files and documents are kept as the index of their first line, so the
index costs 8 bytes a line plus 8 a document and a file. UTF-8 is checked while indexing: a file
that is not UTF-8 fails at once, naming its file and line, rather than hours into training. The
object pickles without open files (DataLoader workers reopen them lazily) and, after a fork, reopens
them rather than sharing a file position with its parent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from train.data.files import BOM, DataError

CHUNK_BYTES = 1 << 22
NEWLINE = ord("\n")
ASCII_WHITESPACE = np.zeros(256, dtype=bool)
ASCII_WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True


@dataclass
class FileIndex:
    """The non-blank lines of one file: their byte offsets, and which of them start a document."""

    offsets: list[np.ndarray] = field(default_factory=list)
    document_starts: list[np.ndarray] = field(default_factory=list)  # positions among the file's lines
    lines: int = 0  # non-blank lines so far
    lines_read: int = 0  # all lines so far, blank ones too: for messages
    previous_nonblank: bool = False

    def add(self, path: Path, data: bytes, base: int) -> None:
        """The whole lines in `data` (its last line may lack its newline), which starts at byte `base`."""
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = self.lines_read + data.count(b"\n", 0, exc.start) + 1
            raise DataError(f"{path}:{line}: not UTF-8 text ({exc.reason})") from None
        buffer = np.frombuffer(data, dtype=np.uint8)
        ends = np.flatnonzero(buffer == NEWLINE)
        if not data.endswith(b"\n"):
            ends = np.append(ends, len(buffer))
        starts = np.concatenate(([0], ends[:-1] + 1))
        # A line is blank when it holds nothing but ASCII whitespace. Its first byte decides for most
        # lines (an empty line's first byte is its newline); the few that start with whitespace and
        # go on (indented text, "  \r\n") are looked at whole.
        starts_blank = ASCII_WHITESPACE[buffer[starts]]
        nonblank = ~starts_blank
        for line in np.flatnonzero(starts_blank & (ends - starts > 1)):
            nonblank[line] = bool(data[starts[line]:ends[line]].strip())
        after_blank = ~np.concatenate(([self.previous_nonblank], nonblank[:-1]))
        self.offsets.append(base + starts[nonblank])
        self.document_starts.append(self.lines + np.flatnonzero(after_blank[nonblank]))
        self.lines += int(nonblank.sum())
        self.lines_read += len(ends)
        self.previous_nonblank = bool(nonblank[-1])


def index_file(path: Path) -> FileIndex:
    """The FileIndex of `path`, read in chunks of whole lines; a leading BOM is not part of line 1."""
    index = FileIndex()
    rest = b""  # the unfinished last line of the previous chunk
    try:
        with path.open("rb") as f:
            if f.read(len(BOM)) != BOM:
                f.seek(0)
            base = f.tell()
            while chunk := f.read(CHUNK_BYTES):
                data = rest + chunk
                cut = data.rfind(b"\n") + 1
                if cut:
                    index.add(path, data[:cut], base)
                    base += cut
                rest = data[cut:]
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if rest:
        index.add(path, rest, base)
    return index


def corpus_files(path: Path) -> list[Path]:
    """`path` itself, or the `*.txt` files under the folder `path` (recursively, sorted)."""
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*.txt") if p.is_file())
    raise DataError(f"{path}: no such file or folder")


class TextCorpus:
    """The non-blank lines of a plain-text corpus, by number, packed into passages by document."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        self.files = corpus_files(path)
        offsets, document_first, file_first = [], [], []
        lines = 0
        for file in self.files:
            index = index_file(file)
            file_first.append(lines)
            offsets += index.offsets
            document_first += [lines + starts for starts in index.document_starts]
            lines += index.lines
        if not lines:
            raise DataError(f"{path}: an empty corpus (no non-blank line in {len(self.files)} files)")
        self._offsets = np.concatenate(offsets)  # of each line in its file
        self._file_first = np.asarray(file_first, dtype=np.int64)  # the first line of each file
        self._document_first = np.concatenate(document_first)  # the first line of each document
        self._open: dict[int, BinaryIO] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def documents(self) -> int:
        return len(self._document_first)

    def text(self, i: int, max_words: int) -> str:
        """Line `i`, followed by the next lines of its document while the whole stays within
        `max_words` whitespace-separated words (line `i` itself whatever its length)."""
        if not 0 <= i < len(self):
            raise IndexError(f"line {i} of a corpus of {len(self)} lines")
        document = int(np.searchsorted(self._document_first, i, side="right")) - 1
        end = int(self._document_first[document + 1]) if document + 1 < self.documents else len(self)
        file = int(np.searchsorted(self._file_first, i, side="right")) - 1
        handle = self._handle(file)
        handle.seek(int(self._offsets[i]))
        # the lines of one document follow each other in the file with no blank line between
        lines, words = [], 0
        for _ in range(i, end):
            line = handle.readline().decode("utf-8").strip()
            count = len(line.split())
            if lines and words + count > max_words:
                break
            lines.append(line)
            words += count
        return " ".join(lines)

    def _handle(self, file: int) -> BinaryIO:
        if self._pid != os.getpid():  # a forked copy: its parent's files share their read position
            self._open, self._pid = {}, os.getpid()
        if file not in self._open:
            self._open[file] = self.files[file].open("rb")
        return self._open[file]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": {}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _pid=os.getpid())
