"""The host's reads of tensor values in code run on the CPU: each one would make the host wait for a
GPU (a "host sync"), so that it could not queue the next step's work while the device computes.

On the CPU nothing waits, so they are found by what they are: the aten ops that hand a value to the
host or whose output shape depends on the values (`item`, `bool(t)`, `nonzero`, `masked_select`,
indexing by a boolean mask, ...), seen by a TorchDispatchMode, and the Tensor methods that read
values without an aten op on a CPU tensor (`tolist`, `numpy`, `cpu`), patched for the block.
"""

from __future__ import annotations

import contextlib
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[2]
# Ops whose result the host needs before it can go on: a value (item, bool, int, float) or a shape.
READING_OPS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten._unique2, aten.unique_dim,
               aten.unique_consecutive, aten.repeat_interleave}
INDEXING_OPS = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}  # by a boolean mask: nonzero
READING_METHODS = ("tolist", "numpy", "cpu")
# torch's foreach and for-loop optimisers keep their step counts in CPU tensors on every device
# (`capturable=False`) and read them there, which waits for nothing; CUDA stages use the fused kernel,
# whose counts stay on the device and are not read.
HOST_STEP_COUNTS = "/torch/optim/"


class HostReads(TorchDispatchMode):
    """Inside `counting()`, every host read, as (what, where: the innermost project frame)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, str]] = []
        self.active = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.active:
            if func.overloadpacket in READING_OPS:
                self._read(str(func.overloadpacket.__name__))
            elif func.overloadpacket in INDEXING_OPS and _boolean_index(args):
                self._read(f"{func.overloadpacket.__name__} by a boolean mask")
        return func(*args, **kwargs)

    def _read(self, what: str) -> None:
        stack = traceback.extract_stack()[:-2]
        if any(HOST_STEP_COUNTS in f.filename for f in stack):
            return
        frames = [f for f in stack if f.filename.startswith(str(ROOT)) and "/tests/" not in f.filename]
        where = f"{Path(frames[-1].filename).relative_to(ROOT)}:{frames[-1].lineno}" if frames else "?"
        self.reads.append((what, where))

    @contextlib.contextmanager
    def counting(self, active: bool = True):
        """Counts the block's reads; with `active` False none of them (the host's own work on a batch
        before it goes to the device)."""
        self.active, before = active, self.active
        try:
            yield
        finally:
            self.active = before

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        """The mode, and the patched Tensor methods, for the block (reads counted inside `counting`)."""
        for name in READING_METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._method(getattr(torch.Tensor, name), name))
        with self:
            yield self

    def _method(self, original, name: str):
        def method(tensor, *args, **kwargs):
            if self.active:
                self._read(f"Tensor.{name}")
            return original(tensor, *args, **kwargs)

        return method


def _boolean_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
