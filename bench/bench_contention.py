"""Throughput beside busy neighbours: `vlbert extract` images/s and `vlbert train` samples/s on the
machine as it is and beside 1 (optionally 2) CPU-bound processes, for the old thread defaults and
the new ones, side by side in one run.

    git worktree add /tmp/base c674297     # the code before vlbert/utils/threads.py
    .venv/bin/python bench/bench_contention.py --baseline /tmp/base   # about 4 minutes on 2 cores
    .venv/bin/python bench/bench_contention.py --neighbours 0,1,2 --repeat 2 --settings new,one

Settings (every run is a fresh `vlbert` process, so the variables reach OpenMP when torch loads):
  old      the --baseline checkout's code with its defaults: torch's, one OpenMP thread per core
  new      no variable: vlbert/utils/threads.py's defaults (training: one thread; CPU extraction: a
           compute lane per core, each computing whole batches with single-threaded ops)
  one      OMP_NUM_THREADS=1: one thread, one lane
  passive  OMP_WAIT_POLICY=passive: the new defaults, waiting OpenMP threads sleep
A neighbour is a Python busy loop. Extraction: the demo detector (pipelines/data/demo_detector.*)
over a demo world's images (`vlbert world generate`); its figure is the job's own images/s (model
building included, Python start-up not). Training: a tiny VL-BERT, one VQA stage, on the synthetic
BUTD-sized store of bench_train.py; its figure is the stage's samples/s (its evaluation). Per load the
settings alternate, --repeat times, and the best of each is kept. "x idle" is a figure over the
same setting's figure with no neighbour, "x old idle" over old's with no neighbour (the issue's
goal: at least 0.4 with one neighbour), "x old" over old's at the same load.
A run past --timeout seconds is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from bench_train import make_data, run_spec
from checkouts import ROOT
from train.engine.run_folder import RunFolder

VLBERT = [sys.executable, "-c", "from pipelines.cli import main; main()"]
DETECTOR = ROOT / "pipelines" / "data" / "demo_detector"
CORES = len(os.sched_getaffinity(0))
SETTINGS = {"old": {}, "new": {}, "one": {"OMP_NUM_THREADS": "1"}, "passive": {"OMP_WAIT_POLICY": "passive"}}
BASELINE = "old"  # the setting that runs the --baseline checkout's code
CHECKOUTS: dict[str, Path] = {}  # setting → the checkout it runs, when not this one
VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")


def run(command: list[str], setting: str, timeout: float) -> str | None:
    """The command's output, in an environment holding only the setting's thread variables, with the
    code of the setting's checkout (`python -c` imports from its working folder first); None past
    the timeout."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES} | SETTINGS[setting]
    code = CHECKOUTS.get(setting, ROOT)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=code)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode:
        raise RuntimeError(f"{shlex.join(command)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def extraction_rate(work: Path, setting: str, timeout: float) -> float | None:
    out = work / f"store-{time.monotonic_ns()}"
    output = run([*VLBERT, "extract", "--images", str(work / "world" / "images"), "--out", str(out),
                  "--detector", f"{DETECTOR}.yaml", "--weights", f"{DETECTOR}.safetensors", "--quiet"],
                 setting, timeout)
    return None if output is None else float(re.search(r"([\d.]+) images/s", output).group(1))


def training_rate(work: Path, setting: str, timeout: float, args) -> float | None:
    out = f"run-{time.monotonic_ns()}"
    spec = run_spec(work, out, SimpleNamespace(steps=args.steps, batch_size=8, model="tiny", max_length=140,
                                               device="cpu"), workers=0, precision="fp32")
    config = work / f"{out}.yaml"
    config.write_text(json.dumps(spec))  # YAML holds JSON
    if run([*VLBERT, "train", str(config)], setting, timeout) is None:
        return None
    return RunFolder(work / out).last_stage().evaluation()["samples_per_s"]


def busy_neighbours(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--neighbours", default="0,1", help="comma-separated busy-process counts; 0 first")
    parser.add_argument("--settings", default="old,new", help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--baseline", type=Path, help="the checkout whose code the `old` setting runs")
    parser.add_argument("--images", type=int, default=120, help="demo world images to extract")
    parser.add_argument("--steps", type=int, default=20, help="training steps (batch 8)")
    parser.add_argument("--tasks", default="extract,train")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60, help="seconds per run")
    args = parser.parse_args()
    if BASELINE in args.settings.split(","):
        if args.baseline is None:
            parser.error(f"the {BASELINE} setting needs --baseline CHECKOUT (git worktree add /tmp/base c674297)")
        CHECKOUTS[BASELINE] = args.baseline.resolve()
    print("command:", shlex.join(["python", "bench/bench_contention.py", *sys.argv[1:]]))
    loads, settings, tasks = ([int(n) for n in args.neighbours.split(",")], args.settings.split(","),
                              args.tasks.split(","))
    measure = {"extract": lambda work, s: extraction_rate(work, s, args.timeout),
               "train": lambda work, s: training_rate(work, s, args.timeout, args)}
    best: dict[tuple[str, int, str], float | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = make_data(Path(tmp), args.images)  # the demo world (its images) and the training store
        for load in loads:
            neighbours = busy_neighbours(load)
            try:
                for _ in range(args.repeat):
                    for task in tasks:
                        for setting in settings:
                            rate = measure[task](work, setting)
                            key = (task, load, setting)
                            best[key] = max(filter(None, (best.get(key), rate)), default=None)
            finally:
                for neighbour in neighbours:
                    neighbour.kill()
                    neighbour.wait()
    report(best, loads, settings, tasks, args)


def report(best, loads, settings, tasks, args) -> None:
    units = {"extract": "images/s", "train": "samples/s"}
    print(f"{CORES} cores, best of {args.repeat}; --timeout {args.timeout:.0f} s per run")
    for task in tasks:
        for load in loads:
            cells = []
            for setting in settings:
                rate, idle = best[(task, load, setting)], best[(task, loads[0], setting)]
                if rate is None:
                    cells.append(f"{setting} > {args.timeout:.0f} s")
                    continue
                cell = f"{setting} {rate:7.2f} {units[task]}"
                if load != loads[0] and idle:
                    cell += f" ({rate / idle:.2f}x idle)"
                old, old_idle = best.get((task, load, BASELINE)), best.get((task, loads[0], BASELINE))
                if setting != BASELINE and load != loads[0] and old_idle:
                    cell += f" ({rate / old_idle:.2f}x old idle)"
                if setting != BASELINE and old:
                    cell += f" ({rate / old:.2f}x old)"
                cells.append(cell)
            print(f"  {task:7s} {load} busy neighbour(s): " + " | ".join(cells))


if __name__ == "__main__":
    main()
