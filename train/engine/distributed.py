"""The processes of a training run: the process group, bound to each rank's GPU, and the few
collectives the trainer needs (agreeing on a flag, gathering objects to rank 0).

Under torchrun every process reads RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; a plain
`python` run is rank 0 of 1. Each rank trains on its own GPU, cuda:LOCAL_RANK
(`vlbert.utils.device.rank_device`): without that, every rank would put its model on cuda:0 and NCCL
refuses two ranks on one GPU. The process group lives as long as the run (`process_group`).

The ranks of a Slurm job meet where Slurm says (`rendezvous`): rank 0 asks Slurm for its node's
address (`NodeAddr`: node names need not resolve as host names), listens on a port the system gives
it (so two jobs on one node never take the same one) and writes both into a file on the shared file
system that the job's executor names (RENDEZVOUS_VARIABLE); the other ranks read it and connect.
Either side waits at most RENDEZVOUS_TIMEOUT_S, then fails in one line naming address, port and node.
A collective waits at most COLLECTIVE_TIMEOUT_S for a rank that stopped answering; a rank that died
closes its connections, and the others' collectives fail at once.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from vlbert.utils import step_environment
from vlbert.utils.atomic import write_atomically
from vlbert.utils.device import launcher_variable
from vlbert.utils.errors import FAILED, UserError

RENDEZVOUS_VARIABLE = step_environment.RENDEZVOUS  # the file in which rank 0 says where the ranks meet
NODE_VARIABLE = "SLURMD_NODENAME"  # the Slurm node a process runs on, as Slurm names it
RENDEZVOUS_TIMEOUT_S = 300
# Longer than Slurm's default SlurmdTimeout (300 s): a node that stops answering is found lost by
# Slurm, which requeues the job, before a collective gives up on it.
COLLECTIVE_TIMEOUT_S = 600
POLL_S = 0.2
_JOINED = "vlbert/joined"  # in the rendezvous store: how many ranks but rank 0 have come

# DDP's setting for no broadcast of buffers before each forward: torch 2.14 names it forward_sync_buffers
# and deprecates broadcast_buffers. The new one still broadcasts rank 0's buffers once, when DDP wraps
# the model: the same values, since every rank loaded the same ones.
NO_BUFFER_BROADCASTS = ({"forward_sync_buffers": False}
                        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                        else {"broadcast_buffers": False})


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> World:
        size = launcher_variable(env, "WORLD_SIZE", 1)
        return cls(launcher_variable(env, "RANK", 0), size, launcher_variable(env, "LOCAL_RANK", 0),
                   launcher_variable(env, "LOCAL_WORLD_SIZE", size))

    @property
    def distributed(self) -> bool:
        return self.size > 1


class RendezvousError(UserError):
    """The ranks of a job could not meet: the message names the address, the port and the node."""

    exit_status = FAILED


@contextmanager
def process_group(world: World, device: torch.device) -> Iterator[None]:
    """The process group of a distributed `world` for the block: NCCL bound to this rank's GPU (the
    current device already: `vlbert.utils.device.use_device`) on CUDA, gloo on the CPU; met through the
    `rendezvous` file where the executor names one (RENDEZVOUS_VARIABLE), else through the launcher's
    variables (MASTER_ADDR, MASTER_PORT); ended after the block, also on an error, unless it was
    running before."""
    started = world.distributed and not dist.is_initialized()
    if started:
        met = os.environ.get(RENDEZVOUS_VARIABLE)
        meeting = {"store": rendezvous(world, Path(met)), "rank": world.rank, "world_size": world.size} if met else {}
        timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device, timeout=timeout, **meeting)
        else:
            dist.init_process_group("gloo", timeout=timeout, **meeting)
        if met and world.rank == 0:
            Path(met).unlink(missing_ok=True)  # every rank has read it: they all joined the store
    try:
        yield
    finally:
        if started:
            dist.destroy_process_group()


def rendezvous(world: World, file: Path, timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> dist.TCPStore:
    """The store the ranks meet at: rank 0's, on its node's address (Slurm's NodeAddr; outside Slurm,
    its host name) and a port the system picked, which rank 0 writes into `file` and every other rank
    reads there. RendezvousError when, within `timeout_s`, the file does not come, its store cannot be
    reached, or (on rank 0) not every rank joins."""
    deadline = time.monotonic() + timeout_s
    if world.rank == 0:
        node = os.environ.get(NODE_VARIABLE, "")
        address = node_address(node) if node else socket.gethostname()
        store = dist.TCPStore(address, 0, world.size, True, timeout=timedelta(seconds=timeout_s),
                              wait_for_workers=False)
        write_atomically(file, json.dumps({"address": address, "port": store.port, "node": node}))
        while (joined := store.add(_JOINED, 0)) < world.size - 1:
            if time.monotonic() > deadline:
                raise RendezvousError(f"rendezvous at {address}:{store.port} (node {node or address}): {joined} of the "
                                      f"{world.size - 1} other ranks came within {timeout_s:g} s")
            time.sleep(POLL_S)
        return store
    met = _meeting_place(file, deadline, timeout_s)
    where = f"rendezvous at {met['address']}:{met['port']} (rank 0's node {met['node'] or met['address']})"
    _reach(met["address"], met["port"], deadline, f"{where}: not reached from {_this_rank(world)} in {timeout_s:g} s")
    try:
        store = dist.TCPStore(met["address"], met["port"], world.size, False,
                              timeout=timedelta(seconds=max(deadline - time.monotonic(), 1)))
        store.add(_JOINED, 1)
    except dist.DistError as exc:
        raise RendezvousError(f"{where}: {_this_rank(world)} could not join it ({str(exc).splitlines()[0]})") from None
    return store


def node_address(node: str) -> str:
    """The address Slurm reaches `node` at (its NodeAddr, which may differ from its name)."""
    try:
        shown = subprocess.run(["scontrol", "show", "node", "--oneliner", node], capture_output=True, text=True,
                               timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RendezvousError(f"node {node}: cannot ask Slurm for its address (scontrol: {exc})") from None
    fields = dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)
    if shown.returncode != 0 or not fields.get("NodeAddr"):
        raise RendezvousError(f"node {node}: Slurm gives no address for it (scontrol show node: "
                              f"{shown.stderr.strip() or shown.stdout.strip() or 'no NodeAddr'})")
    return fields["NodeAddr"]


def _meeting_place(file: Path, deadline: float, timeout_s: float) -> dict[str, Any]:
    """What rank 0 wrote into `file`, once it is there."""
    while True:
        try:
            return json.loads(file.read_text())
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise RendezvousError(f"{file}: rank 0 did not say where the ranks meet within {timeout_s:g} s "
                                      "(did it start? is this folder on a file system every node shares?)") from None
            time.sleep(POLL_S)


def _reach(address: str, port: int, deadline: float, failure: str) -> None:
    """Returns once a connection to address:port opens; RendezvousError `failure` (with the last
    reason) after `deadline`."""
    while True:
        try:
            socket.create_connection((address, port), timeout=max(min(5.0, deadline - time.monotonic()), 0.1)).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RendezvousError(f"{failure} ({exc.strerror or exc})") from None
            time.sleep(POLL_S)


def _this_rank(world: World) -> str:
    node = os.environ.get(NODE_VARIABLE)
    return f"rank {world.rank}" + (f" on node {node}" if node else "")


def placement(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Where this process runs: its host, and the Slurm node where Slurm started it."""
    node = env.get(NODE_VARIABLE)
    return {"host": socket.gethostname(), **({"node": node} if node else {})}


def from_rank_zero(value: Any, world: World) -> Any:
    """Rank 0's `value` on every rank."""
    if not world.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(flag: bool, world: World, device: torch.device) -> bool:
    """True on every rank when `flag` is true on any, so that ranks take the same branch."""
    if not world.distributed:
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def gathered(value: Any, world: World) -> list[Any] | None:
    """Every rank's `value` on rank 0, in rank order; None on the other ranks."""
    if not world.distributed:
        return [value]
    values = [None] * world.size if world.rank == 0 else None
    dist.gather_object(value, values, dst=0)
    return values


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()
