"""The processes of a local run: what tells a process from a later one given the same pid
(`process_identity`), a pid read back from the run's state file, which anyone may have written
(`recorded_pid`), and a step's process that ends with the scheduler that started it, however the
scheduler ends (`end_with_scheduler`), and a step's output appended to its log (`append_output_to`).

A step runs in a session of its own (the scheduler stops it by its process group), forked from a
server or started by torch's launcher, so its parent is often not the scheduler and a parent-death
signal (prctl's PR_SET_PDEATHSIG) would not say when the scheduler is gone: each of the step's
processes is told the scheduler's pid and identity instead, and watches that process (a pidfd, which
the kernel makes readable when it ends).
"""

from __future__ import annotations

import os
import reprlib
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pipelines.own_packages import USAGE
from vlbert.utils import step_environment

SCHEDULER_VARIABLE = step_environment.SCHEDULER  # "PID IDENTITY" of the scheduler that started a step
PID_MAX_FILE = Path("/proc/sys/kernel/pid_max")
PID_LIMIT = 4194304  # Linux's highest pid_max (PID_MAX_LIMIT on 64 bits): where pid_max cannot be read
POLL_S = 0.5  # how often a process is looked at where no pidfd can watch it
ENDING_GRACE_S = 120.0  # how long a step whose scheduler ended may take to checkpoint before it is killed


def process_identity(pid: int) -> str | None:
    """What tells process `pid` from a later one given the same pid: the boot and the time it started
    (Linux's /proc); None when no such process runs (an ended one that its parent has not reaped yet,
    a zombie, runs no more)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    if fields[0] in ("Z", "X"):  # field 3 of stat, the state: the 1st after the command's ")"
        return None
    return f"{boot}/{fields[19]}"  # field 22, the start time


def recorded_pid(value: Any) -> int:
    """`value`, read from a record, as a process's id: a whole number (JSON's true is none) above 1 (to
    kill, 0 and -1 are process groups and 1 is init) and below the system's pid_max; ValueError saying
    why not. A JSON object's key holding a pid is given as the number its digits write."""
    if type(value) is not int:
        raise ValueError(f"{reprlib.repr(value)} is not a whole number")
    limit = pid_max()
    if not 1 < value < limit:
        raise ValueError(f"{value} is not a process id (one from 2 to {limit - 1})")
    return value


def pid_max() -> int:
    try:
        return int(PID_MAX_FILE.read_text())
    except (OSError, ValueError):
        return PID_LIMIT


def scheduler_variable() -> dict[str, str]:
    """The environment that tells a step's processes that this process (the scheduler) started them."""
    return {SCHEDULER_VARIABLE: f"{os.getpid()} {process_identity(os.getpid())}"}


def end_with_scheduler() -> None:
    """In a step's process whose environment names the scheduler that started it: when that scheduler
    ends first, however it ends (kill -9, out of memory), the step stops as on the scheduler's SIGTERM
    (training writes a checkpoint, extraction has committed its batches), and what is left of its
    process group is killed after ENDING_GRACE_S; so no orphan holds the step's locks, and a rerun
    resumes it. Nothing happens where no scheduler is named."""
    given = os.environ.get(SCHEDULER_VARIABLE)
    if not given:
        return
    pid, _, identity = given.partition(" ")
    try:
        scheduler = recorded_pid(int(pid) if pid.isdigit() else pid)
    except ValueError as exc:  # not an executor's: one line, before anything runs (nor is a process watched)
        print(f"Error: {SCHEDULER_VARIABLE}={reprlib.repr(given)}: {exc}; it is the executor's record of its "
              f"scheduler (\"PID IDENTITY\"), set for the processes it starts: unset it", file=sys.stderr)
        raise SystemExit(USAGE) from None
    threading.Thread(target=_end_after, args=(scheduler, identity), name="end-with-scheduler", daemon=True).start()


def _end_after(scheduler: int, identity: str) -> None:
    wait_for_end(scheduler, identity)
    # SIGTERM to this process alone: its DataLoader workers take a stop only from the scheduler, and a
    # SIGTERM of theirs (from this process) would end them before the checkpoint is written.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ENDING_GRACE_S)
    if os.getpgrp() == os.getpid():  # a group of its own (the executor's or torch's launcher's session)
        os.killpg(0, signal.SIGKILL)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


def wait_for_end(pid: int, identity: str, timeout_s: float | None = None) -> bool:
    """Waits until process `pid` is no longer the one of `identity` (or `timeout_s` passed): whether it ended."""
    try:
        ended = os.pidfd_open(pid)  # readable once that process ends
    except OSError:  # it ended already (seen below), or no pidfds (Linux before 5.3): it is polled
        ended = None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while process_identity(pid) == identity:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if ended is None:
                time.sleep(POLL_S if left is None else min(POLL_S, left))
            else:
                select.select([ended], [], [], left)
        return True
    finally:
        if ended is not None:
            os.close(ended)


def append_output_to(log_file: Path) -> None:
    """From now on this process's stdout and stderr are appended to `log_file`: the file descriptors,
    so that the output of the processes it starts goes there too."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
