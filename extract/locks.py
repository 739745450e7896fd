"""Exclusive locks on outputs: one writer of a store's shard and of a training run's folder
(`take_lock`), and short sections that one process at a time runs (`holding`).

An exclusive flock on a lock file beside what it guards: the kernel releases it when its holder
exits, however it exits (kill -9 included), so a requeued job takes it again. The holder of a
writer's lock writes its pid and host into the file, so that a writer it refuses can say who holds
it. A forked child (a DataLoader or decoding worker) closes its copies of the held lock files at
once: the lock belongs to the open file, so a worker forked while its parent held one would go on
holding it after the parent let it go, and the parent's next wait for it would never end.
"""

from __future__ import annotations

import fcntl
import os
import socket
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

_HELD: weakref.WeakSet = weakref.WeakSet()  # the lock files this process holds


def _close_in_child() -> None:
    for file in list(_HELD):
        file.close()


os.register_at_fork(after_in_child=_close_in_child)


def take_lock(path: Path) -> BinaryIO | None:
    """The lock file at `path`, locked by this process, which holds it while the file stays open;
    None when another process holds it."""
    file = path.open("a+b")
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        return None
    except BaseException:
        file.close()
        raise
    file.seek(0)
    file.truncate()
    file.write(f"pid {os.getpid()} on host {socket.gethostname()}\n".encode())
    file.flush()
    _HELD.add(file)
    return file


@contextmanager
def holding(path: Path) -> Iterator[None]:
    """The exclusive lock at `path` for the block, waiting while another process holds it."""
    with path.open("a+b") as file:
        _HELD.add(file)
        fcntl.flock(file, fcntl.LOCK_EX)
        yield


def lock_holder(path: Path) -> str:
    """Who holds the lock at `path`, as it recorded itself ("pid 123 on host node-1")."""
    try:
        recorded = path.read_text(errors="replace").strip()
    except OSError:
        recorded = ""
    return recorded or "a process that has not yet written its pid and host"
