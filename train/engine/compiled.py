"""Few sequence shapes, and a compiled encoder: a stage's `compile: true` runs its model's encoders
through torch.compile; with it or `length_buckets: true`, sequence lengths are rounded up to a
multiple of LENGTH_MULTIPLE elements, so that batches of any length share a few shapes (each new
shape costs a compilation, or on CUDA a cuDNN attention plan: length-aware batches without the
rounding ran slower than without buckets on an H200). Checked before anything trains: where torch
cannot compile on the device (no compiler, no Triton, a Python torch does not support), the run is
refused in one line.
"""

from __future__ import annotations

import torch
from torch import nn

from vlbert.modeling import VLBertEncoder

LENGTH_MULTIPLE = 16


def compile_problem(device: torch.device) -> str | None:
    """Why torch cannot compile on `device` here, or None: a small function compiled and run there."""
    try:
        probe = torch.compile(lambda x: torch.relu(x) * 2.0, fullgraph=True)
        probe(torch.ones(4, device=device))
    except Exception as exc:  # whatever stops compilation is the answer, given in the refusal
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"torch {torch.__version__} cannot compile on {device.type} here ({reason})"
    return None


def few_shapes(model: nn.Module, compiled: bool) -> None:
    """Every VL-BERT encoder of `model` rounding its sequence lengths, and with `compiled`, compiled."""
    for encoder in (module for module in model.modules() if isinstance(module, VLBertEncoder)):
        encoder.length_multiple = LENGTH_MULTIPLE
        if compiled:
            encoder.run_compiled()
