"""The papers' effects as claims, each run over seeds × CPU thread counts: per run its figure with its
95% interval against what the claim beats, and "holds in k of n runs".

    .venv/bin/python bench/bench_effects.py                                # 3 seeds × 1 and 2 threads
    .venv/bin/python bench/bench_effects.py --seeds 0 --threads 1 --scale 0.2    # one short run
    .venv/bin/python bench/bench_effects.py --seeds 0 --threads 1 --checkout /tmp/base  # another commit's code
    .venv/bin/python bench/bench_effects.py --seeds 1 --set pretrain.pretrain.base_lr=3e-5  # a changed setting

Claims (`CLAIMS`):
  zero_shot  retrieval_unicoder.yaml's relationship pre-training, then its zero-shot stage: the
             relationship loss leaves ln 2 (its mean over the last tenth of the steps is at least
             `LEFT_LN2` below ln 2) and the zero-shot text→image R@10 on the val split has its 95%
             interval above the random ranking's R@10. A run holds when both do.

Each run is `vlbert pipeline run` of the claim's steps in a fresh process with `--threads T` and the
step's `seed` set (its steps read each other, so they run one after another, each in a process of
its own with T threads, which its step.json records and the run's line repeats); the world, its
FeatureStore and vocabulary are built once (one thread) and shared by every run, so runs differ only
by seed and thread count. `--scale` multiplies the pre-training's steps and warm-up for a quick look;
the claims are about scale 1. `--checkout` runs the code and pipeline files of another checkout (e.g.
`git worktree add /tmp/base COMMIT`), to show a claim before a change, and `--set` gives each run's
`vlbert pipeline run` a setting of its steps (`--set STEP.STAGE.FIELD=VALUE`). Runs go one after
another; a run that fails stops the benchmark with its log.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "pipelines" / "configs"
SHARED_STEPS = ("world", "cache", "vocabulary")  # built once, read by every run
LEFT_LN2 = 0.05  # how far below ln 2 the relationship loss must end to have left chance


@dataclass(frozen=True)
class RunResult:
    figure: str  # what the run measured, for the table
    holds: bool
    threads: int  # what the judged step's step.json records


@dataclass(frozen=True)
class Claim:
    description: str
    pipeline: Path
    steps: tuple[str, ...]  # the pipeline's steps that a run trains and evaluates
    seeded: str  # the step whose `seed` a run sets
    scaled: str  # the step whose stages' steps and warm-up `--scale` multiplies
    judge: Callable[[Path], RunResult]  # a run's folder → its figure and verdict


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def zero_shot_result(out: Path) -> RunResult:
    losses = [record["relationship_loss"] for line in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()
              if "relationship_loss" in (record := json.loads(line))]
    tenth = max(1, len(losses) // 10)
    first, last = _mean(losses[:tenth]), _mean(losses[-tenth:])
    left = last <= math.log(2) - LEFT_LN2
    evaluation = json.loads(next((out / "zero_shot").glob("stages/*/eval.json")).read_text())
    recall, (low, high) = evaluation["recalls"]["t2i_r10"], evaluation["recall_intervals"]["t2i_r10"]
    chance = evaluation["chance_recalls"]["t2i_r10"]
    above = low > chance
    figure = (f"relationship loss {first:.3f} → {last:.3f} ({'left' if left else 'stayed at'} ln 2); "
              f"t2i R@10 {recall:.3f} [{low:.3f}, {high:.3f}] vs chance {chance:.3f} "
              f"({'above' if above else 'not above'})")
    threads = json.loads((out / "pretrain" / "step.json").read_text())["threads"]
    return RunResult(figure, left and above, threads)


CLAIMS = {
    "zero_shot": Claim("zero-shot retrieval above chance after relationship pre-training",
                       CONFIGS / "retrieval_unicoder.yaml", ("pretrain", "zero_shot"), "pretrain", "pretrain",
                       zero_shot_result),
}


def _resolved(value: Any, replacements: dict[str, str]) -> Any:
    if isinstance(value, str):
        for reference, path in replacements.items():
            value = value.replace(reference, path)
        return value
    if isinstance(value, dict):
        return {key: _resolved(item, replacements) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolved(item, replacements) for item in value]
    return value


def claim_pipelines(claim: Claim, code: Path, scale: float, work: Path) -> tuple[Path, Path]:
    """(the pipeline of the shared steps, the pipeline of a run's steps reading their folders), from the
    claim's pipeline file in the checkout `code`."""
    source = code / claim.pipeline.relative_to(ROOT)
    document = yaml.safe_load(source.read_text())  # merge keys resolved: each step is whole
    shared = work / "shared"
    replacements = {"${here}": str(source.parent),
                    **{f"${{{name}}}": str(shared / name) for name in SHARED_STEPS}}
    steps = {step["name"]: _resolved(step, replacements) for step in document["steps"]}
    for stage in steps[claim.scaled]["stages"]:
        stage["steps"] = max(2, round(stage["steps"] * scale))
        stage["warmup_steps"] = round(stage.get("warmup_steps", 0) * scale)
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, kept in (("shared", SHARED_STEPS), ("runs", claim.steps)):
        path = work / f"{claim.pipeline.stem}-{name}.yaml"
        path.write_text(yaml.safe_dump({"name": f"{document['name']}-{name}", "steps": [steps[k] for k in kept]},
                                       sort_keys=False))
        paths.append(path)
    return paths[0], paths[1]


def run_pipeline(code: Path, pipeline: Path, out: Path, threads: int, settings: list[str]) -> float:
    """`vlbert pipeline run` with the code of the checkout `code`: its wall time."""
    started = time.perf_counter()
    # Not `--jobs 1`: it runs each step in the scheduler's own process, with that process's threads.
    command = [sys.executable, "-m", "pipelines", "pipeline", "run", str(pipeline), "--out", str(out),
               "--threads", str(threads), *(arg for setting in settings for arg in ("--set", setting))]
    done = subprocess.run(command, cwd=code, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(code)})
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", default=",".join(CLAIMS), help=f"comma-separated, of {', '.join(CLAIMS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", default="1,2", help="CPU thread counts, each run with every seed")
    parser.add_argument("--scale", type=float, default=1.0, help="the trained stages' steps × this")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose code runs (default: this one)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the runs' steps, as `vlbert pipeline run --set` takes it (repeatable)")
    args = parser.parse_args()
    claims = [name for name in args.claims.split(",") if name]
    unknown = [name for name in claims if name not in CLAIMS]
    if unknown:
        raise SystemExit(f"--claims: unknown {', '.join(unknown)}; known: {', '.join(CLAIMS)}")
    seeds, thread_counts = [int(s) for s in args.seeds.split(",")], [int(t) for t in args.threads.split(",")]
    print("command:", shlex.join([".venv/bin/python", "bench/bench_effects.py", *sys.argv[1:]]), flush=True)
    with tempfile.TemporaryDirectory() as temporary:
        work = args.out or Path(temporary)
        for name in claims:
            claim = CLAIMS[name]
            code = args.checkout.resolve()
            shared, runs = claim_pipelines(claim, code, args.scale, work / name)
            run_pipeline(code, shared, work / name / "shared", 1, [])
            where = "" if code == ROOT else f", the code at {code}"
            settings = "".join(f", --set {setting}" for setting in args.set)
            print(f"\n{name}: {claim.description} ({claim.pipeline.name}, steps × {args.scale}{where}{settings})",
                  flush=True)
            held = []
            for threads in thread_counts:
                for seed in seeds:
                    out = work / name / f"seed{seed}-threads{threads}"
                    wall = run_pipeline(code, runs, out, threads, [f"{claim.seeded}.seed={seed}", *args.set])
                    result = claim.judge(out)
                    if result.threads != threads:
                        raise SystemExit(f"{out}: the run recorded {result.threads} thread(s), not {threads}")
                    held.append(result.holds)
                    print(f"  seed {seed}, {result.threads} thread(s), {wall:.0f} s: {result.figure}: "
                          f"{'holds' if result.holds else 'does NOT hold'}", flush=True)
            print(f"{name}: holds in {sum(held)} of {len(held)} runs", flush=True)


if __name__ == "__main__":
    main()
