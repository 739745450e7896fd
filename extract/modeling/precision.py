"""Numeric precisions the detector's forwards can run in, by name (`Detector.build(precision=...)`).

Only the networks (trunk, RPN head, res5, box and attribute heads) change precision: RoI
pooling, box decoding, NMS, box selection and every softmax run in float32 in each of them.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from extract.config import ConfigError


class PrecisionError(ConfigError):
    """A precision that does not exist, or that the detector's device cannot run."""


@dataclass(frozen=True)
class Precision:
    name: str
    summary: str
    autocast: torch.dtype | None = None  # networks run under autocast to this dtype
    tf32: bool = False  # CUDA matmuls and convolutions in TensorFloat-32 (CUDA only)

    def check(self, device: torch.device) -> None:
        if self.tf32 and device.type != "cuda":
            raise PrecisionError(f"precision {self.name}: TensorFloat-32 exists on CUDA devices only, "
                                 f"not on {device}; use fp32 or bf16")

    @contextmanager
    def applied(self, device: torch.device) -> Iterator[None]:
        """Runs a forward in this precision; global settings are restored on exit."""
        self.check(device)
        with ExitStack() as stack:
            if device.type == "cuda":
                stack.enter_context(_cuda_fp32_math("tf32" if self.tf32 else "ieee"))
            if self.autocast is not None:
                stack.enter_context(torch.autocast(device.type, dtype=self.autocast))
            yield


@contextmanager
def _cuda_fp32_math(mode: str) -> Iterator[None]:
    """float32 matmuls and cuDNN convolutions in `mode` ("ieee" or "tf32"). cuDNN convolutions
    default to TF32, so fp32 must switch it off to be float32."""
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
              autocast=torch.bfloat16),
)}


def precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise PrecisionError(f"precision {name!r}: expected one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]
