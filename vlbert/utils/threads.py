"""How many threads torch computes with on the CPU, by default one; and extraction's compute lanes.

Why one: torch's intra-op pool (OpenMP) splits each op over its threads and waits for all of them
at the op's end, and a thread that finished spins while it waits. With a busy neighbour on a
2-core machine, every op then waits for the thread that lost its core, for a scheduler time
slice, and the spinning thread holds the core the other needs: the demo extraction fell from
39 to 1–2 images/s. One thread has no such wait. (OMP_WAIT_POLICY and GOMP_SPINCOUNT would stop
the spinning too, but libgomp reads them when torch is imported, before any code of ours runs: they
are the user's to set, like OMP_NUM_THREADS.)

Extraction on the CPU still uses every core: each of its `lanes` threads computes a whole batch
with single-threaded ops, so there is no op-end barrier to wait at, a busy neighbour costs only the
core it takes, and every number is the same whatever the lane count. Training's other work
(DataLoader workers) runs on the other cores. bench/bench_contention.py measures both beside a busy
neighbour (figures: docs/results.md, "Busy machines").

A user's choice wins: a count given explicitly (`vlbert extract --threads`), else OMP_NUM_THREADS
when it is set (which then also overrides a count the process set before). In training, and in
extraction on a GPU, the count is torch's; more than one thread changes the last bits of some
results (the bilinear resize rounds differently).
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Mapping

import torch

from vlbert.utils.errors import UserError

DEFAULT_THREADS = 1
MAX_DEFAULT_LANES = 4  # each lane holds a batch's activations (BUTD: ~1 GB for 8 images)
USER_VARIABLE = "OMP_NUM_THREADS"


class ThreadsError(UserError):
    """A thread count from the environment that is no positive number."""


def thread_count(threads: int | None = None, env: Mapping[str, str] = os.environ,
                 default: int = DEFAULT_THREADS) -> int:
    """`threads` when given, else OMP_NUM_THREADS when set (its first number: OpenMP allows one per
    nesting level), else `default`."""
    if threads is not None:
        return threads
    value = env.get(USER_VARIABLE, "").strip()
    if not value:
        return default
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ThreadsError(f"{USER_VARIABLE}={value!r}: expected a positive number of threads")
    return int(first)


@contextmanager
def configured_threads(threads: int | None = None, env: Mapping[str, str] = os.environ) -> Iterator[int]:
    """torch's intra-op thread count set to `thread_count` while the block runs, restored after it
    (so that a command run in-process, e.g. by a test, leaves the caller's setting alone); yields it."""
    count, before = thread_count(threads, env), torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)


def lane_count(threads: int | None = None, env: Mapping[str, str] = os.environ) -> int:
    """Extraction's compute lanes on the CPU: `thread_count`, by default the cores this process may
    use, at most MAX_DEFAULT_LANES."""
    return thread_count(threads, env, default=min(len(os.sched_getaffinity(0)), MAX_DEFAULT_LANES))


class ComputeLanes:
    """`compute(batch)` on up to `lanes` threads at once, each set up by `start_lane` (by default: torch
    ops single-threaded); results reach `deliver(result, note)` in submission order, at most `lanes`
    batches in flight. One lane computes in the calling thread. An error is raised from the `submit`
    or `finish` that meets it; leaving the block waits for the lanes and drops what they computed
    after it."""

    def __init__(self, compute: Callable[[Any], Any], lanes: int, deliver: Callable[[Any, Any], None],
                 start_lane: Callable[[], None] = partial(torch.set_num_threads, 1)) -> None:
        self.compute, self.lanes, self.deliver = compute, lanes, deliver
        self.pending: deque[tuple[Future, Any]] = deque()
        self.executor = ThreadPoolExecutor(lanes, thread_name_prefix="compute",
                                           initializer=start_lane) if lanes > 1 else None

    def submit(self, batch: Any, note: Any) -> None:
        """Computes `batch` on a free lane; `note` goes to `deliver` with its result."""
        if self.executor is None:
            self.deliver(self.compute(batch), note)
            return
        self.pending.append((self.executor.submit(self.compute, batch), note))
        while len(self.pending) >= self.lanes:
            self._deliver_oldest()

    def finish(self) -> None:
        while self.pending:
            self._deliver_oldest()

    def _deliver_oldest(self) -> None:
        future, note = self.pending[0]
        result = future.result()
        self.pending.popleft()
        self.deliver(result, note)

    def __enter__(self) -> "ComputeLanes":
        return self

    def __exit__(self, *exc_info) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)


def cuda_lane(device: torch.device, threads: int) -> Callable[[], None]:
    """A GPU lane's set-up (ComputeLanes' `start_lane`): torch's host-side threads as the job's, the
    job's device (`device` with its index: a new thread's current device is the first), and a CUDA
    stream of its own, so that one lane's kernels run while another lane's host works or waits."""
    def start() -> None:
        torch.set_num_threads(threads)
        torch.cuda.set_device(device)
        torch.cuda.set_stream(torch.cuda.Stream(device))

    return start
