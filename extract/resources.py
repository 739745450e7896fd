"""How an extraction job uses its host and its device, decided once when it starts: how many batches
compute at once (CPU threads, or CUDA streams), how many processes read and decode the image files,
and where JPEGs are decoded.

On the CPU the lanes take the cores (vlbert/utils/threads.py) and two decoding workers feed them. On a
GPU the host must keep the device fed: JPEGs may be decoded on the device in batches (extract/jpeg.py;
opt-in, as nvJPEG's pixels are not Pillow's), the workers then only read the files (and decode what
the device cannot), and two lanes, each on a CUDA stream of its own, overlap one batch's host work
(Python, waits for the device, records) with another batch's kernels. Its workers are sized from the cores this process may use (a Slurm task's
share, through its CPU affinity), leaving one for each lane and one for the commit thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from extract.jpeg import device_decodes_jpeg
from vlbert.utils.errors import UserError
from vlbert.utils.threads import cuda_lane, lane_count

DEFAULT_STREAMS = 2
CPU_DECODE_WORKERS = 2
MAX_DEFAULT_WORKERS = 8


class ResourceError(UserError):
    """A job option that this host or device cannot honour."""


@dataclass(frozen=True)
class Resources:
    lanes: int  # batches computed at once: CPU threads, or CUDA streams
    decode_workers: int
    jpeg_on_device: bool  # JPEGs decoded on the job's device (extract/jpeg.py), else by Pillow in the workers
    jpeg_note: str  # why JPEGs are decoded where they are, for the summary

    def start_lane(self, device: torch.device, torch_threads: int) -> Callable[[], None]:
        """The set-up of each lane's thread (ComputeLanes' `start_lane`)."""
        if device.type == "cuda":
            return cuda_lane(device, torch_threads)
        return partial(torch.set_num_threads, 1)

    def describe(self, device: torch.device) -> str:
        lanes = f"{self.lanes} CUDA stream(s)" if device.type == "cuda" else f"{self.lanes} CPU lane(s)"
        return f"{lanes}, {self.decode_workers} decoding worker(s), JPEG decoded {self.jpeg_note}"


def job_resources(device: torch.device, *, threads: int | None, streams: int | None, decode_workers: int | None,
                  jpeg_decoding: str) -> Resources:
    """The job's lanes, workers and JPEG decoding on `device` (its index set on CUDA). None: the
    default (module doc). `jpeg_decoding`: auto (on a CUDA device that can), device (refused in one
    line where it cannot), workers (Pillow, as on the CPU); one of JPEG_DECODING (the job checks)."""
    on_cuda = device.type == "cuda"
    lanes = (streams or DEFAULT_STREAMS) if on_cuda else lane_count(threads)
    on_device, note = False, "by Pillow in the decoding workers"
    if jpeg_decoding == "device" or (jpeg_decoding == "auto" and on_cuda):
        why_not = device_decodes_jpeg(device)
        if why_not is None:
            on_device, note = True, f"on {device} (torchvision.io.decode_jpeg{', nvJPEG' if on_cuda else ''})"
        elif jpeg_decoding == "device":
            raise ResourceError(f"jpeg_decoding device: {device} cannot decode JPEG here ({why_not}); use auto or "
                                "workers")
        else:
            note += f" ({device} cannot: {why_not})"
    if decode_workers is None:
        cores = len(os.sched_getaffinity(0))
        decode_workers = min(MAX_DEFAULT_WORKERS, max(CPU_DECODE_WORKERS, cores - lanes - 1)) if on_cuda \
            else CPU_DECODE_WORKERS
    return Resources(lanes, decode_workers, on_device, note)
