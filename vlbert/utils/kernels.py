"""Which CPU kernel family computed a result, recorded beside stores and training runs.

x86 CPUs differ in the kernels torch, oneDNN and MKL pick (AVX2, AVX-512, AMX), and the kernels
round differently, so a result's last bits depend on the family: a store's meta.json and a training
run's run.json keep `cpu_capabilities`, torch's name for each family that computed them.
"""

from __future__ import annotations

from typing import Iterable

CPU_CAPABILITIES = "cpu_capabilities"  # the key in meta.json and run.json


def cpu_capability() -> str:
    """torch's CPU kernel family in this process: "AVX512", "AVX2", "DEFAULT", ..."""
    import torch  # here, so that the store's schema can name the key without importing torch

    return torch.backends.cpu.get_cpu_capability()


def with_capabilities(recorded: list[str] | None, used: Iterable[str]) -> list[str] | None:
    """The record of the families that computed a result, in order of first use, with `used` added.
    None, the record of a result from before there was one (its families are unknown), stays None."""
    if recorded is None:
        return None
    return recorded + [capability for capability in dict.fromkeys(used) if capability not in recorded]
