"""report.html: one page per pipeline run, whole in one file (inline SVG charts, PNG figures as data,
inline CSS; no script, nothing fetched), readable offline and in any browser.

It shows every train step's stages, each value with its 95% item interval and the chance level;
the paired comparisons with their intervals (also within each group of items, e.g. each VQA answer
type, where both runs carry groups); the runs, stages, comparisons and retrieval tables of report.md;
the loss curves of every train step; the run's timeline (each step's bar, its threads or GPUs, its
state, links to its log and step.json); a few images of each store with their boxes; and the
figures of the analyses. Everything is read from the run's folder (pipelines/report/timeline.py for the
steps), so a run that failed halfway gets its page too: what exists is shown, and what is missing
is named at the top. The report step writes it (pipelines/steps/report.py), and `vlbert pipeline
report` rebuilds it.
"""

from __future__ import annotations

import base64
import io
import os
import re
import time
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from pipelines.report.charts import Estimate, interval_chart, timeline_chart
from pipelines.report.retrieval import RETRIEVAL_NOTE, retrieval_tables
from pipelines.report.summary import (COMPARISONS_NOTE, GROUPS_NOTE, RUNS_NOTE, STAGES_NOTE, RunResults, compare_groups,
                              compare_runs, comparisons_table, group_comparisons_tables, plot_losses, run_results,
                              runs_table, stage_results, stages_table)
from pipelines.report.timeline import DONE, UP_TO_DATE, StepRun, step_runs
from train.engine.run_folder import RunFolder
from train.evaluation.markdown import markdown_cells
from train.evaluation.statistics import RESAMPLES, Comparison
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.errors import UserError
from vlbert.utils.paths import EscapingPathError, resolves_inside

HTML_FILE = "report.html"
STORE_PICTURES = 2  # images of each store drawn with their boxes
ANALYSIS_EXAMPLES = 4  # example pictures of an analysis shown (its heat maps and plots all are)

STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; } h4 { margin-bottom: 0.3em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; } th { background: #f0f0f0; }
.missing { background: #fff4e5; border: 1px solid #f0b86e; padding: 0.6em 1em; }
.note { color: #555; font-size: 0.85em; } .meta { color: #666; }
img { max-width: 100%; border: 1px solid #eee; } figure { margin: 1em 0; } figcaption { color: #555; }
.gallery { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.gallery figure { max-width: 48%; margin: 0; }
.state-failed { color: #d62728; } .state-unfinished { color: #ff7f0e; } .state-done { color: #2ca02c; }
"""


@dataclass
class RunEntry:
    """A train step of the page: its report row when every stage is evaluated, its stages as far as
    they got, and why it is incomplete."""

    name: str
    folder: Path
    results: RunResults | None = None
    stages: list[dict[str, Any]] = field(default_factory=list)
    missing: str = ""


def run_entry(folder: Path, resamples: int) -> RunEntry:
    entry = RunEntry(folder.name, folder)
    runs = RunFolder(folder).runs() if folder.is_dir() else []
    if not runs:
        entry.missing = "no training run in its folder (the step did not start)"
        return entry
    entry.stages = stage_results(runs, resamples)
    left = [stage["stage"] for stage in entry.stages if not stage["done"]]
    if left:
        entry.missing = f"stage{'s' if len(left) > 1 else ''} {', '.join(left)} not evaluated"
    else:
        entry.results = run_results(folder, resamples)
    return entry


def markdown_html(lines: list[str]) -> str:
    """The report's Markdown (pipe tables, `###` headings, paragraphs with `code`) as HTML."""
    html, table = [], []

    def flush() -> None:
        if table:
            rows = [markdown_cells(line) for line in table if not re.fullmatch(r"\|(-+\|)+", line.strip())]
            html.append("<table><tr>" + "".join(f"<th>{_inline(cell)}</th>" for cell in rows[0]) + "</tr>"
                        + "".join("<tr>" + "".join(f"<td>{_inline(cell)}</td>" for cell in row) + "</tr>"
                                  for row in rows[1:]) + "</table>")
            table.clear()

    for line in lines:
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("### "):
            html.append(f"<h4>{_inline(line[4:])}</h4>")
        elif line.strip():
            html.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(html)


def _inline(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def _note(text: str) -> str:
    return f'<p class="note">{_inline(" ".join(text.split()))}</p>'


def _png(data: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _figure(path: Path, caption: str) -> str:
    return f"<figure>{_png(path.read_bytes(), caption)}<figcaption>{escape(caption)}</figcaption></figure>"


def _link(path: Path, page: Path, text: str) -> str:
    return f'<a href="{escape(os.path.relpath(path, page.parent))}">{escape(text)}</a>'


def _results_section(entries: list[RunEntry]) -> str:
    if not entries:
        return ""
    rows = []
    for entry in entries:
        if not entry.stages:
            rows.append(Estimate(entry.name, None, note=entry.missing))
        for index, stage in enumerate(entry.stages):
            label = f"{entry.name} · {stage['stage']} ({stage['visual']})"
            if not stage["done"]:
                rows.append(Estimate(label, None, note="not evaluated"))
                continue
            last = index == len(entry.stages) - 1
            rows.append(Estimate(label, stage["value"], stage["interval"], stage["chance"], strong=last,
                                 note=f"{stage['value']:.3f}" + (f" [{stage['interval'][0]:.3f}, "
                                                                 f"{stage['interval'][1]:.3f}]" if stage["interval"]
                                                                 else "") + f", chance {stage['chance']:.3f}"))
    values = [v for row in rows for v in ([row.value, row.reference] + (row.interval or [])) if v is not None]
    low, high = (0.0, 1.0) if all(0.0 <= v <= 1.0 for v in values) else (min(values), max(values))
    complete = [entry.results.row for entry in entries if entry.results is not None]
    parts = ["<h2>Results</h2>",
             "<p>Every stage of every run, as evaluated when the stage ended; a run's reported value is its last "
             "stage's (bold).</p>", interval_chart(rows, low, high)]
    if complete:
        parts += [markdown_html(runs_table(complete)), _note(RUNS_NOTE), "<h3>Every stage</h3>",
                  markdown_html(stages_table(complete)), _note(STAGES_NOTE)]
        retrieval = retrieval_tables(complete)
        if retrieval:
            parts += ["<h3>Image–text retrieval</h3>", markdown_html(retrieval), _note(RETRIEVAL_NOTE)]
    return "\n".join(parts)


def _comparisons_section(entries: list[RunEntry], pairs: list[tuple[str, str]], resamples: int,
                         missing: list[str]) -> str:
    results = {entry.name: entry.results for entry in entries if entry.results is not None}
    shown = []
    for a, b in pairs:
        absent = [name for name in (a, b) if name not in results]
        if absent:
            missing.append(f"comparison {b} − {a}: {', '.join(absent)} without results")
        else:
            shown.append((a, b))
    if not shown:
        return ""
    comparisons = compare_runs(results, shown, resamples)
    grouped = compare_groups(results, shown, resamples)
    parts = ["<h2>Comparisons</h2>", _differences_chart([(f"{c.b} − {c.a}", c) for c in comparisons]),
             markdown_html(comparisons_table(comparisons)), _note(COMPARISONS_NOTE)]
    for name, table in group_comparisons_tables(grouped).items():
        labelled = [(f"{c.b} − {c.a} · {group}", c) for by_group in grouped
                    if by_group is not None and by_group.name == name for group, c in by_group.groups]
        parts += [f"<h3>Comparisons by {escape(name)}</h3>", _differences_chart(labelled), markdown_html(table),
                  _note(GROUPS_NOTE)]
    return "\n".join(parts)


def _differences_chart(labelled: list[tuple[str, Comparison]]) -> str:
    """Each comparison's difference with its paired interval, against 0, under its label."""
    rows = [Estimate(label, c.difference, c.interval.to_list(),
                     note=f"{c.difference:+.3f} [{c.interval.low:+.3f}, {c.interval.high:+.3f}], p {c.p_text()}")
            for label, c in labelled]
    reach = max(abs(v) for _, c in labelled for v in (c.difference, c.interval.low, c.interval.high)) * 1.15 or 0.05
    return interval_chart(rows, -reach, reach, zero=0.0)


def _loss_section(steps: list[StepRun]) -> str:
    runs = [run for step in steps if step.kind == "train" and step.folder.is_dir()
            for run in RunFolder(step.folder).runs() if run.metrics_file.is_file()]
    if not runs:
        return ""
    image = io.BytesIO()
    plot_losses(runs, image)
    return "<h2>Loss curves</h2>\n" + _png(image.getvalue(), "training loss of every train step")


def _timeline_section(steps: list[StepRun], page: Path) -> str:
    links = {step.name: (os.path.relpath(step.log, page.parent), os.path.relpath(step.record, page.parent))
             for step in steps}
    rows = []
    for step in steps:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(step.start)) if step.start else "—"
        seconds = f"{step.seconds:.1f}" if step.seconds is not None else "—"
        files = (_link(step.log, page, "log") if step.log.is_file() else "") + (
            " " + _link(step.record, page, "step.json") if step.record.is_file() else "")
        rows.append(f'<tr><td>{escape(step.name)}</td><td>{escape(step.kind or "—")}</td>'
                    f'<td class="state-{step.state.replace(" ", "-")}">{escape(step.state)}</td><td>{started}</td>'
                    f"<td>{seconds}</td><td>{escape(step.resources() or '—')}</td>"
                    f"<td>{escape(step.executor or '—')}</td><td>{files}</td><td>{escape(step.reason)}</td></tr>")
    return "\n".join(["<h2>Timeline</h2>", timeline_chart(steps, links),
                      "<table><tr><th>step</th><th>kind</th><th>state</th><th>started</th><th>seconds</th>"
                      "<th>threads, GPUs</th><th>executor</th><th>files</th><th>why</th></tr>",
                      *rows, "</table>",
                      _note("`up to date`: done in an earlier run and skipped in this one; `not run`: a step it "
                            "reads failed, or nothing started it; `unfinished`: started, and neither done nor "
                            "failed (still running, or stopped: a rerun resumes it).")])


def _stores_section(steps: list[StepRun], page: Path, missing: list[str]) -> str:
    from extract.store.reader import FeatureStore
    from pipelines.report.cache_show import show_records

    parts = []
    for step in steps:
        if step.kind != "extract" or step.state not in (DONE, UP_TO_DATE):
            continue
        try:
            ids = FeatureStore(step.folder).keys()[:STORE_PICTURES]
            shown = show_records(step.folder, ids, page.parent / "pictures" / step.name, top=10,
                                 log=lambda line: None)
        except EscapingPathError:
            raise  # the page is not written where a symlink would take its pictures
        except UserError as exc:  # a store that does not open, or that records no images root
            missing.append(f"{step.name}: its store cannot be drawn ({exc})")
            continue
        missing += [f"{step.name}: {problem}" for problem in shown.problems]
        parts += [f"<h4>{escape(step.name)}</h4>", '<div class="gallery">', *(
            _figure(picture, f"{image_id}: its {len(shown.pictures[image_id].boxes)} best boxes (vlbert cache show "
                             f"{step.folder} {image_id} --top 10)")
            for image_id, picture in zip(shown.pictures, shown.written)), "</div>"]
    return "\n".join(["<h2>Features</h2>", *parts]) if parts else ""


def _analyses_section(steps: list[StepRun], root: Path, missing: list[str]) -> str:
    from pipelines.steps.analyze import analysis_verdicts

    parts = []
    for step in steps:
        if step.kind != "analyze" or step.state not in (DONE, UP_TO_DATE):
            continue
        try:
            verdicts = analysis_verdicts(step.folder)
        except UserError as exc:  # a result file that is no JSON object
            missing.append(f"{step.name}: its verdicts cannot be read ({exc})")
            verdicts = []
        figures = sorted(step.folder.glob("*.png")) + sorted(step.folder.glob("layers/*.png")) \
            + sorted(step.folder.glob("examples/*.png"))[:ANALYSIS_EXAMPLES]
        shown = []
        for path in figures:
            name = path.relative_to(step.folder).as_posix()
            if _in_run_folder(path, root):
                shown.append(_figure(path, name))
            else:
                missing.append(f"{step.name}: figure {name} not shown: no regular file inside the run folder "
                               "(a symlink out of it, or a loop)")
        said = ["<ul>", *(f"<li>{escape(line)}</li>" for line in verdicts), "</ul>"] if verdicts else []
        parts += [f"<h4>{escape(step.name)}</h4>", *said, '<div class="gallery">', *shown, "</div>"]
    return "\n".join(["<h2>Analyses</h2>", *parts]) if parts else ""


def _in_run_folder(path: Path, root: Path) -> bool:
    """Whether `path` is a regular file, itself or through symlinks that stay inside `root`: what is embedded
    in the page is read from the run's folder, never from elsewhere (a link to /etc/passwd)."""
    return Path(os.path.realpath(path)).is_file() and resolves_inside(path, root)  # a loop is no file


def write_html_report(root: Path, page: Path, pipeline=None,
                      runs: list[str] | None = None, pairs: list[tuple[str, str]] = (), writer: str | None = None,
                      resamples: int = RESAMPLES) -> list[str]:
    """report.html at `page` for the pipeline run in `root`: `pipeline` (runner.Pipeline, when its file
    is at hand: pipelines/report/timeline.py), the report step's `runs` (train steps'
    folders, shown first, then the other train steps) and `pairs` of them to compare. `writer` names
    the step writing the page as its last act, shown done. Returns what is missing from it, one line
    each (also listed at the top of the page)."""
    root, page = Path(root), Path(page)
    recorded = step_runs(root, pipeline)
    for step in recorded:
        if step.name == writer:
            step.state = DONE
    by_name = {step.name: step for step in recorded}
    # The report's runs first, then every other train step (a pre-training the runs start from).
    folders = [Path(run) if Path(run).is_dir() else root / Path(run).name for run in runs or []]
    folders += [step.folder for step in recorded if step.kind == "train" and step.folder.name not in
                {folder.name for folder in folders}]
    entries = [run_entry(folder, resamples) for folder in folders]
    missing = [f"{step.name}: {step.state}" + (f" ({step.reason})" if step.reason else "")
               for step in recorded if step.state not in (DONE, UP_TO_DATE)]
    missing += [f"{entry.name}: {entry.missing}" for entry in entries
                if entry.missing and (entry.name not in by_name or by_name[entry.name].state in (DONE, UP_TO_DATE))]
    named_pairs = [(Path(a).name, Path(b).name) for a, b in pairs]
    sections = [_results_section(entries), _comparisons_section(entries, named_pairs, resamples, missing),
                _loss_section(recorded), _timeline_section(recorded, page), _stores_section(recorded, page, missing),
                _analyses_section(recorded, root, missing)]
    header = [f"<h1>Pipeline run {escape(root.resolve().name)}</h1>",
              f'<p class="meta">{escape(str(root.resolve()))} · page written '
              f"{time.strftime('%Y-%m-%d %H:%M:%S')} · {len(recorded)} steps, "
              f"{sum(step.state in (DONE, UP_TO_DATE) for step in recorded)} done</p>"]
    if missing:
        header.append('<div class="missing"><b>Not in this report, or not complete:</b><ul>'
                      + "".join(f"<li>{escape(line)}</li>" for line in missing) + "</ul></div>")
    made_folder(page.parent)
    write_atomically(page, "\n".join(['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
                                      f"<title>Pipeline run {escape(root.resolve().name)}</title>",
                                      f"<style>{STYLE}</style></head><body>", *header,
                                      *(section for section in sections if section), "</body></html>"]) + "\n")
    return missing
