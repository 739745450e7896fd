"""One writer per output: the lock of a store's shard and of a training run's folder.

An exclusive flock on a lock file beside what it guards: the kernel releases it when its holder
exits, however it exits (kill -9 included), so a requeued job takes it again. The holder writes
its pid and host into the file, so that a writer it refuses can say who holds it. A forked child
(a DataLoader worker) closes its copies at once: the lock belongs to the open file, so a worker that
outlived its parent's release would otherwise go on holding it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import weakref
from pathlib import Path
from typing import BinaryIO

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


def lock_holder(path: Path) -> str:
    """Who holds the lock at `path`, as it recorded itself ("pid 123 on host node-1")."""
    try:
        recorded = path.read_text(errors="replace").strip()
    except OSError:
        recorded = ""
    return recorded or "a process that has not yet written its pid and host"
