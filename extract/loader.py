"""The extraction job's input side: images decoded in worker processes, handed over in order.

A worker is a forked process that runs `decode` on the items it is sent, one at a time, and
sends each result back through its own pipe from a sender thread, so it goes on decoding while
the job computes. Results come out in the items' order, at most `depth` items ahead of the
consumer, so memory stays bounded whatever the job's size. The items may be a stream (an
iterator): each is taken from it when it is sent, so one that carries its image's bytes (read from a
tar shard) is read only `depth` items ahead.

A worker that dies on an item (a decoder's segfault, os._exit, the kernel's OOM killer) makes
that item a failure; a fresh worker takes over the items the dead one had not answered.
"""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import os
import pickle
import queue
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterable, Iterator, Protocol, Sized

import torch

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Looked up here, not in a freshly forked worker: dlopen there could wait forever on a loader lock
# that another thread of the job held at the fork.
_PRCTL = getattr(ctypes.CDLL(None), "prctl", None)
IDLE_CHECK_SECONDS = 1.0  # how often an idle worker checks that the job still runs (where PDEATHSIG is missing)
IDLE = -1  # a worker's entry in the "decoding now" table between items
_END = object()  # the end of the items


class Item(Protocol):
    file: Any  # named in the failure of a worker that crashed on the item


@dataclass
class WorkItem:
    """An image of the extraction job."""

    path: str  # relative to the images root, as given (the failures.jsonl `image`)
    image_id: str
    file: Any = None  # the image file's Path, or its bytes (extract.images.EncodedImage)
    boxes: Any = None  # given-box mode: the boxes file's entry, checked when the image is prepared


def failure_reason(exc: BaseException) -> str:
    """One line for failures.jsonl: our ValueErrors name the input and the problem already."""
    return str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"


class DecodingPipeline:
    """Iterates `(item, decode(item), None)` or `(item, None, why it failed)` in the order of `items`
    (a sequence, or an iterator read as the items are sent).

    `workers=0` decodes in the calling process. Workers are forked when the pipeline is created,
    so create it before opening files a worker must not keep open. Use it as a context manager:
    leaving it stops the workers.
    """

    def __init__(self, decode: Callable[[Any], Any], items: Iterable[Item], workers: int, depth: int) -> None:
        self.decode, self.items = decode, items
        count = min(workers, len(items)) if isinstance(items, Sized) else workers
        self._pool = _WorkerPool(decode, items, count, max(1, depth)) if count > 0 else None

    def __iter__(self) -> Iterator[tuple[Any, Any, str | None]]:
        if self._pool is not None:
            yield from self._pool.results()
            return
        for item in self.items:
            try:
                decoded = self.decode(item)
            except Exception as exc:  # noqa: BLE001 - one bad image is a failure, the job goes on
                yield item, None, failure_reason(exc)
                continue
            yield item, decoded, None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> "DecodingPipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class _Worker:
    process: multiprocessing.Process
    tasks: Connection  # (index, item) to the worker; None stops it
    results: Connection  # pickled (index, decoded, error) from it
    unanswered: list[int] = field(default_factory=list)  # indices sent, in the order sent


class _WorkerPool:
    def __init__(self, decode: Callable[[Any], Any], items: Iterable[Item], count: int, depth: int) -> None:
        self.decode, self.items, self.depth = decode, items, depth
        self.sent: dict[int, Item] = {}  # the items sent and not yet handed on, by index
        # Which item each worker is decoding (IDLE between items), in memory the forked workers
        # share: after a crash it names the item to blame, and only that one.
        self.decoding = memoryview(mmap.mmap(-1, 8 * count)).cast("q")
        self.context = multiprocessing.get_context("fork")  # workers inherit `decode` as it is
        self.workers = [self._start(position) for position in range(count)]

    def _start(self, position: int) -> _Worker:
        self.decoding[position] = IDLE
        tasks, to_worker = self.context.Pipe(duplex=False)
        from_worker, results = self.context.Pipe(duplex=False)
        process = self.context.Process(target=_serve, daemon=True, name=f"vlbert-extract-decoder-{position}",
                                       args=(self.decode, tasks, results, self.decoding, position,
                                             os.getpid()))
        process.start()
        # Only the worker holds its ends, so its death is an end of file here.
        tasks.close()
        results.close()
        return _Worker(process, to_worker, from_worker)

    def results(self) -> Iterator[tuple[Any, Any, str | None]]:
        done: dict[int, tuple[Any, str | None]] = {}
        items, taken, index = iter(self.items), 0, 0
        while True:
            while taken < index + self.depth and (item := next(items, _END)) is not _END:
                self.sent[taken] = item
                self._send(min(self.workers, key=lambda w: len(w.unanswered)), taken)
                taken += 1
            if index == taken:
                return
            while index not in done:
                self._collect(done)
            yield (self.sent.pop(index), *done.pop(index))
            index += 1

    def _send(self, worker: _Worker, index: int) -> None:
        worker.unanswered.append(index)
        try:
            worker.tasks.send((index, self.sent[index]))
        except OSError:
            pass  # the worker has died: `_collect` hands its unanswered items to a fresh one

    def _collect(self, done: dict[int, tuple[Any, str | None]]) -> None:
        """Waits for answers or a worker's death; the item a dead worker was decoding fails, a
        fresh worker takes over the others it had not answered."""
        wait([w.results for w in self.workers] + [w.process.sentinel for w in self.workers])
        for position, worker in enumerate(self.workers):
            self._receive(worker, done)
            if worker.process.exitcode is None:
                continue
            crashed = self.decoding[position]
            self._close(worker)
            replacement = self.workers[position] = self._start(position)
            for index in worker.unanswered:
                if index == crashed:
                    done[index] = (None, f"worker crashed while decoding: {self.sent[index].file} "
                                         f"({_exit_description(worker.process.exitcode)})")
                else:
                    self._send(replacement, index)

    @staticmethod
    def _receive(worker: _Worker, done: dict[int, tuple[Any, str | None]]) -> None:
        try:
            while worker.results.poll():
                index, decoded, error = pickle.loads(worker.results.recv_bytes())
                worker.unanswered.remove(index)
                done[index] = (decoded, error)
        except (EOFError, OSError):
            pass  # the worker died; what it sent in full is in `done`

    def close(self) -> None:
        """Stops every worker: an idle one when told, one with items still unanswered (the
        consumer stopped early) at once."""
        for worker in self.workers:
            if worker.unanswered:
                worker.process.kill()
            else:
                try:
                    worker.tasks.send(None)
                except OSError:
                    pass  # already gone
        for worker in self.workers:
            worker.process.join()
            self._close(worker)
        self.workers = []

    @staticmethod
    def _close(worker: _Worker) -> None:
        worker.tasks.close()
        worker.results.close()


def _serve(decode: Callable[[Any], Any], tasks: Connection, results: Connection, decoding: memoryview,
           position: int, parent: int) -> None:
    """A worker's loop: decode the items asked for, one at a time, until told to stop. A sender
    thread writes the answers, so that a full pipe (the job busy computing) does not stop decoding."""
    _exit_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the job, which stops the workers
    torch.set_num_threads(1)  # forked OpenMP thread pools hang; `--workers` sets the parallelism
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    sender = threading.Thread(target=_send_answers, args=(outbox, results), daemon=True)
    sender.start()
    while True:
        while not tasks.poll(IDLE_CHECK_SECONDS):
            if os.getppid() != parent:
                return
        task = tasks.recv()
        if task is None:
            break
        index, item = task
        decoding[position] = index
        try:
            answer = pickle.dumps((index, decode(item), None), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - one bad image is a failure, the job goes on
            answer = pickle.dumps((index, None, failure_reason(exc)))
        decoding[position] = IDLE
        outbox.put(answer)
    outbox.put(None)
    sender.join()


def _send_answers(outbox: queue.SimpleQueue, results: Connection) -> None:
    while (answer := outbox.get()) is not None:
        results.send_bytes(answer)


def _exit_with_parent(parent: int) -> None:
    """On Linux the kernel kills this worker when the job dies, `kill -9` included, so no orphan
    holds the store's shard lock when the job is run again."""
    if _PRCTL is not None:  # elsewhere the idle loop's parent check ends the worker
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def _exit_description(exitcode: int) -> str:
    if exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    return f"exit status {exitcode}"
