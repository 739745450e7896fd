"""Side-by-side report of training runs: report.json, report.md and a PNG of the loss curves.

A run is a train step's folder: one run, or one run per seed in it (`RunFolder.runs`). Each row
gives the value after the run's last stage (the mean over seeds, ± their sample standard deviation),
and the 95% bootstrap interval over evaluation items, from the item scores the last stage wrote
(averaged over seeds first). Comparisons pair two runs on the items both evaluated
(train/evaluation/statistics.py), and again within each group of items where both runs' item scores
carry the same grouping (VQA: answer types). Everything is read from the run folders; no model runs again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pipelines.execution import read_stamp
from pipelines.report.retrieval import RETRIEVAL_NOTE, retrieval_summary, retrieval_tables
from train.data.files import DataError
from train.engine.run_folder import RunFolder, StageFolder
from train.evaluation.item_scores import ItemGroups, ItemScores, averaged_over_seeds
from train.evaluation.markdown import markdown_row
from train.evaluation.statistics import RESAMPLES, Comparison, bootstrap_interval, paired_comparison, seed_spread
from vlbert.utils.atomic import file_written_whole, made_folder, write_atomically


@dataclass
class RunResults:
    """A report row and the item scores (averaged over seeds) that intervals and comparisons resample,
    with the items' groups where the task has them."""

    row: dict
    scores: dict[str, float]
    groups: ItemGroups | None = None


@dataclass(frozen=True)
class GroupComparisons:
    """A comparison's two runs compared again on the shared items of each group (VQA: answer type)."""

    name: str  # what a group is: "answer type"
    groups: list[tuple[str, Comparison]]  # (group, its comparison), groups in sorted order


def run_folders(folder: Path) -> list[RunFolder]:
    """The runs of a train step's folder: itself, or its seed runs by seed."""
    runs = RunFolder(folder).runs()
    if not runs:
        raise DataError(f"{folder}: not a training run (no run config, nor runs by seed in it)")
    return runs


def item_scores(run: RunFolder, stage: StageFolder | None = None) -> ItemScores:
    """Each evaluation item's score (and group) after `stage` (default: the run's last); no items where
    none was written (runs from before item scores, evaluations without per-item scores)."""
    path = (stage or run.last_stage()).item_scores(Path(run.config()["eval_annotations"]).stem)
    return ItemScores.read(path) if path.is_file() else ItemScores("", {})


def stage_results(runs: list[RunFolder], resamples: int = RESAMPLES) -> list[dict]:
    """Every stage of a step's runs (one, or one per seed), in order, as evaluated after it: its value
    (the mean over seeds, ± their standard deviation), chance level and 95% item interval (item scores
    averaged over seeds first); `done` false for a stage not evaluated yet in every seed."""
    results = []
    for index, stage in enumerate(runs[0].config()["stages"]):
        folders = [(run, run.stage(index, stage["name"])) for run in runs]
        if not all(folder.evaluation_file.is_file() for _, folder in folders):
            results.append({"stage": stage["name"], "visual": stage.get("visual", "cached"), "done": False})
            continue
        evals = [folder.evaluation() for _, folder in folders]
        spread = seed_spread([e["value"] for e in evals])
        scores = averaged_over_seeds([item_scores(run, folder) for run, folder in folders]).items
        results.append({"stage": stage["name"], "visual": evals[0]["visual"], "task": evals[0]["task"],
                        "metric": evals[0]["metric"], "value": spread.mean, "std": spread.std,
                        "chance": evals[0]["chance"], "items": len(scores), "done": True,
                        "interval": bootstrap_interval(list(scores.values()), resamples).to_list() if scores else None})
    return results


def _one_run(run: RunFolder) -> dict:
    """The run's last stage's evaluation, with wall time and throughput over all stages."""
    config = run.config()
    evals = [stage.evaluation() for stage in run.stages()]
    wall = sum(e["wall_s"] for e in evals)
    samples = sum(e["wall_s"] * e["samples_per_s"] for e in evals)
    return {"evals": evals, "wall_s": wall, "samples_per_s": samples / wall if wall else 0.0,
            "init_from": config.get("init_from"), "seed": config.get("seed", 0)}


def run_results(folder: Path, resamples: int = RESAMPLES) -> RunResults:
    """One report row: value (mean over seeds) ± std, the item interval, wall time and throughput
    (means over seeds), the stages, where the run started."""
    step = read_stamp(folder) or {}
    runs = run_folders(folder)
    summaries = [_one_run(run) for run in runs]
    first, last = summaries[0]["evals"], summaries[0]["evals"][-1]
    spread = seed_spread([s["evals"][-1]["value"] for s in summaries])
    scores = averaged_over_seeds([item_scores(run) for run in runs])
    tuned = any(e["visual"] == "end2end" for e in first)
    seeded = runs[0].root != folder
    stages = stage_results(runs, resamples)
    row = {"name": folder.name, "detector": step.get("params", {}).get("detector", "tuned" if tuned else "frozen"),
           "task": last["task"], "metric": last["metric"], "value": spread.mean, "chance": last["chance"],
           "std": spread.std, "seeds": [s["seed"] for s in summaries] if seeded else None,
           "seed_values": list(spread.values) if seeded else None,
           "items": len(scores.items), "interval": stages[-1]["interval"],
           "wall_s": round(sum(s["wall_s"] for s in summaries) / len(summaries), 2),
           "samples_per_s": round(sum(s["samples_per_s"] for s in summaries) / len(summaries), 2),
           "stages": [f"{e['stage']} ({e['visual']})" for e in first],
           "stage_results": stages,
           "init_from": _relative(summaries[0]["init_from"], folder.parent)}
    if last["task"] == "retrieval" and "recalls" in last:
        row["retrieval"] = retrieval_summary([s["evals"][-1] for s in summaries], sum(e["steps"] for e in first))
    return RunResults(row, scores.items, scores.groups)


def _relative(path: str | None, root: Path) -> str | None:
    """Where a run started from, relative to the pipeline's folder when it lies inside it."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def compare_runs(results: dict[str, RunResults], pairs: list[tuple[str, str]],
                 resamples: int = RESAMPLES) -> list[Comparison]:
    """Each pair (run folder A, run folder B) of `results`' keys compared on their shared items."""
    comparisons = []
    for a, b in pairs:
        for run in (a, b):
            if not results[run].scores:
                raise DataError(f"{run}: no item scores to compare (its last stage wrote none); "
                                "runs trained before item scores existed need training again")
        names = (results[a].row["name"], results[b].row["name"])
        comparisons.append(paired_comparison(results[a].scores, results[b].scores, names, resamples))
    return comparisons


def compare_groups(results: dict[str, RunResults], pairs: list[tuple[str, str]],
                   resamples: int = RESAMPLES) -> list[GroupComparisons | None]:
    """Each pair of `compare_runs` compared within each group of the items both runs scored and put in
    the same group; None for a pair whose runs do not both carry the same grouping."""
    return [_group_comparisons(results[a], results[b], resamples) for a, b in pairs]


def _group_comparisons(a: RunResults, b: RunResults, resamples: int) -> GroupComparisons | None:
    if a.groups is None or b.groups is None or a.groups.name != b.groups.name:
        return None
    members: dict[str, list[str]] = {}
    for item, group in a.groups.items.items():
        if item in a.scores and item in b.scores and b.groups.items.get(item) == group:
            members.setdefault(group, []).append(item)
    names = (a.row["name"], b.row["name"])
    groups = [(group, paired_comparison({item: a.scores[item] for item in items},
                                        {item: b.scores[item] for item in items}, names, resamples))
              for group, items in sorted(members.items())]
    return GroupComparisons(a.groups.name, groups) if groups else None


def _difference_record(comparison: Comparison) -> dict:
    return {"items": comparison.items, "difference": comparison.difference, "interval": comparison.interval.to_list(),
            "p_value": comparison.p_value, "resamples": comparison.resamples, "verdict": comparison.verdict()}


def _comparison_record(comparison: Comparison, by_group: GroupComparisons | None) -> dict:
    record = {"a": comparison.a, "b": comparison.b, **_difference_record(comparison)}
    if by_group is not None:
        record["by_group"] = {"name": by_group.name, "groups": [{"group": group, **_difference_record(c)}
                                                                for group, c in by_group.groups]}
    return record


def _value_text(row: dict) -> str:
    if row["std"] is None:
        return f"{row['value']:.3f}"
    return f"{row['value']:.3f} ± {row['std']:.3f} ({len(row['seeds'])} seeds)"


def _interval_text(interval: list[float] | None) -> str:
    return "—" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def runs_table(rows: list[dict]) -> list[str]:
    lines = ["| run | detector | task | metric | value | 95% interval (items) | chance | halfway to perfect "
             "| wall s | samples/s | stages | started from |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        halfway = "yes" if r["value"] >= (r["chance"] + 1.0) / 2 else "no"
        lines.append(markdown_row([r["name"], r["detector"], r["task"], r["metric"], _value_text(r),
                                   _interval_text(r["interval"]), f"{r['chance']:.3f}", halfway, f"{r['wall_s']:.1f}",
                                   f"{r['samples_per_s']:.1f}", ", ".join(r["stages"]), r["init_from"] or "scratch"]))
    return lines


def stages_table(rows: list[dict]) -> list[str]:
    """Every stage of every run, as evaluated after it (the runs table gives the last one's)."""
    lines = ["| run | stage | visual side | metric | value | 95% interval (items) | chance |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        for stage in row["stage_results"]:
            if not stage["done"]:
                lines.append(markdown_row([row["name"], stage["stage"], stage["visual"], "—", "not evaluated", "—",
                                           "—"]))
                continue
            value = _value_text({**stage, "seeds": row["seeds"]})
            lines.append(markdown_row([row["name"], stage["stage"], stage["visual"], stage["metric"], value,
                                       _interval_text(stage["interval"]), f"{stage['chance']:.3f}"]))
    return lines


def _difference_cells(c: Comparison) -> list[str]:
    return [str(c.items), f"{c.difference:+.3f}", _interval_text(c.interval.to_list()), c.p_text(), c.verdict()]


def comparisons_table(comparisons: list[Comparison]) -> list[str]:
    lines = ["| A | B | items | B − A | 95% interval (paired) | p | verdict |", "|---|---|---|---|---|---|---|"]
    lines += [markdown_row([c.a, c.b, *_difference_cells(c)]) for c in comparisons]
    return lines


def group_comparisons_tables(grouped: list[GroupComparisons | None]) -> dict[str, list[str]]:
    """A table per grouping (e.g. "answer type"): each comparison's row per group, groups in sorted order."""
    tables: dict[str, list[str]] = {}
    for by_group in grouped:
        if by_group is None:
            continue
        header = markdown_row(["A", "B", by_group.name, "items", "B − A", "95% interval (paired)", "p", "verdict"])
        lines = tables.setdefault(by_group.name, [header, "|---|---|---|---|---|---|---|---|"])
        lines += [markdown_row([c.a, c.b, group, *_difference_cells(c)]) for group, c in by_group.groups]
    return tables


RUNS_NOTE = (
    "`value` is the task metric on the evaluation split after the run's last stage; with several seeds,\n"
    "their mean ± sample standard deviation (`wall s` and `samples/s` are then means per seed).\n"
    "`95% interval (items)` is the percentile bootstrap interval of the mean over evaluation items\n"
    "(`resamples` in report.json; with several seeds each item's score is averaged over them first), so it\n"
    "shows how much the value would move on other items of the same kind. `chance` is the\n"
    "trivial baseline measured on the same split, which depends on the task: the majority answer for\n"
    "VQA, the most frequent right position for multiple choice, a uniformly random RoI for referring\n"
    "expressions, the most common masked word for pre-training. `halfway to perfect` says whether\n"
    "`value` closed at least half the gap between `chance` and 1 (value >= (chance + 1) / 2).\n"
    "`wall s` and `samples/s` cover the stages the run trained itself, not the checkpoint it started\n"
    "from. Float reductions differ between CPUs, so one seed's figures vary by machine: read them with\n"
    "their intervals, and compare runs measured on one machine.\n")

STAGES_NOTE = (
    "Each stage of a run is evaluated when it ends: a run's value above is its last stage's, which is not\n"
    "always its best (an appended end-to-end stage can end below the stage before it).\n")

COMPARISONS_NOTE = (
    "Each comparison pairs the two runs item by item on the evaluation items both scored: `B − A` is the\n"
    "mean difference, its interval a paired percentile bootstrap over items, and `p` the two-sided\n"
    "share of resampled differences on the other side of zero (doubled), so p < 0.05 when, and only\n"
    "when, the interval leaves 0 out (up to the quantiles' interpolation).\n")

GROUPS_NOTE = (
    "Each row pairs the two runs of a comparison on the shared items of one group only, as the comparisons\n"
    "above do on all of them (same bootstrap, same resamples). The rows are not corrected for multiple\n"
    "comparisons: with several groups each tested at 95%, one group's interval can leave 0 out by chance\n"
    "where the runs do not differ. Read them as where a difference comes from; the whole split's\n"
    "comparison above is the test.\n")


def write_report(run_dirs: list[str], out: Path, compare: list[tuple[str, str]] = (),
                 resamples: int = RESAMPLES) -> list[Path]:
    """report.json, report.md and loss_curves.png of the runs in `run_dirs` (train steps' folders), with a
    paired comparison for each (A, B) of `compare` (folders among `run_dirs`)."""
    results = {d: run_results(Path(d), resamples) for d in run_dirs}
    comparisons = compare_runs(results, list(compare), resamples)
    grouped = compare_groups(results, list(compare), resamples)
    rows = [results[d].row for d in run_dirs]
    made_folder(out)
    report_json = out / "report.json"
    document = {"resamples": resamples, "runs": rows,
                "comparisons": [_comparison_record(c, g) for c, g in zip(comparisons, grouped)]}
    write_atomically(report_json, json.dumps(document, indent=1) + "\n")
    text = "# Runs side by side\n\n" + "\n".join(runs_table(rows)) + "\n\n" + RUNS_NOTE
    text += "\n## Every stage\n\n" + "\n".join(stages_table(rows)) + "\n\n" + STAGES_NOTE
    retrieval = retrieval_tables(rows)
    if retrieval:
        text += "\n## Image–text retrieval\n\n" + "\n".join(retrieval) + "\n" + RETRIEVAL_NOTE
    if comparisons:
        text += "\n## Comparisons\n\n" + "\n".join(comparisons_table(comparisons)) + "\n\n" + COMPARISONS_NOTE
    for name, table in group_comparisons_tables(grouped).items():
        text += f"\n## Comparisons by {name}\n\n" + "\n".join(table) + "\n\n" + GROUPS_NOTE
    report_md = out / "report.md"
    write_atomically(report_md, text)
    curves = out / "loss_curves.png"
    with file_written_whole(curves) as temporary:
        plot_losses([run for d in run_dirs for run in run_folders(Path(d))], temporary)
    return [report_json, report_md, curves]


def _origin(run: RunFolder) -> tuple[RunFolder, int] | None:
    """(the run this run started from, the step of that run's checkpoint), when it started from a
    stage's final model of another run."""
    init_from = run.config().get("init_from")
    found = RunFolder.of_final(init_from) if init_from else None
    if found is None:
        return None
    source, stage = found
    return source, sum(s["steps"] for s in source.config()["stages"][: stage.index + 1])


def plot_losses(plotted: list[RunFolder], path: Path | BinaryIO) -> None:
    """Each run's loss against the optimizer steps since training began, so a run continuing another
    run's checkpoint (pre-training included) starts where that checkpoint was taken."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    offsets: dict[Path, int] = {}

    def offset(run: RunFolder) -> int:
        if run.root not in offsets:
            origin = _origin(run)
            offsets[run.root] = 0 if origin is None else offset(origin[0]) + origin[1]
        return offsets[run.root]

    runs = list({RunFolder(r.root.resolve()): None for r in plotted})
    for run in list(runs):
        origin = _origin(run)
        while origin is not None and RunFolder(origin[0].root.resolve()) not in runs:
            runs.insert(0, RunFolder(origin[0].root.resolve()))
            origin = _origin(origin[0])

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in runs:
        losses = [r["loss"] for r in run.metrics() if "step" in r]
        start = offset(run)
        # Markers where a run has few steps: a one-step stage would draw no line at all.
        ax.plot(range(start + 1, start + len(losses) + 1), losses, label=_label(run), linewidth=1,
                marker="o" if len(losses) < 30 else None, markersize=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer steps since training began")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


def _label(run: RunFolder) -> str:
    """A run's name in the plot: a seeded run's with its step's (`vqa/` before the seed run's folder)."""
    return f"{run.root.parent.name}/{run.root.name}" if run.seed is not None else run.root.name
