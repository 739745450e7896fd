"""Few sequence shapes, and a compiled step: a stage's `compile: true` runs its model's forward and its
task's losses through torch.compile as one graph (for every task on cached features; an end-to-end
stage's detector runs eager before it), in torch's `compile_mode` ("reduce-overhead": the graph's
forward and backward replayed as CUDA graphs, one launch each, for steps bound by launching kernels),
on batches whose text and RoIs are padded to a multiple of BATCH_LENGTH_MULTIPLE. With it or
`length_buckets: true`, the encoder rounds sequence lengths up to a multiple of LENGTH_MULTIPLE
elements, so that batches of any length share a few shapes (each new shape costs a compilation, or
on CUDA a cuDNN attention plan or a CUDA graph: length-aware batches without the rounding ran slower
than without buckets on an H200). Checked before anything trains: where torch cannot compile on the
device (no compiler, no Triton, a Python torch does not support), the run is refused in one line.
"""

from __future__ import annotations

from typing import Callable

import torch

LENGTH_MULTIPLE = 16
# A compiled stage's batches pad their text and their RoIs to a multiple of this many, so that the
# compiled graph's inputs come in few shapes too (each new one costs a recompilation or a CUDA graph)
BATCH_LENGTH_MULTIPLE = 8
# torch.compile's modes, the stage's `compile_mode` values
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_problem(device: torch.device) -> str | None:
    """Why torch cannot compile on `device` here, or None: a small function compiled and run there."""
    try:
        probe = torch.compile(lambda x: torch.relu(x) * 2.0, fullgraph=True)
        probe(torch.ones(4, device=device))
    except Exception as exc:  # whatever stops compilation is the answer, given in the refusal
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"torch {torch.__version__} cannot compile on {device.type} here ({reason})"
    return None


def compiled_step(losses: Callable[[dict], dict[str, torch.Tensor]], mode: str) -> Callable[[dict], dict]:
    """`losses` (a batch's inputs → its loss tensors) through torch.compile in `mode`. Each call starts
    a new step for CUDA graphs: the previous call's outputs are not read after its backward."""
    compiled = torch.compile(losses, mode=mode)

    def step(inputs: dict) -> dict[str, torch.Tensor]:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(inputs)

    return step
