"""Progress of long work: a bar on a terminal, a plain line now and then in a redirected log.

A bar redraws itself many times a second; in a log file each redraw stays, which filled 1 MB for
one demo run. Off a terminal the same calls print one line every `every_s` seconds, and one at the
end of work that printed any (work shorter than that prints nothing: its command reports it anyway).

Where PROGRESS_VARIABLE names a file (a pipeline executor sets it for a step's process), the bar also
publishes a snapshot there every SNAPSHOT_EVERY_S seconds (what, how far, how fast), which the
executor's status lines and `vlbert pipeline status` read with `progress_summary`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, TextIO

from tqdm import tqdm

from vlbert.utils import step_environment
from vlbert.utils.atomic import file_written_whole

LOG_EVERY_S = 60.0
PROGRESS_VARIABLE = step_environment.PROGRESS_FILE
SNAPSHOT_EVERY_S = 2.0


def progress_bar(total: int | None, desc: str = "", unit: str = "it", initial: int = 0, enabled: bool = True,
                 leave: bool = True, file: TextIO | None = None, every_s: float = LOG_EVERY_S):
    """A tqdm bar when `file` (default: stderr) is a terminal, else a `ProgressLines` with the same
    `update`/`set_postfix`/`close` calls; nothing at all when not `enabled`."""
    file = sys.stderr if file is None else file
    if enabled and not _is_terminal(file):
        bar = ProgressLines(total, desc, unit, initial, file, every_s)
    else:
        bar = tqdm(total=total, desc=desc or None, unit=unit, initial=initial, disable=not enabled, leave=leave,
                   file=file, dynamic_ncols=True)
    published = os.environ.get(PROGRESS_VARIABLE)
    return PublishedProgress(bar, Path(published), total, desc, unit, initial) if enabled and published else bar


def _is_terminal(file: TextIO) -> bool:
    isatty = getattr(file, "isatty", None)
    return bool(isatty and isatty())


class ProgressLines:
    """`desc: done/total unit (percent, rate/s) postfix` every `every_s` seconds, and at the end after
    any such line."""

    def __init__(self, total: int | None, desc: str, unit: str, initial: int, file: TextIO, every_s: float) -> None:
        self.total, self.desc, self.unit, self.file, self.every_s = total, desc, unit, file, every_s
        self.n = self._start_n = initial
        self._start = self._last = time.monotonic()
        self._postfix = ""
        self._printed = self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last >= self.every_s:
            self._print()

    def set_postfix(self, **values: Any) -> None:
        self._postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._printed:
                self._print()

    def _print(self) -> None:
        now = time.monotonic()
        self._last, self._printed = now, True
        rate = (self.n - self._start_n) / max(now - self._start, 1e-9)
        print(progress_line(self.desc, self.n, self.total, self.unit, rate, self._postfix), file=self.file, flush=True)

    def __enter__(self) -> "ProgressLines":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class PublishedProgress:
    """A bar that also writes a snapshot of itself to `path` now and then (see the module's docstring)."""

    def __init__(self, bar, path: Path, total: int | None, desc: str, unit: str, initial: int) -> None:
        self.bar, self.path = bar, path
        self.snapshot = {"desc": desc, "unit": unit, "n": initial, "total": total, "postfix": ""}
        self._start_n, self._start, self._last = initial, time.monotonic(), 0.0

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        self.snapshot["n"] += n
        if time.monotonic() - self._last >= SNAPSHOT_EVERY_S:
            self._publish()

    def set_postfix(self, **values: Any) -> None:
        self.bar.set_postfix(**values)
        self.snapshot["postfix"] = ", ".join(f"{key}={value}" for key, value in values.items())

    def close(self) -> None:
        self.bar.close()
        self._publish()

    def _publish(self) -> None:
        now = time.monotonic()
        self._last = now
        rate = (self.snapshot["n"] - self._start_n) / max(now - self._start, 1e-9)
        try:
            with file_written_whole(self.path) as tmp:
                tmp.write_text(json.dumps({**self.snapshot, "rate": rate, "time": time.time()}))
        except OSError:
            pass  # progress is a courtesy: a full disk stops the work, not this

    def __enter__(self) -> "PublishedProgress":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def progress_summary(paths: Iterable[Path]) -> str:
    """One line from the snapshots at `paths` (a step's processes; counts summed): `stage: 120/400 step
    (30%, 2.1 step/s, ETA 2m13s) loss=0.512`; "" when none is there yet."""
    snapshots = []
    for path in paths:
        try:
            snapshots.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            continue
    if not snapshots:
        return ""
    first = snapshots[0]
    totals = [s.get("total") for s in snapshots]
    total = sum(totals) if all(isinstance(t, int) and t > 0 for t in totals) else None
    return progress_line(first.get("desc", ""), sum(s.get("n", 0) for s in snapshots), total,
                         first.get("unit", "it"), sum(s.get("rate", 0.0) for s in snapshots), first.get("postfix", ""))


def progress_line(desc: str, n: int, total: int | None, unit: str, rate: float, postfix: str = "") -> str:
    """`desc: n/total unit (percent, rate, ETA) postfix`, the line of the console and of `pipeline status`."""
    done = f"{n}/{total}" if total else str(n)
    figures = [f"{100 * n / total:.0f}%"] if total else []
    figures.append(rate_text(rate, unit))
    if total and rate > 0 and n < total:
        figures.append(f"ETA {_duration((total - n) / rate)}")
    prefix = f"{desc}: " if desc else ""
    return f"{prefix}{done} {unit} ({', '.join(figures)})" + (f" {postfix}" if postfix else "")


def rate_text(rate: float, unit: str) -> str:
    """`2.1 step/s`, or for work slower than one a second `14.2 s/step` (a slow stage read 0.0/s)."""
    if rate >= 1:
        return f"{rate:.1f} {unit}/s"
    if rate > 0:
        return f"{1 / rate:.1f} s/{unit}"
    return f"no {unit} done yet"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
