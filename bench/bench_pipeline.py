"""A shipped pipeline run one step after another (`--jobs 1`) and side by side (the local executor's
default), in one run: wall time, CPU time, cores busy, and the report's figures of both.

    .venv/bin/python bench/bench_pipeline.py demo                   # the demo as `make demo` runs it
    .venv/bin/python bench/bench_pipeline.py ablation --scale 0.1   # ablation.yaml, every stage's steps × 0.1
    .venv/bin/python bench/bench_pipeline.py demo --only scheduled  # just `make demo`'s figure

Each run is `vlbert pipeline run` in a fresh process into a fresh folder, so both pay for the world
and the extraction. `--scale` multiplies every train stage's steps (and warm-up) for a quick
figure; the goals are for scale 1. Cores busy is the CPU time of the run's processes (user + system,
children included) over its wall time. A scheduled figure agrees with the sequential one when it
lies in the sequential run's 95% bootstrap interval over evaluation items (the report's).

Goals (issue 25, a quiet 2-core machine): the demo scheduled in at most 480 s with at least 1.7 cores
busy and its four figures within the sequential run's intervals; ablation.yaml scheduled in at most
0.6 of its sequential wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = {"demo": ROOT / "pipelines" / "configs" / "demo.yaml",
             "ablation": ROOT / "pipelines" / "configs" / "ablation.yaml"}
MODES = {"sequential": ["--jobs", "1"], "scheduled": []}


def scaled(source: Path, scale: float, work: Path) -> Path:
    """The pipeline file with every train stage's steps (and warm-up) × `scale`, beside a copy of what
    `${here}` names."""
    if scale == 1:
        return source
    document = yaml.safe_load(source.read_text())
    # A stage written as an alias (`stages: [*vqa]`) is one object in every step that names it: scale it once.
    stages = {id(stage): stage for step in document["steps"] for stage in step.get("stages") or []}
    for stage in stages.values():
        stage["steps"] = max(2, round(stage["steps"] * scale))
        if "warmup_steps" in stage:
            stage["warmup_steps"] = round(stage["warmup_steps"] * scale)
    text = yaml.safe_dump(document, sort_keys=False).replace("${here}", str(source.parent))
    path = work / source.name
    path.write_text(text)
    return path


def run(pipeline: Path, out: Path, mode: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipelines", "pipeline", "run", str(pipeline), "--out", str(out),
                           *MODES[mode]], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{mode} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = json.loads((out / "report" / "report.json").read_text())
    return {"wall_s": wall, "cpu_s": cpu, "cores_busy": cpu / wall, "runs": report["runs"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", choices=sorted(PIPELINES))
    parser.add_argument("--scale", type=float, default=1.0, help="every train stage's steps × this")
    parser.add_argument("--only", choices=sorted(MODES), help="run one mode only")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = args.out or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        pipeline = scaled(PIPELINES[args.pipeline], args.scale, work)
        results = {mode: run(pipeline, work / mode, mode) for mode in MODES if args.only in (None, mode)}
    print(f"{args.pipeline}.yaml, steps × {args.scale}, {len(os.sched_getaffinity(0))} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'mode':<11} {'wall s':>8} {'cpu s':>8} {'cores busy':>10}")
    for mode, result in results.items():
        print(f"{mode:<11} {result['wall_s']:>8.1f} {result['cpu_s']:>8.1f} {result['cores_busy']:>10.2f}")
    if len(results) == 2:
        sequential, scheduled = results["sequential"], results["scheduled"]
        print(f"wall time scheduled / sequential: {scheduled['wall_s'] / sequential['wall_s']:.2f}")
        print(f"{'run':<20} {'sequential [95% interval]':>34} {'scheduled':>10}  inside")
        for first, second in zip(sequential["runs"], scheduled["runs"]):
            low, high = first["interval"]
            inside = low <= second["value"] <= high
            print(f"{first['name']:<20} {first['value']:>10.4f} [{low:.4f}, {high:.4f}]       "
                  f"{second['value']:>10.4f}  {'yes' if inside else 'NO'}")


if __name__ == "__main__":
    main()
