"""Everything a GPU host can tell about this project, in about 10 minutes on one GPU: the device,
driver and library versions, the `cuda` tests, and every GPU figure of the benchmarks.

    make gpu                     # installs the project against the host's own torch, then runs this
    python bench/gpu_report.py   # the same, once the project is installed
    python bench/gpu_report.py --tiny   # anywhere: its training parts on the CPU, tiny, to see that they run

It first names the project's dependencies (the `test` extra's included) that the host lacks, and
stops there if any is missing: a GPU host without network needs their wheels carried to it.

It runs against whatever torch the interpreter has (no pinned virtual environment): the point is
to learn how this code does on that host. Each part runs in a subprocess under its own time limit
(a part that runs out is reported as such, is stopped with every process it started, and the next
one starts); the default parts' limits sum to 9 minutes, so the report ends within a 10-minute slot.
Part 6, the training step compiled, compiles for minutes and runs only when named, in a slot of its
own (`--parts 6`). Every figure is printed as the benchmark prints it, with the command that measured it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

# bench_train.py's sizes: on the GPU, and in the tiny setting (--tiny: the CPU, a tiny model, a few steps).
TRAINING = ["--device", "cuda", "--model", "base", "--images", "384", "--batch-sizes", "64,256", "--precisions", "bf16",
            "--warmup", "10", "--steps", "200"]
TINY_TRAINING = ["--images", "48", "--batch-sizes", "4,8", "--precisions", "fp32", "--warmup", "2", "--steps", "3",
                 "--workers", "0"]
# After the training sizes (later flags win): a warm-up long enough to hold the compilations, and where
# the step in reduce-overhead mode (the third configuration) spends its time.
COMPILED_TRAINING = ["--warmup", "30", "--compile", "first", "--compile-modes", "default,reduce-overhead",
                     "--profile", str(Path(tempfile.gettempdir()) / "vlbert-compiled-step"), "--profile-index", "2"]


class Part(NamedTuple):
    title: str  # what it measures
    command: list[str]
    limit: float  # seconds it may take; the default parts' limits sum to at most 540
    gpu_only: bool = False  # left out of the tiny setting
    default: bool = True  # run without --parts; the others only when named, each in a slot of its own


def parts(tiny: bool = False) -> list[Part]:
    training = [sys.executable, "bench/bench_train.py", *(TINY_TRAINING if tiny else TRAINING)]
    return [
        Part("the cuda tests", [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider"],
             90, gpu_only=True),
        Part("extraction: BUTD-size detector, bf16, detection and given boxes with K = 0 and 3 masked variants, steady "
             "images/s over at least 200 images and given-box passes/s, GPU utilisation, share of the FLOP floor, "
             "selection ms per image",
             [sys.executable, "bench/bench_extract.py", "--device", "cuda", "--detectors", "butd-vg", "--precisions",
              "bf16", "--modes", "detect,given", "--variants", "0,3", "--images", "272", "--batch-size", "16",
              "--warmup", "3"], 150, gpu_only=True),
        # The end-to-end stage runs the butd-vg detector at 600 pixels: seconds a sample on a CPU.
        Part("training: VL-BERT-base bf16, steady samples/s, the share of time waiting for data and of the bf16 peak, "
             "batch 64 and 256, 10-100 RoIs with length-aware batches off and on, cached / end-to-end",
             [*training, "--variable-regions", *([] if tiny else ["--end2end"])], 120),
        # The model's switches run last, so that the time limit cuts them before the others.
        Part("training's speed paths: a q8 store (8-bit codes to the device, decoded there) at batch 64 and 256 "
             "beside the float16 rows above, the bytes a batch copies from each store, the steady rates of "
             "pre-training and referring expressions (steps without host syncs), and VQA with its unread pooler "
             "skipped and with the fused encoder layers (one GEMM for query, key and value), each beside the "
             "first row",
             [*training, "--feature-dtypes", "q8", "--tasks", "pretrain,refexp", "--skip-unread-pooler", "first",
              "--fused-encoder-layers", "first"], 100),
        # After the others, so that their numbers (--skip, docs) stay; 25 s of the cuda tests' 130 (they took
        # 68 s on the H200), 5 more of part 2's.
        Part("extraction: res5 alone on 300 pooled BUTD-size RoIs, dilated and polyphase layouts side by side, "
             "fp32 and bf16 ms per call and the ratio",
             [sys.executable, "bench/bench_detector.py", "--parts", "res5", "--presets", "butd-vg", "--devices", "cuda",
              "--precisions", "fp32,bf16", "--res5-rois", "300", "--repeat", "5"], 30, gpu_only=True),
        # Compilation (again where a later batch's padded shapes differ) takes minutes: a slot of its own.
        Part("training compiled: VL-BERT-base bf16 at batch 64, eager beside the step compiled by torch.compile in "
             "its default mode and in reduce-overhead mode (forward and backward replayed as CUDA graphs), steady "
             "samples/s, and where the reduce-overhead step's time goes",
             [*training, "--batch-sizes", "4" if tiny else "64", *COMPILED_TRAINING], 540, default=False),
        # A default part, after the compiled one so that the parts' numbers stay.
        Part("extraction's speed paths: whole detection jobs, butd-vg bf16 with polyphase res5, without and with "
             "every speed path (folded res5 norms, cuDNN's algorithm search, RoI pooling into bf16, the batched "
             "RPN), steady images/s and the ratio",
             [sys.executable, "bench/bench_extract.py", "--device", "cuda", "--detectors", "butd-vg", "--precisions",
              "bf16", "--modes", "detect", "--variants", "0", "--res5-layouts", "polyphase", "--speed-paths",
              "none,all", "--images", "160", "--batch-size", "16", "--warmup", "3"], 50, gpu_only=True),
    ]


PARTS = parts()


def versions() -> list[str]:
    import torch

    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
             f"cuDNN {torch.backends.cudnn.version()})"]
    if not torch.cuda.is_available():
        return lines + ["no CUDA device: nothing to measure here (the cuda tests skip, the benchmarks need a GPU)"]
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        lines.append(f"cuda:{index} {props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability "
                     f"{props.major}.{props.minor}, bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}")
    lines.append(f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        lines.append(f"driver {smi.stdout.strip().splitlines()[0]}" if smi.returncode == 0 else "driver: nvidia-smi failed")
    except (OSError, subprocess.TimeoutExpired, IndexError):
        lines.append("driver: nvidia-smi not found")
    return lines


def missing_dependencies(project: str = "vlbert-pipeline") -> list[str]:
    """The requirements of `project` (its `test` extra's too) that this interpreter has not installed;
    [project] when the project itself is not installed."""
    try:
        requirements = importlib.metadata.requires(project) or []
    except importlib.metadata.PackageNotFoundError:
        return [project]
    missing = []
    for requirement in requirements:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if extra and extra.group(1) != "test":  # another extra's (spaCy for `analyze syntax`): the report needs none
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def run_part(title: str, command: list[str], limit: float) -> bool:
    print(f"\n== {title}\n$ {shlex.join(command)}", flush=True)
    start = time.perf_counter()
    # A process group of its own: on a timeout (or an interrupt) the part's DataLoader workers and
    # pytest's children stop with it, instead of holding the GPU after the report moved on.
    part = subprocess.Popen(command, cwd=ROOT, start_new_session=True)
    try:
        status = part.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        print(f"-- stopped after {limit:.0f} s (its time limit): no figure from this part", flush=True)
        return False
    finally:
        _stop_group(part)
    print(f"-- {time.perf_counter() - start:.0f} s, exit status {status}", flush=True)
    return status == 0


def _stop_group(part: subprocess.Popen) -> None:
    """Kills what is left of the part's process group (its leader, if running, and every descendant)."""
    try:
        os.killpg(part.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is gone: every process of it has exited
    part.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="",
                        help="comma-separated part numbers to run (default: 1 to 5 and 7, about 9 minutes; 6, the "
                        "compiled training step, up to 9 minutes, runs only when named)")
    parser.add_argument("--skip", default="",
                        help="comma-separated part numbers (1 tests, 2 extraction, 3 training, 4 its speed paths, "
                        "5 res5 layouts, 6 compiled training, 7 extraction's speed paths)")
    parser.add_argument("--tiny", action="store_true", help="the training parts on the CPU, a tiny model and a few "
                        "steps: that they run, not figures")
    args = parser.parse_args()
    print("\n".join(versions()), flush=True)
    import torch

    if not (torch.cuda.is_available() or args.tiny):
        return 1
    missing = missing_dependencies()
    if missing:
        print(f"missing on this host: {', '.join(missing)}; install their wheels (pip install --no-index "
              "--find-links WHEELS ...; docs/benchmarks.md, \"On a GPU host\") and run this again", flush=True)
        return 1
    named = {int(part) for part in args.parts.split(",") if part}
    skipped = {int(part) for part in args.skip.split(",") if part}
    chosen = [part for number, part in enumerate(parts(args.tiny), 1)
              if (number in named if named else part.default) and number not in skipped
              and not (args.tiny and part.gpu_only)]
    results = [run_part(part.title, part.command, part.limit) for part in chosen]
    print(f"\n{sum(results)} of {len(results)} parts completed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
