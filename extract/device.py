"""Checking a device name before anything runs on it, so `--device cuda` on a machine without CUDA
is one clear error instead of a failure deep inside the first forward pass."""

from __future__ import annotations

import torch


class DeviceError(ValueError):
    """A device name that this machine or this torch build cannot use."""


def check_device(name: str | torch.device) -> torch.device:
    """The torch.device for `name` (cpu, cuda, cuda:N, mps), after checking that it is usable here."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise DeviceError(f"device {name!r}: not a device name (expected cpu, cuda, cuda:N or mps)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise DeviceError(f"device {name!r}: CUDA is not available on this machine (torch {torch.__version__}, "
                              f"{build}); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError(f"device {name!r}: MPS is not available on this machine; use --device cpu")
    elif device.type != "cpu":
        raise DeviceError(f"device {name!r}: unsupported device type {device.type!r} (expected cpu, cuda or mps)")
    return device
