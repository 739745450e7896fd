"""Numeric precisions by name: the detector's forwards (`Detector.build(precision=...)`) and a
training stage's steps (`precision:` in a run config, which adds fp16 with loss scaling).

Only the networks (trunk, RPN head, res5, box and attribute heads) change precision: RoI
pooling, box decoding, NMS, box selection and every softmax run in float32 in each of them.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from vlbert.utils.errors import UserError

if TYPE_CHECKING:
    import torch


class PrecisionError(UserError):
    """A precision that does not exist, or that the detector's device cannot run."""


@dataclass(frozen=True)
class Precision:
    name: str
    summary: str
    autocast: str | None = None  # networks run under autocast to this torch dtype
    tf32: bool = False  # CUDA matmuls and convolutions in TensorFloat-32 (CUDA only)
    loss_scaling: bool = False  # training scales the loss (float16's range is too narrow for gradients)

    def check(self, device: torch.device) -> None:
        import torch  # here, not at the top: the precisions' names are read by `vlbert extract --help`

        if self.tf32 and device.type != "cuda":
            raise PrecisionError(f"precision {self.name}: TensorFloat-32 exists on CUDA devices only, "
                                 f"not on {device}; use fp32 or bf16")
        if self.autocast == "float16" and device.type != "cuda":
            raise PrecisionError(f"precision {self.name}: float16 autocast runs on CUDA devices only, "
                                 f"not on {device}; use fp32 or bf16")
        if self.autocast == "bfloat16" and device.type == "cuda":
            # The GPU asked for, natively: older ones emulate bfloat16 at a fraction of fp32's speed.
            major, minor = torch.cuda.get_device_capability(device)
            if major < 8:
                raise PrecisionError(f"precision {self.name}: {torch.cuda.get_device_name(device)} (compute capability "
                                     f"{major}.{minor}) has no native bfloat16, which needs 8.0 (Ampere) or later; "
                                     "use tf32 or fp32")

    @contextmanager
    def applied(self, device: torch.device) -> Iterator[None]:
        """Runs a forward in this precision; global settings are restored on exit."""
        import torch

        self.check(device)
        with self.float32_math(device):
            with torch.autocast(device.type, dtype=getattr(torch, self.autocast)) if self.autocast else nullcontext():
                yield

    def float32_math(self, device: torch.device):
        """float32 matmuls and convolutions as this precision has them (TF32 or IEEE on CUDA): a
        backward pass runs outside autocast but must keep the forward's float32 arithmetic."""
        return _cuda_fp32_math("tf32" if self.tf32 else "ieee") if device.type == "cuda" else nullcontext()


@contextmanager
def _cuda_fp32_math(mode: str) -> Iterator[None]:
    """float32 matmuls and cuDNN convolutions in `mode` ("ieee" or "tf32"). cuDNN convolutions
    default to TF32, so fp32 must switch it off to be float32."""
    import torch

    settings = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    saved = [s.fp32_precision for s in settings]
    try:
        for s in settings:
            s.fp32_precision = mode
        yield
    finally:
        for s, value in zip(settings, saved):
            s.fp32_precision = value


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "float32 throughout (TF32 off on CUDA): the reference numbers"),
    Precision("tf32", "CUDA only: float32 tensors, matmuls and convolutions in TensorFloat-32", tf32=True),
    Precision("bf16", "networks under bfloat16 autocast; pooling, box decoding, selection and softmax in float32",
              autocast="bfloat16"),
)}
# Training adds float16 autocast with a gradient scaler (GPUs without bfloat16, before Ampere).
TRAINING_PRECISIONS: dict[str, Precision] = {**PRECISIONS, "fp16": Precision(
    "fp16", "CUDA only: networks under float16 autocast, the loss scaled against underflow",
    autocast="float16", loss_scaling=True)}


AUTO = "auto"  # a training stage's precision: bf16 where its device computes it natively, else fp32


def resolved_precision(name: str, device: torch.device) -> str:
    """`auto` as `device` takes it: bf16 on a CUDA GPU with native bfloat16 (compute capability 8.0,
    Ampere, or later), fp32 elsewhere and on the CPU; any other name as it is. The resolved name is
    what a run records: it decides the run's numbers."""
    if name != AUTO:
        return name
    import torch

    native = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
    return "bf16" if native else "fp32"


def precision(name: str, known: dict[str, Precision] = PRECISIONS) -> Precision:
    if name not in known:
        raise PrecisionError(f"precision {name!r}: expected one of {', '.join(known)}")
    return known[name]
