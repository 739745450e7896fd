"""The papers' effects as claims, each run over seeds × CPU thread counts: per run its figure with its
95% interval against what the claim beats, and "holds in k of n runs".

    .venv/bin/python bench/bench_effects.py                                # 3 seeds × 1 and 2 threads
    .venv/bin/python bench/bench_effects.py --seeds 0 --threads 1 --scale 0.2    # one short run
    .venv/bin/python bench/bench_effects.py --seeds 0 --threads 1 --checkout /tmp/base  # another commit's code
    .venv/bin/python bench/bench_effects.py --seeds 1 --set pretrain.pretrain.base_lr=3e-5  # a changed setting

Claims (`CLAIMS`), each a set of effects judged on the same runs:
  zero_shot  retrieval_unicoder.yaml's relationship pre-training, then its zero-shot stage: the
             relationship loss leaves ln 2 (its mean over the last tenth of the steps is at least
             `LEFT_LN2` below ln 2) and the zero-shot text→image R@10 on the val split has its 95%
             interval above the random ranking's R@10. A run holds when both do.
  ablation   ablation.yaml's pre-training (e: masked LM, masked RoI, text-only corpus) and its VQA and
             referring-expression fine-tunings without pre-training (a), after it (e) and after it with
             a final end-to-end stage (f), seeds set on every one of them; its report compares them
             item by item. Effects, one per task: `pretraining_vqa`, `pretraining_refexp` (e − a) and
             `end_to_end_vqa`, `end_to_end_refexp` (f − e); one holds in a run when its paired 95%
             interval lies above 0. Under a VQA effect's line of a run, an indented line gives the
             same pair's difference [interval] within each answer type, from the report's
             comparisons by answer type: information on where a difference comes from (not corrected
             for multiple comparisons); the verdict and "holds in k of n" are the whole split's.

Each run is `vlbert pipeline run` of the claim's steps in a fresh process with `--threads T` and the
steps' `seed` set: each step runs in a process of its own with T threads, which its step.json records
and the run's line repeats (steps that do not read each other may run side by side: that moves the
wall time, not the figures). The world, its FeatureStore and vocabulary are built once (one thread)
and shared by every run, so runs differ only by seed and thread count. `--scale` multiplies the
trained stages' steps and warm-up for a quick look (the zero-shot claim's pre-training; every stage of
the ablation's runs); the claims are about scale 1. `--checkout` runs the code and pipeline files of
another checkout (e.g. `git worktree add /tmp/base COMMIT`), to show a claim before a change, and
`--set` gives each run's `vlbert pipeline run` a setting of its steps (`--set STEP.STAGE.FIELD=VALUE`);
a setting of a shared step (`--set world.max_objects=3`) goes to the shared steps' run instead.
Runs go one after another; a run that fails stops the benchmark with its log.
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
    details: tuple[str, ...] = ()  # lines printed indented under the run's, not judged (e.g. by answer type)


@dataclass(frozen=True)
class Effect:
    description: str
    judge: Callable[[Path], RunResult]  # a run's folder → its figure and verdict


@dataclass(frozen=True)
class Claim:
    pipeline: Path
    steps: tuple[str, ...]  # the pipeline's steps that a run trains and evaluates
    seeded: tuple[str, ...]  # the steps whose `seed` a run sets
    scaled: tuple[str, ...]  # the steps whose stages' steps and warm-up `--scale` multiplies
    effects: dict[str, Effect]  # judged on the same runs
    compare: tuple[tuple[str, str], ...] = ()  # the run's report step compares these steps' runs (B − A)


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
    return RunResult(figure, left and above, _threads(out / "pretrain"))


def _threads(step: Path) -> int:
    return json.loads((step / "step.json").read_text())["threads"]


def _difference(comparison: dict[str, Any]) -> str:
    low, high = comparison["interval"]
    return f"{comparison['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


def compared(*pairs: tuple[str, str]) -> Callable[[Path], RunResult]:
    """A judge of the run's report: each pair's paired difference B − A with its 95% interval; the
    run holds when every interval lies above 0. Where the report also compares a pair within groups
    of items (VQA: answer types), a detail line gives each group's difference, not judged."""

    def judge(out: Path) -> RunResult:
        report = json.loads((out / "report" / "report.json").read_text())
        comparisons = {(c["a"], c["b"]): c for c in report["comparisons"]}
        figures, details, holds = [], [], True
        for a, b in pairs:
            comparison = comparisons[(a, b)]
            holds &= comparison["interval"][0] > 0
            figures.append(f"{b} − {a} {_difference(comparison)}")
            if "by_group" in comparison:
                named = f"{b} − {a} " if len(pairs) > 1 else ""
                details.append(f"{named}by {comparison['by_group']['name']}: " + ", ".join(
                    f"{group['group']} {_difference(group)}" for group in comparison["by_group"]["groups"]))
        return RunResult("; ".join(figures), holds, _threads(out / pairs[0][1]), tuple(details))

    return judge


ABLATION_RUNS = ("a-vqa", "e-vqa", "f-vqa", "a-refexp", "e-refexp", "f-refexp")
CLAIMS = {
    "zero_shot": Claim(CONFIGS / "retrieval_unicoder.yaml", ("pretrain", "zero_shot"), ("pretrain",), ("pretrain",),
                       {"zero_shot": Effect("zero-shot retrieval above chance after relationship pre-training",
                                            zero_shot_result)}),
    "ablation": Claim(CONFIGS / "ablation.yaml", ("pretrain-e", *ABLATION_RUNS), ("pretrain-e", *ABLATION_RUNS),
                      ("pretrain-e", *ABLATION_RUNS),
                      {f"{effect}_{task}": Effect(f"{text} on {task}", compared((f"{a}-{task}", f"{b}-{task}")))
                       for effect, a, b, text in (("pretraining", "a", "e", "pre-training (e) beats none (a)"),
                                                  ("end_to_end", "e", "f", "a final end-to-end stage (f) beats "
                                                                           "the frozen detector (e)"))
                       for task in ("vqa", "refexp")},
                      compare=(("a-vqa", "e-vqa"), ("a-refexp", "e-refexp"), ("e-vqa", "f-vqa"),
                               ("e-refexp", "f-refexp"))),
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
    here = {"${here}": str(source.parent)}
    # The shared steps keep their references to each other, by which the runner orders them (the
    # world before its extraction and vocabulary); a run's steps read their finished folders.
    replacements = {**here, **{f"${{{name}}}": str(shared / name) for name in SHARED_STEPS}}
    steps = {step["name"]: _resolved(step, here if step["name"] in SHARED_STEPS else replacements)
             for step in document["steps"]}
    for name in claim.scaled:
        for stage in steps[name]["stages"]:
            stage["steps"] = max(2, round(stage["steps"] * scale))
            stage["warmup_steps"] = round(stage.get("warmup_steps", 0) * scale)
    if claim.compare:
        runs = list(dict.fromkeys(name for pair in claim.compare for name in pair))
        steps["report"] = {"name": "report", "kind": "report", "runs": [f"${{{name}}}" for name in runs],
                           "compare": [[f"${{{a}}}", f"${{{b}}}"] for a, b in claim.compare]}
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, kept in (("shared", SHARED_STEPS), ("runs", (*claim.steps, *(("report",) if claim.compare else ())))):
        path = work / f"{claim.pipeline.stem}-{name}.yaml"
        path.write_text(yaml.safe_dump({"name": f"{document['name']}-{name}", "steps": [steps[k] for k in kept]},
                                       sort_keys=False))
        paths.append(path)
    return paths[0], paths[1]


def split_settings(settings: list[str]) -> tuple[list[str], list[str]]:
    """(the settings of the shared steps, those of a run's steps), by the step each names."""
    shared = [setting for setting in settings if setting.split(".", 1)[0] in SHARED_STEPS]
    return shared, [setting for setting in settings if setting not in shared]


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
            shared_settings, run_settings = split_settings(args.set)
            run_pipeline(code, shared, work / name / "shared", 1, shared_settings)
            where = "" if code == ROOT else f", the code at {code}"
            settings = "".join(f", --set {setting}" for setting in args.set)
            run_text = f"({claim.pipeline.name}, steps × {args.scale}{where}{settings})"
            for effect, e in claim.effects.items():
                print(f"\n{effect}: {e.description} {run_text}", end="", flush=True)
            print(flush=True)
            held: dict[str, list[bool]] = {effect: [] for effect in claim.effects}
            for threads in thread_counts:
                for seed in seeds:
                    out = work / name / f"seed{seed}-threads{threads}"
                    seeding = [f"{step}.seed={seed}" for step in claim.seeded]
                    wall = run_pipeline(code, runs, out, threads, [*seeding, *run_settings])
                    for effect, e in claim.effects.items():
                        result = e.judge(out)
                        if result.threads != threads:
                            raise SystemExit(f"{out}: the run recorded {result.threads} thread(s), not {threads}")
                        held[effect].append(result.holds)
                        named = f"{effect}, " if len(claim.effects) > 1 else ""
                        print(f"  {named}seed {seed}, {result.threads} thread(s), {wall:.0f} s: {result.figure}: "
                              f"{'holds' if result.holds else 'does NOT hold'}", flush=True)
                        for line in result.details:
                            print(f"    {line}", flush=True)
            for effect, verdicts in held.items():
                print(f"{effect}: holds in {sum(verdicts)} of {len(verdicts)} runs", flush=True)


if __name__ == "__main__":
    main()
