"""The main job that `make demo` runs: the demo pipeline on the embedded world."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, TextIO

from pipelines.runner import load_pipeline, run_pipeline, with_out
from pipelines.steps.report import rebuild_page

DEMO_PIPELINE = Path(__file__).parent / "configs" / "demo.yaml"


def run_demo(out: str | Path = "runs/demo", log: Callable[[str], None] = print, jobs: int | None = None,
             status_stream: TextIO | None = None) -> list[Path]:
    """Runs (or resumes) the demo pipeline, its independent steps side by side (`jobs`: at most so
    many at once); returns the report's files (JSON, Markdown, loss curves, and last the page of the
    run, report.html, rebuilt once every step has ended so that its timeline holds them all)."""
    root = run_pipeline(DEMO_PIPELINE, out, log=log, jobs=jobs, status_stream=status_stream)
    page, missing = rebuild_page(load_pipeline(DEMO_PIPELINE, with_out(DEMO_PIPELINE, out, {})))
    for line in missing:
        log(f"missing from the report: {line}")
    report = root / "report"
    return [report / "report.json", report / "report.md", report / "loss_curves.png", page]
