"""Exclusive locks on outputs: one writer of a store's shard and of a training run's folder
(`take_lock`), and short sections that one process at a time runs (`holding`).

An exclusive flock on a lock file beside what it guards: the kernel releases it when its holder
exits, however it exits (kill -9 included), so a requeued job takes it again. The holder of a
writer's lock writes its pid and host into the file, so that a writer it refuses can say who holds
it. A forked child (a DataLoader or decoding worker) closes its copies of the held lock files at
once: the lock belongs to the open file, so a worker forked while its parent held one would go on
holding it after the parent let it go, and the parent's next wait for it would never end. Opening a
lock file and noting it as held is one step that no fork splits (`_opened`): a child forked between
the two would keep a copy that its parent then locks.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

_HELD: weakref.WeakSet = weakref.WeakSet()  # the lock files this process holds (or is about to)
_OPENING = threading.Lock()  # held from opening a lock file to noting it in _HELD, and across a fork
RETRY_S = 0.001  # the longest a writer waits before it tries again a lock that only probes held


def _in_child() -> None:
    global _OPENING
    _OPENING = threading.Lock()  # the parent's forking thread held it
    for file in list(_HELD):
        file.close()


os.register_at_fork(before=lambda: _OPENING.acquire(), after_in_parent=lambda: _OPENING.release(),
                    after_in_child=_in_child)


def _opened(path: Path, mode: str = "a+b") -> BinaryIO:
    with _OPENING:
        file = path.open(mode)
        _HELD.add(file)
    return file


def take_lock(path: Path) -> BinaryIO | None:
    """The lock file at `path`, locked by this process, which holds it while the file stays open;
    None when another process holds it."""
    file = _opened(path)
    try:
        taken = _locked_unless_a_writer_holds(file)
    except BaseException:
        file.close()
        raise
    if not taken:
        file.close()
        return None
    file.seek(0)
    file.truncate()
    file.write(f"pid {os.getpid()} on host {socket.gethostname()}\n".encode())
    file.flush()
    return file


def _locked_unless_a_writer_holds(file: BinaryIO) -> bool:
    """Takes the exclusive lock of `file`; False when a writer holds it. A probe (`is_held`) holds the
    lock shared for an instant, since flock has no way to look at a lock without taking it (fcntl's
    F_GETLK sees POSIX locks only, and /proc/locks misses a holder on another NFS client, where flock
    is a lock of the server's): so where the lock can be had shared, no writer holds it, and the
    exclusive lock is tried again. Two writers trying at once each wait a random instant before their
    next try, so that one of them takes it."""
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # held exclusively: by a writer
        fcntl.flock(file, fcntl.LOCK_UN)
        time.sleep(random.uniform(0, RETRY_S))


@contextmanager
def holding(path: Path) -> Iterator[None]:
    """The exclusive lock at `path` for the block, waiting while another process holds it."""
    with _opened(path) as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        yield


def is_held(path: Path) -> bool:
    """Whether a live process holds the lock at `path` (the kernel releases it when its holder dies).
    The probe takes the lock shared for an instant, which a writer starting meanwhile waits out
    (`take_lock`)."""
    if not path.exists():
        return False
    with _opened(path, "rb") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def lock_holder(path: Path) -> str:
    """Who holds the lock at `path`, as it recorded itself ("pid 123 on host node-1")."""
    try:
        recorded = path.read_text(errors="replace").strip()
    except OSError:
        recorded = ""
    return recorded or "a process that has not yet written its pid and host"
