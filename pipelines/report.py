"""Side-by-side report of training runs: report.json, report.md and a PNG of the loss curves."""

from __future__ import annotations

import json
from pathlib import Path


def run_summary(run_dir: Path) -> dict:
    """One report row: the run's last stage's evaluation, with wall time and throughput over all stages."""
    step = json.loads((run_dir / "step.json").read_text()) if (run_dir / "step.json").is_file() else {}
    run = json.loads((run_dir / "run.json").read_text())
    stages = run["stages"]
    evals = [json.loads((run_dir / "stages" / f"{i}-{s['name']}" / "eval.json").read_text())
             for i, s in enumerate(stages)]
    wall = sum(e["wall_s"] for e in evals)
    samples = sum(e["wall_s"] * e["samples_per_s"] for e in evals)
    last = evals[-1]
    tuned = any(e["visual"] == "end2end" for e in evals)
    return {"name": run_dir.name, "detector": step.get("params", {}).get("detector", "tuned" if tuned else "frozen"),
            "task": last["task"], "metric": last["metric"], "value": last["value"], "chance": last["chance"],
            "wall_s": round(wall, 2), "samples_per_s": round(samples / wall, 2) if wall else 0.0,
            "stages": [f"{e['stage']} ({e['visual']})" for e in evals],
            "init_from": _relative(run.get("init_from"), run_dir.parent)}


def _relative(path: str | None, root: Path) -> str | None:
    """Where a run started from, relative to the pipeline's folder when it lies inside it."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def write_report(run_dirs: list[str], out: Path) -> list[Path]:
    runs = [run_summary(Path(d)) for d in run_dirs]
    out.mkdir(parents=True, exist_ok=True)
    report_json = out / "report.json"
    report_json.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    report_md = out / "report.md"
    lines = ["| run | detector | task | metric | value | chance | halfway to perfect | wall s | samples/s | stages "
             "| started from |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        halfway = "yes" if r["value"] >= (r["chance"] + 1.0) / 2 else "no"
        lines.append(f"| {r['name']} | {r['detector']} | {r['task']} | {r['metric']} | {r['value']:.3f} | "
                     f"{r['chance']:.3f} | {halfway} | {r['wall_s']:.1f} | {r['samples_per_s']:.1f} | "
                     f"{', '.join(r['stages'])} | {r['init_from'] or 'scratch'} |")
    report_md.write_text(
        "# Runs side by side\n\n" + "\n".join(lines) + "\n\n"
        "`value` is the task metric on the evaluation split after the run's last stage. `chance` is the\n"
        "trivial baseline measured on the same split, which depends on the task: the majority answer for\n"
        "VQA, the most frequent right position for multiple choice, a uniformly random RoI for referring\n"
        "expressions, the most common masked word for pre-training. `halfway to perfect` says whether\n"
        "`value` closed at least half the gap between `chance` and 1 (value >= (chance + 1) / 2).\n"
        "`wall s` and `samples/s` cover the stages the run trained itself, not the checkpoint it started\n"
        "from. Figures from one seed vary with the CPU (float reductions differ): compare runs measured\n"
        "on one machine.\n")
    curves = out / "loss_curves.png"
    _plot_losses([Path(d) for d in run_dirs], curves)
    return [report_json, report_md, curves]


def _origin(run_dir: Path) -> tuple[Path, int] | None:
    """(the run this run started from, the step of that run's checkpoint), when it started from a
    stage of another run's `stages/<i>-<name>/final`."""
    init_from = json.loads((run_dir / "run.json").read_text()).get("init_from")
    if not init_from:
        return None
    stage_dir = Path(init_from).parent
    source = stage_dir.parent.parent
    if not (source / "run.json").is_file():
        return None
    stages = json.loads((source / "run.json").read_text())["stages"]
    upto = int(stage_dir.name.split("-", 1)[0])
    return source, sum(stage["steps"] for stage in stages[: upto + 1])


def _plot_losses(run_dirs: list[Path], path: Path) -> None:
    """Each run's loss against the optimizer steps since training began, so a run continuing another
    run's checkpoint (pre-training included) starts where that checkpoint was taken."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offsets: dict[Path, int] = {}

    def offset(run_dir: Path) -> int:
        if run_dir not in offsets:
            origin = _origin(run_dir)
            offsets[run_dir] = 0 if origin is None else offset(origin[0]) + origin[1]
        return offsets[run_dir]

    runs = list(dict.fromkeys(r.resolve() for r in run_dirs))
    for run_dir in list(runs):
        origin = _origin(run_dir)
        while origin is not None and origin[0].resolve() not in runs:
            runs.insert(0, origin[0].resolve())
            origin = _origin(origin[0])

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run_dir in runs:
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in records if "step" in r]
        start = offset(run_dir)
        ax.plot(range(start + 1, start + len(losses) + 1), losses, label=run_dir.name, linewidth=1)
    ax.set_xlabel("optimizer steps since training began")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
