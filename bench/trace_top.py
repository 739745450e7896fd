"""A torch.profiler trace of a few steps, and its top: where a step's time goes, section by section.

A benchmark names its sections (`Section`: a label and the function it wraps, patched in place while
the trace runs), profiles a few steps (`profiled`) and prints `top(trace)`. Per section: host ms per
step (the wall time of its calls, on whichever thread), of that the host's wait in CUDA calls that
block (synchronize, copies to the host), and the device ms of the kernels, copies and fills it
launched. Launches are matched to kernels by the trace's correlation ids, so the device time of a
section is known even though the device runs it later. The GPU's busy share is the union of the
device's intervals over the profiled window: it says how much of the wall time the device computed.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import json
import shutil
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# CUDA runtime calls in which the host waits for the device.
WAITING_CALLS = ("Synchronize", "cudaMemcpy", "cudaStreamWaitEvent")
TRACE_NAME = "trace.json.gz"


@dataclass(frozen=True)
class Section:
    """`owner.attribute` (a function or method) runs inside record_function(`label`) while traced.
    `per_item`: the attribute returns an iterator, and each item's production is the section (a wait
    for data)."""

    label: str
    owner: Any
    attribute: str
    per_item: bool = False


@contextmanager
def sections_marked(sections: Sequence[Section]) -> Iterator[None]:
    with ExitStack() as stack:
        for section in sections:
            original = getattr(section.owner, section.attribute)
            stack.callback(setattr, section.owner, section.attribute, original)
            setattr(section.owner, section.attribute, _marked(section, original))
        yield


def _marked(section: Section, function: Callable) -> Callable:
    if section.per_item:
        @functools.wraps(function)
        def each_item(*args, **kwargs):
            items = iter(function(*args, **kwargs))
            while True:
                with record_function(section.label):
                    item = next(items, _END)
                if item is _END:
                    return
                yield item
        return each_item

    @functools.wraps(function)
    def marked(*args, **kwargs):
        with record_function(section.label):
            return function(*args, **kwargs)
    return marked


_END = object()


@contextmanager
def profiled(folder: Path, skip: int, steps: int) -> Iterator[Callable[[], None]]:
    """Profiles steps `skip + 1` to `skip + steps` (one more before them warms the profiler up);
    yields the function to call at the end of each step. The trace lands in `folder`/TRACE_NAME."""
    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])

    def save(prof) -> None:
        plain = folder / "trace.json"
        prof.export_chrome_trace(str(plain))
        with plain.open("rb") as source, gzip.open(folder / TRACE_NAME, "wb") as target:
            shutil.copyfileobj(source, target)
        plain.unlink()

    with profile(activities=activities, schedule=schedule(skip_first=skip, wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=save, experimental_config=_every_thread()) as prof:
        yield prof.step


def _every_thread():
    """Traces threads started after the profiler too (a job's commit thread), where torch can
    (2.7 or later); elsewhere only the thread that started it and the threads that were running."""
    from torch._C._profiler import _ExperimentalConfig

    try:
        return _ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return None


def top(trace: Path, labels: Sequence[str], step_name: str = "step") -> list[str]:
    """The table of where the profiled steps' time went, by section, from a saved trace."""
    events = [e for e in json.loads(gzip.open(trace).read())["traceEvents"] if e.get("ph") == "X"]
    # The profiler marks each active step (ProfilerStep#N): they make the window.
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"] in labels]
    if not steps or not ranges:
        return [f"no section ran in a profiled {step_name} (too few {step_name}es for the profile?)"]
    start = min(e["ts"] for e in steps)
    end = max(e["ts"] + e["dur"] for e in steps)
    ranges = [e for e in ranges if e["ts"] < end and e["ts"] + e["dur"] > start]
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    launched = {e["args"]["correlation"]: e for e in device if "correlation" in e.get("args", {})}
    by_thread: dict[Any, list[dict]] = {}
    for e in sorted(ranges, key=lambda e: e["ts"]):
        by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    starts = {thread: [e["ts"] for e in sorted_ranges] for thread, sorted_ranges in by_thread.items()}
    host = {label: 0.0 for label in labels}
    calls = {label: 0 for label in labels}
    waiting = {label: 0.0 for label in labels}
    device_time = {label: 0.0 for label in [*labels, "(no section)"]}
    for e in ranges:
        host[e["name"]] += e["dur"]
        calls[e["name"]] += 1
    for call in (e for e in events if e.get("cat") == "cuda_runtime" and start <= e["ts"] <= end):
        thread = (call["pid"], call["tid"])
        label = _innermost(by_thread.get(thread, []), starts.get(thread, []), call["ts"])
        if label is not None and any(name in call["name"] for name in WAITING_CALLS):
            waiting[label] += call["dur"]
        kernel = launched.get(call.get("args", {}).get("correlation"))
        if kernel is not None:
            device_time[label or "(no section)"] += kernel["dur"]
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in device], start, end)
    window, count = end - start, len(steps)
    lines = [f"{count} {step_name}es profiled, {window / 1000 / count:.1f} ms each"
             + (f"; the device busy {busy / window:.0%} of that (union of kernels, copies and fills)" if device
                else "; no device activity in the trace")]
    lines.append(f"{'section':24s} {'calls':>6s} {'host ms':>9s} {'of it waiting':>13s} {'device ms':>10s}"
                 f"   (calls in all; times per {step_name})")
    for label in labels:
        if calls[label]:
            lines.append(f"{label:24s} {calls[label]:6d} {host[label] / 1000 / count:9.2f} "
                         f"{waiting[label] / 1000 / count:13.2f} {device_time[label] / 1000 / count:10.2f}")
    if device_time["(no section)"]:
        lines.append(f"{'(no section)':24s} {'':>6s} {'':>9s} {'':>13s} "
                     f"{device_time['(no section)'] / 1000 / count:10.2f}")
    return lines


def _innermost(ranges: list[dict], starts: list[float], moment: float) -> str | None:
    """The label of the latest-starting range (of one thread; `starts` their sorted starts) that holds `moment`."""
    index = bisect.bisect_right(starts, moment)
    for e in reversed(ranges[:index]):
        if e["ts"] <= moment <= e["ts"] + e["dur"]:
            return e["name"]
    return None


def _union(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Total length of the union of `intervals` clipped to [start, end]."""
    total, reach = 0.0, start
    for low, high in sorted(intervals):
        low, high = max(low, reach), min(high, end)
        if high > low:
            total += high - low
            reach = high
    return total
