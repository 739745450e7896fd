"""The report's retrieval table: Unicoder-VL's Table 1 layout, a row per run (zero-shot, fine-tuned
from scratch, fine-tuned after pre-training), Recall@1/5/10 image→text and text→image, each with its
95% interval, on the whole split and, where the evaluation made folds, as the mean over them (COCO
1K against 5K). Read from the runs' evaluations (`train.tasks.retrieval.RetrievalRecall`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from train.evaluation.markdown import markdown_row
from train.evaluation.retrieval import RECALL_AT

RECALLS = [f"{direction}_r{k}" for direction in ("i2t", "t2i") for k in RECALL_AT]


def retrieval_summary(evals: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """A run's retrieval results from its seeds' last evaluations: `setting` (zero-shot, evaluation only,
    or fine-tuned for `steps`), and per protocol the recalls (means over seeds), their intervals (one
    seed only: the bootstrap over queries does not cover seeds) and the chance recalls."""
    last = evals[0]
    if last.get("zero_shot"):
        setting = "zero-shot"
    elif last.get("evaluation_only"):
        setting = "evaluation only"
    else:
        setting = f"fine-tuned, {steps} steps"
    protocols = {"whole split": evals}
    if all("recalls" in e.get("folds", {}) for e in evals):
        protocols[f"mean over {last['folds']['folds']} folds of {last['folds']['fold_images']} images"] = \
            [e["folds"] for e in evals]
    return {"setting": setting, "images": last["images"], "captions": last["samples"],
            "protocols": {name: _protocol(parts) for name, parts in protocols.items()}}


def _protocol(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    intervals = seeds[0].get("recall_intervals") if len(seeds) == 1 else None
    return {"recalls": {name: round(float(np.mean([s["recalls"][name] for s in seeds])), 4) for name in RECALLS},
            "recall_intervals": intervals, "chance_recalls": seeds[0]["chance_recalls"]}


def retrieval_tables(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown tables of the rows that are retrieval runs, one per protocol; empty without any."""
    rows = [row for row in rows if row.get("retrieval")]
    lines: list[str] = []
    for protocol in dict.fromkeys(name for row in rows for name in row["retrieval"]["protocols"]):
        shown = [row for row in rows if protocol in row["retrieval"]["protocols"]]
        header = " | ".join(_header(name) for name in RECALLS)
        lines += [f"### {protocol}", "", f"| run | setting | started from | images × captions | {header} |",
                  "|---|---|---|---|" + "---|" * len(RECALLS)]
        for row in shown:
            found = row["retrieval"]["protocols"][protocol]
            intervals = found["recall_intervals"] or {}
            cells = [f"{found['recalls'][n]:.3f} {_interval(intervals.get(n))}{_above(intervals.get(n), found, n)}"
                     .strip() for n in RECALLS]
            lines.append(markdown_row([row["name"], row["retrieval"]["setting"], row["init_from"] or "scratch",
                                       f"{row['retrieval']['images']} × {row['retrieval']['captions']}", *cells]))
        chance = shown[0]["retrieval"]["protocols"][protocol]["chance_recalls"]
        lines += ["| random ranking | | | | " + " | ".join(f"{chance[n]:.3f}" for n in RECALLS) + " |", ""]
    return lines


def _header(name: str) -> str:
    direction, k = name.split("_r")
    return f"{'image→text' if direction == 'i2t' else 'text→image'} R@{k}"


def _above(interval: list[float] | None, found: dict[str, Any], name: str) -> str:
    """" ▲" where the whole interval lies above the random ranking's recall."""
    return " ▲" if interval is not None and interval[0] > found["chance_recalls"][name] else ""


def _interval(interval: list[float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


RETRIEVAL_NOTE = (
    "Unicoder-VL's Table 1 layout. Each cell is Recall@K with its 95% percentile-bootstrap interval over the\n"
    "queries (images for image→text, captions for text→image); in a fold protocol each recall is the mean of\n"
    "the folds' recalls (every fold ranks its own images and captions only, as COCO's 1K test averages 5 folds\n"
    "of 1,000 images) and the queries are resampled within each fold. `zero-shot` rows trained nothing: an\n"
    "evaluation-only stage (`steps: 0`) of a model that was never trained on retrieval (pre-trained with\n"
    "`relationship: true`, scored by that head). ▲: the interval lies above the random ranking's recall on the\n"
    "row's split (the last line gives the first row's).\n")
