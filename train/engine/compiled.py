"""A stage's `compile: true`: its model's encoders run through torch.compile, sequence lengths
rounded up to a multiple of LENGTH_MULTIPLE elements, so that batches of any length (length-aware
ones vary) share a few compiled shapes. Checked before anything trains: where torch cannot compile
on the device (no compiler, no Triton, a Python torch does not support), the run is refused in one line.
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


def compile_encoders(model: nn.Module) -> int:
    """Compiles every VL-BERT encoder in `model`; returns how many."""
    encoders = [module for module in model.modules() if isinstance(module, VLBertEncoder)]
    for encoder in encoders:
        encoder.run_compiled(LENGTH_MULTIPLE)
    return len(encoders)
