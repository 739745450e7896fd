"""The report page's charts as inline SVG (text stays text, nothing is fetched): estimates with their
95% intervals against a reference (each row's chance level, or zero for differences), and the run's
timeline (a bar per step from its start to its end)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from pipelines.report.timeline import DONE, FAILED, NOT_RUN, UNFINISHED, UP_TO_DATE, StepRun

WIDTH = 980
LABEL_WIDTH = 300
PLOT_LEFT, PLOT_RIGHT = 312, 690
ROW = 22
TOP = 34  # the axis and the legend

STATE_COLOURS = {DONE: "#2ca02c", UP_TO_DATE: "#9e9e9e", FAILED: "#d62728", UNFINISHED: "#ff7f0e", NOT_RUN: "#9e9e9e"}


@dataclass
class Estimate:
    label: str
    value: float | None  # None: nothing to draw (the label and `note` say why)
    interval: list[float] | None = None
    reference: float | None = None  # the row's chance level
    strong: bool = False  # the row a run is reported by
    note: str = ""  # right of the plot; default: value and interval


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values from `low` to `high`, about `count` of them."""
    span = max(high - low, 1e-12)
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(factor for factor in (1, 2, 2.5, 5, 10) if raw <= step * factor)
    first = math.ceil(low / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step + 1e-9) + 1)]


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 12, weight: str = "normal",
          fill: str = "#222") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" font-weight="{weight}" '
            f'fill="{fill}">{escape(text)}</text>')


def _clipped(label: str, width: int, size: int = 12) -> str:
    """`label` cut to about `width` pixels of text (an ellipsis marks the cut)."""
    fits = int(width / (0.56 * size))
    return label if len(label) <= fits else label[:fits - 1] + "…"


def interval_chart(rows: list[Estimate], low: float, high: float, zero: float | None = None,
                   reference_name: str = "chance level") -> str:
    """A row per estimate: its value (a dot), its 95% interval (a bar) and its reference (a dashed red
    line across the row); `zero` draws one line across every row instead (differences)."""
    height = TOP + ROW * len(rows) + 8
    scale = (PLOT_RIGHT - PLOT_LEFT) / max(high - low, 1e-12)

    def x(value: float) -> float:
        return PLOT_LEFT + (min(max(value, low), high) - low) * scale

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" font-family="sans-serif">']
    for tick in nice_ticks(low, high):
        parts.append(f'<line x1="{x(tick):.1f}" y1="{TOP - 6}" x2="{x(tick):.1f}" y2="{height - 8}" stroke="#e4e4e4"/>')
        parts.append(_text(x(tick), TOP - 10, f"{tick:g}", "middle", 11, fill="#666"))
    legend = "● value   ━ 95% interval" + (f"   ┆ {reference_name}" if zero is None else "")
    parts.append(_text(PLOT_LEFT, 12, legend, size=11, fill="#444"))
    if zero is not None:
        parts.append(f'<line x1="{x(zero):.1f}" y1="{TOP - 6}" x2="{x(zero):.1f}" y2="{height - 8}" '
                     'stroke="#d62728" stroke-dasharray="4 3"/>')
    for index, row in enumerate(rows):
        middle = TOP + ROW * index + ROW / 2
        if index % 2 == 0:
            parts.append(f'<rect x="0" y="{middle - ROW / 2:.1f}" width="{WIDTH}" height="{ROW}" fill="#f6f6f6"/>')
        weight = "bold" if row.strong else "normal"
        parts.append(f"<g><title>{escape(row.label)}</title>"
                     + _text(LABEL_WIDTH, middle + 4, _clipped(row.label, LABEL_WIDTH - 8), "end", 12, weight) + "</g>")
        if row.reference is not None and zero is None:
            at = x(row.reference)
            parts.append(f'<line x1="{at:.1f}" y1="{middle - ROW / 2 + 2:.1f}" x2="{at:.1f}" '
                         f'y2="{middle + ROW / 2 - 2:.1f}" stroke="#d62728" stroke-width="2" stroke-dasharray="3 2"/>')
        if row.interval is not None:
            a, b = x(row.interval[0]), x(row.interval[1])
            parts.append(f'<line x1="{a:.1f}" y1="{middle:.1f}" x2="{b:.1f}" y2="{middle:.1f}" stroke="#1f77b4" '
                         'stroke-width="3"/>')
            parts += [f'<line x1="{end:.1f}" y1="{middle - 5:.1f}" x2="{end:.1f}" y2="{middle + 5:.1f}" '
                      'stroke="#1f77b4" stroke-width="2"/>' for end in (a, b)]
        if row.value is not None:
            parts.append(f'<circle cx="{x(row.value):.1f}" cy="{middle:.1f}" r="4.5" fill="#1f77b4" stroke="white"/>')
        note = row.note or (f"{row.value:.3f}" + (f"  [{row.interval[0]:.3f}, {row.interval[1]:.3f}]"
                                                   if row.interval else "") if row.value is not None else "")
        parts.append(_text(PLOT_RIGHT + 12, middle + 4, note, size=12, weight=weight))
    parts.append("</svg>")
    return "\n".join(parts)


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def time_ticks(span: float) -> list[tuple[float, str]]:
    """(seconds, label) of round ticks from 0 to `span` seconds, in seconds, minutes or hours."""
    unit, name = (1, "s") if span < 180 else (60, "min") if span < 3 * 3600 else (3600, "h")
    return [(tick * unit, f"{tick:g} {name}" if tick else "0") for tick in nice_ticks(0.0, span / unit)]


def timeline_chart(steps: list[StepRun], links: dict[str, tuple[str, str]]) -> str:
    """A row per step: a bar from its start to its end (seconds since the run's first step began) in
    the colour of its state; its name links to its log and the state to its step.json (`links`: step
    → (log, record) as the page names them)."""
    ran = [step for step in steps if step.state != UP_TO_DATE and step.start is not None]
    origin = min((step.start for step in ran), default=0.0)
    span = max((step.end - origin for step in ran if step.end is not None), default=1.0) or 1.0
    height = TOP + ROW * len(steps) + 8
    scale = (PLOT_RIGHT - PLOT_LEFT) / span
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" font-family="sans-serif">']
    for tick, label in time_ticks(span):
        at = PLOT_LEFT + tick * scale
        parts.append(f'<line x1="{at:.1f}" y1="{TOP - 6}" x2="{at:.1f}" y2="{height - 8}" stroke="#e4e4e4"/>')
        parts.append(_text(at, TOP - 10, label, "middle", 11, fill="#666"))
    parts.append(_text(8, 12, "seconds since the run's first step began; a bar from a step's start to its end",
                       size=11, fill="#444"))
    for index, step in enumerate(steps):
        middle = TOP + ROW * index + ROW / 2
        if index % 2 == 0:
            parts.append(f'<rect x="0" y="{middle - ROW / 2:.1f}" width="{WIDTH}" height="{ROW}" fill="#f6f6f6"/>')
        log, record = links[step.name]
        name = f"{step.name} ({step.kind})" if step.kind else step.name
        parts.append(f'<a href="{escape(log)}"><title>{escape(step.name)}: its log</title>'
                     + _text(LABEL_WIDTH, middle + 4, _clipped(name, LABEL_WIDTH - 8), "end", 12, fill="#0645ad")
                     + "</a>")
        colour = STATE_COLOURS[step.state]
        if step in ran and step.end is not None:
            left = PLOT_LEFT + (step.start - origin) * scale
            width = max((step.end - step.start) * scale, 2.0)
            parts.append(f'<rect x="{left:.1f}" y="{middle - 7:.1f}" width="{width:.1f}" height="14" rx="2" '
                         f'fill="{colour}"><title>{escape(step.name)}: {step.state}, '
                         f'{_duration(step.end - step.start)}</title></rect>')
        seconds = f", {_duration(step.seconds)}" if step.seconds is not None else ""
        about = f"{step.state}{seconds}" + (f", {step.resources()}" if step.resources() else "")
        target = (f'<a href="{escape(record)}"><title>{escape(step.name)}: its step.json</title>' if step.start
                  else "<g>")
        parts.append(target + _text(PLOT_RIGHT + 12, middle + 4, _clipped(about, WIDTH - PLOT_RIGHT - 16, 11), size=11,
                                    fill=colour) + ("</a>" if step.start else "</g>"))
    parts.append("</svg>")
    return "\n".join(parts)
