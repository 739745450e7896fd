"""Stopping training at a safe point when a signal asks for it.

SIGTERM is what a scheduler sends to stop a job (the local executor on Ctrl-C, Slurm at preemption
or `scancel`), SIGUSR2 what submitit has Slurm send before a time limit or a preemption, SIGINT what
Ctrl-C sends to a step that runs in the terminal's process (`pipeline run --jobs 1`, `vlbert train`).
Any of them, during a stage's optimiser steps, is acted on after the step in progress: the stage
writes a checkpoint (every rank agreeing on the step), then stops with `TrainingInterrupted`, and a
rerun resumes from that checkpoint to the same weights as an uninterrupted run. Anywhere else
(loading, evaluation) it stops at once: nothing there is lost that a rerun does not redo.

The signal reaches the DataLoader workers too (a process group, a terminal's foreground group, a
Slurm job's processes), and a worker that died of it would take down the step it should let finish:
`spared_from_stops` starts a loader's workers holding the stop signals, and a worker ends only when
the process that started it says so (its DataLoader's shutdown, or the end of that process).
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from vlbert.utils.errors import Stopped

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)


class TrainingInterrupted(Stopped):
    """Training stopped by a signal; `signum` is the signal, and the exit status says it as a shell does."""

    def __init__(self, signum: int, where: str) -> None:
        super().__init__(f"{where}: stopped by {signal.Signals(signum).name}; rerun to resume from there "
                         "(`vlbert train` needs --resume)", signum)


class StopSignals:
    """Handles STOP_SIGNALS while the block runs (in the main thread; elsewhere signals are not ours)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._deferring = False
        self._where = "training"

    def __enter__(self) -> StopSignals:
        self._before = {}
        if threading.current_thread() is threading.main_thread():
            self._before = {signum: signal.signal(signum, self._received) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @contextmanager
    def deferred(self, where: str) -> Iterator[None]:
        """While the block runs, a signal waits for `requested` to be seen; `where` names the place in
        the message of an interruption that cannot wait."""
        self._deferring, self._where = True, where
        try:
            yield
        finally:
            self._deferring = False

    def interrupted(self, where: str) -> TrainingInterrupted:
        return TrainingInterrupted(self.signum or signal.SIGTERM, where)

    def _received(self, signum: int, frame) -> None:
        first = self.signum is None
        self.signum = signum
        if not (self._deferring and first):  # a second signal does not wait either
            raise TrainingInterrupted(signum, self._where)


def spared_from_stops(loader) -> Iterator:
    """`iter(loader)` (a torch DataLoader) whose worker processes never act on STOP_SIGNALS: they are
    held while the workers start (a worker inherits them held), and each worker holds them for good.
    A SIGTERM from the process that started it (its DataLoader's shutdown, the process's end) ends a
    worker as before, with exit status 0 so that it is not taken for a crash; from anyone else it is
    the step's to act on. A `worker_init_fn` the loader already has runs after."""
    loader.worker_init_fn = SparedWorker(os.getpid(), loader.worker_init_fn)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class SparedWorker:
    """A DataLoader's `worker_init_fn` (an object, for workers that are spawned): holds STOP_SIGNALS
    in the worker and has a thread take its SIGTERMs, ending it when `owner` sent one."""

    def __init__(self, owner: int, then: Callable[[int], None] | None = None) -> None:
        self.owner, self.then = owner, then

    def __call__(self, worker_id: int) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        threading.Thread(target=_end_when_asked_by, args=(self.owner,), name="stop-signals", daemon=True).start()
        if self.then is not None:
            self.then(worker_id)


def _end_when_asked_by(owner: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == owner:
            os._exit(0)
