"""Step processes forked from a server that has imported torch and the step code once: a heavy step's
process starts in milliseconds instead of the ~5 s its imports take on a 2-core machine
(transformers' BERT module alone is ~3 s). On a pipeline of many short steps (ablation.yaml's 19
train steps of 10-30 s) those imports were a fifth of the scheduled run's CPU time.

Each step still runs in a process (and session) of its own, with its environment, its log and its
exit status, exactly as `vlbert pipeline step SPEC` would: the server is Python's forkserver
(multiprocessing), which imports the modules below and never runs a tensor operation, so no thread
pool exists when it forks and CUDA is first initialised in the child, after CUDA_VISIBLE_DEVICES is
set.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Callable

from pipelines.executors.processes import append_output_to, end_with_scheduler

# What a heavy step's process imports anyway; the server imports them once.
PRELOAD = ["torch", "pipelines.cli", "pipelines.execution", "train.engine.trainer", "extract.job"]
SAFE_PATH = "PYTHONSAFEPATH"


def _context():
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def warm_up() -> None:
    """Starts the server (if it is not running) without waiting for its imports: they then overlap
    whatever runs before the first heavy step. The server runs as `python -c ...`, which puts the
    current folder first on its import path (and Python 3.11's server ignores the path it is given):
    it starts with PYTHONSAFEPATH, so that a train.py there does not stand in for the project's `train`."""
    _context()
    from multiprocessing import forkserver

    before = os.environ.get(SAFE_PATH)
    os.environ[SAFE_PATH] = "1"
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ[SAFE_PATH]
        else:
            os.environ[SAFE_PATH] = before


def shut_down() -> None:
    """Stops the server and reaps it, so that the CPU time of the steps it forked (and reaped) counts
    as this process's children's, as a command's would. Python's forkserver has no public stop: its
    `_stop` (there since 3.8, for its own tests) is used where it exists; elsewhere the server ends by
    itself when this process does."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


class ForkedProcess:
    """A forked step process with the part of `subprocess.Popen`'s face the scheduler uses."""

    def __init__(self, arguments: list[str], env: dict[str, str], log_file: Path,
                 command: Callable[[list[str]], None] | None = None) -> None:
        """`command` (a module-level function, default the `vlbert` command) runs with `arguments`."""
        warm_up()  # the server, where it is not running yet
        self._process = _context().Process(target=_step_process, args=(arguments, env, str(log_file),
                                                                         command or _vlbert))
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self) -> int:
        self._process.join()
        return self._process.exitcode


def _step_process(arguments: list[str], env: dict[str, str], log_file: str,
                  command: Callable[[list[str]], None]) -> None:
    """In the forked child: a session of its own (the scheduler stops a step by its process group),
    the step's environment (ending with the scheduler it names), its output appended to its log; then
    the command, whose SystemExit is the process's exit status."""
    os.setsid()
    # A forkserver's child inherits "forkserver" as its start method: the step's own workers (the
    # DataLoader's, the decoding pool's) would each be started by a new server that imports
    # everything again. They start as they would in a process started as a command.
    multiprocessing.set_start_method(None, force=True)
    os.environ.clear()
    os.environ.update(env)
    end_with_scheduler()  # the scheduler is not this process's parent: the server is
    append_output_to(log_file)
    command(arguments)


def _vlbert(arguments: list[str]) -> None:
    from pipelines.cli import main

    main(args=arguments, prog_name="vlbert")
