"""Writing a file whole or not at all: a crash (kill -9, a full disk) leaves the old file or the new
one, never a part. The one helper for every whole-file write of the project (store meta, run
configs, evaluations, predictions, summaries)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | Path, text: str) -> None:
    """`text` in `path`, replacing it whole or not at all. The temporary name carries the process id,
    so two processes writing the same file do not write into one temporary; it is flushed to disk
    before it replaces `path`, so the rename never exposes an empty file after a power loss."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
