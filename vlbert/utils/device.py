"""Checking a device name before anything runs on it, so `--device cuda` on a machine without CUDA
is one clear error instead of a failure deep inside the first forward pass."""

from __future__ import annotations

from typing import Mapping

import torch

from vlbert.utils.errors import FAILED, UserError


class DeviceError(UserError):
    """A device name that this machine or this torch build cannot use."""


AUTO = "auto"  # a GPU where this process sees one, else the CPU


def resolved_device(name: str | torch.device) -> str | torch.device:
    """`auto` as this process finds it: cuda (where torch sees a GPU: a scheduler's CUDA_VISIBLE_DEVICES
    decides which), else cpu; any other name as it is."""
    if name == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def check_device(name: str | torch.device) -> torch.device:
    """The torch.device for `name` (cpu, cuda, cuda:N, mps, auto), after checking that it is usable here."""
    name = resolved_device(name)
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise DeviceError(f"device {name!r}: not a device name (expected cpu, cuda, cuda:N, mps or auto)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise DeviceError(f"device {name!r}: CUDA is not available on this machine (torch {torch.__version__}, "
                              f"{build}); use the cpu device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceError(f"device {name!r}: MPS is not available on this machine; use the cpu device")
    elif device.type != "cpu":
        raise DeviceError(f"device {name!r}: unsupported device type {device.type!r} (expected cpu, cuda or mps)")
    return device


def use_device(device: torch.device) -> torch.device:
    """Makes a CUDA `device` this process's current device, launcher or not: what CUDA puts on the
    current device (the context, pinned host memory's, library handles, NCCL's) then lands on it,
    not on cuda:0, which another process may be using. A bare 'cuda' is the current device already
    (set_device refuses a device without an index)."""
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device


def rank_device(device: str, env: Mapping[str, str]) -> str:
    """The device of this process under a launcher that starts several per node (torchrun sets
    LOCAL_RANK and LOCAL_WORLD_SIZE): a bare 'cuda' becomes cuda:LOCAL_RANK. Extraction jobs and
    training runs both place their ranks so.

    An explicit cuda:N is refused there rather than remapped: it would put every rank on GPU N,
    and no remapping is right for every intent (GPU N + LOCAL_RANK? only rank 0 on N?), while
    running somewhere other than asked would be silent. Without LOCAL_WORLD_SIZE, a LOCAL_RANK
    above 0 says there are several.
    """
    device = resolved_device(device)
    if "LOCAL_RANK" not in env:
        return device
    local_rank = launcher_variable(env, "LOCAL_RANK", 0)
    local_world = launcher_variable(env, "LOCAL_WORLD_SIZE", local_rank + 1)
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        return device  # not a device name: check_device says so
    if parsed.type != "cuda":
        return device
    if parsed.index is None:
        return f"cuda:{local_rank}"
    if local_world > 1:
        raise DeviceError(f"device {device!r} under a launcher with {local_world} processes on this node "
                          f"(LOCAL_RANK={local_rank}): every rank would run on {device}; use device cuda, which "
                          "gives each rank cuda:LOCAL_RANK (CUDA_VISIBLE_DEVICES chooses the GPUs)")
    return device


def launcher_variable(env: Mapping[str, str], name: str, default: int) -> int:
    """An integer a launcher sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)."""
    try:
        return int(env.get(name, default))
    except ValueError:
        raise DeviceError(f"{name}={env[name]!r}: expected an integer (set by the launcher)") from None


class StickyDeviceError(UserError, RuntimeError):
    """The device failed in a way that poisons its CUDA context (a device-side assert, an illegal
    memory access, ...): nothing more can run on it in this process."""

    exit_status = FAILED


# How CUDA errors that leave the context unusable read (CUDA runtime and driver, cuBLAS, cuDNN; HIP
# says the same). Lower case.
STICKY_CUDA_MESSAGES = (
    "device-side assert triggered",
    "an illegal memory access was encountered",
    "an illegal instruction was encountered",
    "unspecified launch failure",
    "misaligned address",
    "the launch timed out and was terminated",
    "uncorrectable ecc error",
    "hardware stack error",
    "invalid program counter",
    "cublas_status_execution_failed",
    "cudnn_status_execution_failed",
    "cuda_error_illegal_address",
    "cuda_error_assert",
    "cuda_error_launch_failed",
    "cuda_error_ecc_uncorrectable",
)


def is_sticky_cuda_error(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling, is a CUDA error that
    leaves the process's CUDA context unusable: every later CUDA call fails too, so retrying on
    the same device (image by image, in halves) cannot succeed and only repeats the error.

    Out of memory is not sticky (the caching allocator frees and the work can be split); neither
    is any error that is not a RuntimeError. `torch.AcceleratorError` (the type of every CUDA
    runtime error in recent torch) counts unless it is out of memory: stopping on a rare recoverable
    one costs a rerun, while going on after a sticky one records every remaining image as failed.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RuntimeError) and not isinstance(exc, torch.cuda.OutOfMemoryError):
            message = str(exc).lower()
            if any(sticky in message for sticky in STICKY_CUDA_MESSAGES):
                return True
            if isinstance(exc, getattr(torch, "AcceleratorError", ())) and "out of memory" not in message:
                return True
        exc = exc.__cause__ or exc.__context__
    return False
