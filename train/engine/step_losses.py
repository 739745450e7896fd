"""Each optimiser step's losses, kept on the device until the stage's logging interval (`log_every`)
and then brought to the host in one copy: a copy every step would make the host wait for the device
each step, so it could never queue the next step's work while the device computes this one."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.profiler import record_function


@dataclass
class StepLosses:
    step: int
    lr: float  # the learning rate the step applied
    losses: dict[str, float]
    damaged_skipped: int  # damaged records the step left out

    @property
    def finite(self) -> bool:
        return math.isfinite(self.losses["loss"])


class PendingLosses:
    """The losses of the steps since the last interval, as device tensors."""

    def __init__(self) -> None:
        self._steps: list[tuple[int, float, dict[str, torch.Tensor], int]] = []

    def add(self, step: int, lr: float, losses: dict[str, torch.Tensor], damaged_skipped: int) -> None:
        self._steps.append((step, lr, {name: value.detach() for name, value in losses.items()}, damaged_skipped))

    def __len__(self) -> int:
        return len(self._steps)

    def to_host(self) -> list[StepLosses]:
        """The pending steps' losses as floats (one device-to-host copy), in step order; none pending after."""
        if not self._steps:
            return []
        with record_function("losses to host"):
            values = torch.stack([torch.stack([v.float() for v in losses.values()])
                                  for _, _, losses, _ in self._steps]).tolist()
        host = [StepLosses(step, lr, dict(zip(losses, row)), skipped)
                for (step, lr, losses, skipped), row in zip(self._steps, values)]
        self._steps = []
        return host
