"""Writing a file or a folder whole or not at all: a crash (kill -9, a full disk) leaves the old one
or the new one, never a part. The one helper for every whole-file write of the project (store meta,
run configs, evaluations, predictions, summaries, reports, pictures) and one for whole folders
(checkpoints, final models, converted checkpoints); `writing` names the file in any error of a write;
`temporaries` finds what a killed writer left behind, for the next writer to `remove`. Every path
written, and every folder made (`made_folder`), is `checked` first (vlbert/utils/paths.py): none is
written through a symlink that leaves a declared output folder."""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from vlbert.utils.paths import checked

# A temporary of `write_atomically` (and of the store's shard creation): .<name>.<pid>.tmp
_TEMPORARY = re.compile(r"\..+\.\d+\.tmp")
# How Rust's I/O errors end (safetensors, tokenizers), which name no file: "... (os error 28)"
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def write_atomically(path: str | Path, text: str) -> None:
    """`text` in `path`, replacing it whole or not at all; flushed to disk before it replaces `path`,
    so the rename never exposes an empty file after a power loss."""
    with file_written_whole(path) as tmp, open(tmp, "x") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


@contextmanager
def file_written_whole(path: str | Path) -> Iterator[Path]:
    """The file `path` written whole or not at all: the block writes the temporary it is given (beside
    `path`, named with the process id, so two processes writing one file do not write into one
    temporary), which then replaces `path`. On any failure the temporary is removed, and errors of
    writing name `path`."""
    path = checked(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a killed writer's (or a planted link): writes never follow it
        with writing(path):
            yield tmp
        os.replace(tmp, path)  # replaces a symlink at `path` itself, never what it points to
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def made_folder(path: str | Path) -> Path:
    """The folder `path` (and those above it) made where missing, once `checked`."""
    path = checked(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def folder_written_whole(path: str | Path, staging: str | Path) -> Iterator[Path]:
    """The folder `path` written whole or not at all: the block fills `staging` (a fresh folder beside
    it, named so that its writer's sweep finds one a killed writer left), which then replaces `path`
    and whatever it held; on any error `staging` is removed (what was written of it frees the disk)
    and `path` is as it was. Errors of writing name `path`."""
    path, staging = checked(path), checked(staging)
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
