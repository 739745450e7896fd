"""Stopping training at a safe point when a signal asks for it.

SIGTERM is what a scheduler sends to stop a job (the local executor on Ctrl-C, Slurm at preemption
or `scancel`), SIGUSR2 what submitit has Slurm send before a time limit or a preemption. Either,
during a stage's optimiser steps, is acted on after the step in progress: the stage writes a
checkpoint (every rank agreeing on the step), then stops with `TrainingInterrupted`, and a rerun
resumes from that checkpoint to the same weights as an uninterrupted run. Anywhere else (loading,
evaluation) it stops at once: nothing there is lost that a rerun does not redo.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from vlbert.errors import UserError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class TrainingInterrupted(UserError):
    """Training stopped by a signal; `signum` is the signal, and the exit status says it as a shell does."""

    def __init__(self, signum: int, where: str) -> None:
        super().__init__(f"{where}: stopped by {signal.Signals(signum).name}; the run resumes there when it is run "
                         "again (--resume)")
        self.signum = signum
        self.exit_status = 128 + signum


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
