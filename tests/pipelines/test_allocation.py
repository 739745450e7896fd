"""The local scheduler's allocation (pipelines/executors/allocation.py), a pure function: which ready
launches start, with how many threads and which GPUs, from what runs and what is free; and the way
each launch starts (pipelines/executors/launchers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.execution import Step
from pipelines.executors.allocation import Demand, Limits, Start, allocate
from pipelines.executors.launchers import Task, Way, way_of
from pipelines.steps.base import Layout


def heavy(name: str, processes: int = 1, gpus: int = 0, threads: int | None = None) -> Demand:
    return Demand(name, processes, gpus, light=False, threads=threads)


def light(name: str) -> Demand:
    return Demand(name, 1, 0, light=True)


# (ready, running, free cores, free GPUs, limits) -> starts: (name, threads, GPUs, cores held)
CASES = {
    "the free cores shared among the heavy steps starting":
        (([heavy("a"), heavy("b")], 0, 4, [], Limits(4)),
         [("a", 2, (), 2), ("b", 2, (), 2)]),
    "a share rounds down, each process at least one thread":
        (([heavy("a"), heavy("b"), heavy("c")], 0, 4, [], Limits(4)),
         [("a", 1, (), 1), ("b", 1, (), 1), ("c", 1, (), 1)]),
    "a DDP step's processes each take their share":
        (([heavy("ddp", processes=2)], 0, 6, [], Limits(6)),
         [("ddp", 3, (), 6)]),
    "jobs=1: one launch at once":
        (([heavy("a"), heavy("b")], 0, 4, [], Limits(4, jobs=1)),
         [("a", 4, (), 4)]),
    "jobs counts what runs":
        (([heavy("a"), heavy("b")], 1, 3, [], Limits(4, jobs=2)),
         [("a", 3, (), 3)]),
    "jobs reached: nothing starts":
        (([heavy("a")], 2, 2, [], Limits(4, jobs=2)),
         []),
    "a light step: one thread, no core held":
        (([light("world"), heavy("cache")], 0, 2, [], Limits(2)),
         [("world", 1, (), 0), ("cache", 2, (), 2)]),
    "a light step starts where no core is free":
        (([light("world")], 1, 0, [], Limits(2)),
         [("world", 1, (), 0)]),
    "but not while what runs holds more cores than the machine has":
        (([light("world")], 1, -1, [], Limits(2)),
         []),
    "a heavy step waits while no core is free":
        (([heavy("a")], 1, 0, [], Limits(2)),
         []),
    "more than the machine has starts alone":
        (([heavy("ddp", processes=4)], 0, 2, [], Limits(2)),
         [("ddp", 1, (), 4)]),
    "a GPU per process, each GPU given once":
        (([heavy("a", gpus=1), heavy("b", gpus=1)], 0, 4, ["0", "1"], Limits(4)),
         [("a", 2, ("0",), 2), ("b", 2, ("1",), 2)]),
    "a step that finds no free GPU is passed over for those after it":
        (([heavy("a", gpus=1), heavy("b", gpus=1), heavy("c")], 0, 4, ["0"], Limits(4)),
         [("a", 2, ("0",), 2), ("c", 2, (), 2)]),
    "a GPU step alone starts with the GPUs there are":
        (([heavy("ddp", processes=2, gpus=2)], 0, 4, ["1"], Limits(4)),
         [("ddp", 2, ("1",), 4)]),
    "threads fixed claim their cores: the second waits":
        (([heavy("a"), heavy("b")], 0, 3, [], Limits(3, threads=2)),
         [("a", 2, (), 2)]),
    "threads fixed win over the share":
        (([heavy("a"), light("world")], 0, 8, [], Limits(8, threads=3)),
         [("a", 3, (), 3), ("world", 3, (), 0)]),
    "a resumed step keeps its threads":
        (([heavy("resumed", threads=3), heavy("b")], 0, 8, [], Limits(8)),
         [("resumed", 3, (), 3), ("b", 3, (), 3)]),
    "OMP_NUM_THREADS bounds the share":
        (([heavy("a")], 0, 8, [], Limits(8, most_threads=2)),
         [("a", 2, (), 2)]),
    "without OMP_NUM_THREADS, the machine's cores bound it":
        (([heavy("a")], 1, 8, [], Limits(4)),
         [("a", 4, (), 4)]),
}


@pytest.mark.parametrize("given, expected", CASES.values(), ids=CASES.keys())
def test_allocation_starts_what_fits_with_its_threads_and_gpus(given, expected):
    ready, running, free_cores, free_gpus, limits = given
    assert allocate(ready, running, free_cores, free_gpus, limits) == [Start(*start) for start in expected]


def task(kind: str, ranks: int = 1, shard: int | None = None) -> Task:
    return Task(Step("step", kind, Path("step"), {}, {}, Layout(ranks=ranks)), shard)


@pytest.mark.parametrize("launch, inline, way", [
    (task("train"), True, Way.INLINE),
    (task("world"), True, Way.INLINE),  # jobs=1: a light step runs here too
    (task("train"), False, Way.FORKED),
    (task("world"), False, Way.COMMAND),
    (task("train", ranks=2), True, Way.COMMAND),  # torch's launcher, even with jobs=1
    (task("extract", shard=0), True, Way.FORKED),  # a shard is never run here
    (task("world", shard=1), False, Way.COMMAND),
])
def test_each_launch_starts_the_way_its_processes_and_kind_say(launch, inline, way):
    assert way_of(launch, inline) is way
