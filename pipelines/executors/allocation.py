"""Which ready launches the local scheduler starts now, and with how many threads and which GPUs: a
pure function of what is ready, what runs and what the machine has left (no I/O, no clock).

- At most `jobs` launches run at once; the ready ones are taken in order, and one that does not fit
  is passed over for those after it.
- A launch fits when the free cores hold a core per process and thread (threads fixed by `threads`
  or by a resumed step's own, else one) and the free GPUs a GPU per process of a GPU step. A light
  step (`StepKind.light`) runs with one thread and counts for no core. What starts alone (nothing
  runs, nothing else starts) starts even where it asks for more than the machine has.
- The cores still free are then shared among the heavy launches starting: each process is offered
  one thread and its share of them, at most OMP_NUM_THREADS (where set) or the machine's cores;
  `threads` and a resumed step's own threads win over that share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Demand:
    """What a ready launch asks for."""

    name: str  # the launch's name (the step's, with its shard): what its Start names
    processes: int
    gpus: int  # GPUs it takes, one per process of a GPU step where GPUs are given; else 0
    light: bool
    threads: int | None = None  # the threads a resumed step started with: it keeps them


@dataclass(frozen=True)
class Limits:
    """What bounds the starts, whatever runs."""

    cores: int  # the machine's cores given to this run
    jobs: int | None = None  # launches at once; None: no bound
    threads: int | None = None  # `threads`: every process's thread count
    most_threads: int | None = None  # OMP_NUM_THREADS, where set: the most threads a process is offered


@dataclass(frozen=True)
class Start:
    """A launch to start now."""

    name: str
    threads: int  # per process
    gpus: tuple[str, ...]
    cores: int  # the cores it holds while it runs


def allocate(ready: Sequence[Demand], running: int, free_cores: int, free_gpus: Sequence[str],
             limits: Limits) -> list[Start]:
    """The launches of `ready` (in its order) to start beside `running` launches, with `free_cores`
    (below 0 where what runs holds more than the machine has) and `free_gpus` left (the module's rules)."""
    starting: list[tuple[Demand, tuple[str, ...]]] = []
    free_gpus = tuple(free_gpus)
    for demand in ready:
        if limits.jobs is not None and running + len(starting) >= limits.jobs:
            break
        fits_alone = not running and not starting  # more than the machine has still runs, alone
        # Threads fixed (`threads`, or those a resumed step started with) claim their cores: two
        # 2-thread steps on 2 cores would spin-wait on each other's cores, many times slower.
        cores = 0 if demand.light else demand.processes * (demand.threads or limits.threads or 1)
        if (cores > free_cores or demand.gpus > len(free_gpus)) and not fits_alone:
            continue
        starting.append((demand, free_gpus[:demand.gpus]))
        free_gpus = free_gpus[demand.gpus:]
        free_cores -= cores
    heavy = sum(demand.processes for demand, _ in starting if not demand.light)
    starts = []
    for demand, gpus in starting:
        offered = limits.threads or (1 if demand.light else min(1 + max(free_cores, 0) // heavy,
                                                                limits.most_threads or limits.cores))
        threads = demand.threads or offered
        starts.append(Start(demand.name, threads, gpus, 0 if demand.light else demand.processes * threads))
    return starts
