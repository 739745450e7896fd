"""Side-by-side report of training runs: report.json, report.md and a PNG of the loss curves."""

from __future__ import annotations

import json
from pathlib import Path


def run_summary(run_dir: Path) -> dict:
    """One report row: the run's last stage's evaluation, with wall time and throughput over all stages."""
    step = json.loads((run_dir / "step.json").read_text()) if (run_dir / "step.json").is_file() else {}
    stages = json.loads((run_dir / "run.json").read_text())["stages"]
    evals = [json.loads((run_dir / "stages" / f"{i}-{s['name']}" / "eval.json").read_text())
             for i, s in enumerate(stages)]
    wall = sum(e["wall_s"] for e in evals)
    samples = sum(e["wall_s"] * e["samples_per_s"] for e in evals)
    last = evals[-1]
    tuned = any(e["visual"] == "end2end" for e in evals)
    return {"name": run_dir.name, "detector": step.get("params", {}).get("detector", "tuned" if tuned else "frozen"),
            "task": last["task"], "metric": last["metric"], "value": last["value"], "chance": last["chance"],
            "wall_s": round(wall, 2), "samples_per_s": round(samples / wall, 2) if wall else 0.0,
            "stages": [f"{e['stage']} ({e['visual']})" for e in evals]}


def write_report(run_dirs: list[str], out: Path) -> list[Path]:
    runs = [run_summary(Path(d)) for d in run_dirs]
    out.mkdir(parents=True, exist_ok=True)
    report_json = out / "report.json"
    report_json.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    report_md = out / "report.md"
    lines = ["| run | detector | task | metric | value | chance | halfway to perfect | wall s | samples/s | stages |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        halfway = "yes" if r["value"] >= (r["chance"] + 1.0) / 2 else "no"
        lines.append(f"| {r['name']} | {r['detector']} | {r['task']} | {r['metric']} | {r['value']:.3f} | "
                     f"{r['chance']:.3f} | {halfway} | {r['wall_s']:.1f} | {r['samples_per_s']:.1f} | "
                     f"{', '.join(r['stages'])} |")
    report_md.write_text("# Runs side by side\n\n" + "\n".join(lines) + "\n")
    curves = out / "loss_curves.png"
    _plot_losses([Path(d) for d in run_dirs], curves)
    return [report_json, report_md, curves]


def _plot_losses(run_dirs: list[Path], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run_dir in run_dirs:
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in records if "step" in r]
        ax.plot(range(1, len(losses) + 1), losses, label=run_dir.name, linewidth=1)
    ax.set_xlabel("optimizer step (stages in sequence)")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
