"""Writing a file or a folder whole or not at all: a crash (kill -9, a full disk) leaves the old one
or the new one, never a part. The one helper for every whole-file write of the project (store meta,
run configs, evaluations, predictions, summaries, reports) and one for whole folders (checkpoints,
final models, converted checkpoints); `writing` names the file in any error of a write;
`temporaries` finds what a killed writer left behind, for the next writer to `remove`."""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# A temporary of `write_atomically` (and of the store's shard creation): .<name>.<pid>.tmp
_TEMPORARY = re.compile(r"\..+\.\d+\.tmp")
# How Rust's I/O errors end (safetensors, tokenizers), which name no file: "... (os error 28)"
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def write_atomically(path: str | Path, text: str) -> None:
    """`text` in `path`, replacing it whole or not at all. The temporary name carries the process id,
    so two processes writing the same file do not write into one temporary; it is flushed to disk
    before it replaces `path`, so the rename never exposes an empty file after a power loss. On any
    failure the temporary is removed, and the error names `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with writing(path), open(tmp, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def folder_written_whole(path: str | Path, staging: str | Path) -> Iterator[Path]:
    """The folder `path` written whole or not at all: the block fills `staging` (a fresh folder beside
    it, named so that its writer's sweep finds one a killed writer left), which then replaces `path`
    and whatever it held; on any error `staging` is removed (what was written of it frees the disk)
    and `path` is as it was. Errors of writing name `path`."""
    path, staging = Path(path), Path(staging)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with writing(path):
            staging.mkdir(parents=True)
            yield staging
        shutil.rmtree(path, ignore_errors=True)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Errors of writing `path` (a file, or a folder being filled) as OSErrors that name it: a full
    disk raises "[Errno 28] No space left on device" from a write or a close without a file name,
    and safetensors' errors name none either."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    except Exception as exc:
        code = _RUST_OS_ERROR.search(str(exc))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from exc


def temporaries(folder: Path) -> list[Path]:
    """The temporaries that writers killed in `folder` left (`.<name>.<pid>.tmp`). Only a writer that
    excludes every other writer of these files (by a lock it holds) may remove them."""
    return sorted(path for path in folder.glob(".*.tmp") if _TEMPORARY.fullmatch(path.name))


def remove(paths: list[Path]) -> None:
    """Removes leftovers (files, or folders written whole before a rename) that `temporaries` and its
    kind found, under the lock that every writer of them holds."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
