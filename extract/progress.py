"""Progress of long work: a bar on a terminal, a plain line now and then in a redirected log.

A bar redraws itself many times a second; in a log file each redraw stays, which filled 1 MB for
one demo run. Off a terminal the same calls print one line every `every_s` seconds, and one at the
end of work that printed any (work shorter than that prints nothing: its command reports it anyway).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

LOG_EVERY_S = 60.0


def progress_bar(total: int | None, desc: str = "", unit: str = "it", initial: int = 0, enabled: bool = True,
                 leave: bool = True, file: TextIO | None = None, every_s: float = LOG_EVERY_S):
    """A tqdm bar when `file` (default: stderr) is a terminal, else a `ProgressLines` with the same
    `update`/`set_postfix`/`close` calls; nothing at all when not `enabled`."""
    file = sys.stderr if file is None else file
    if enabled and not _is_terminal(file):
        return ProgressLines(total, desc, unit, initial, file, every_s)
    return tqdm(total=total, desc=desc or None, unit=unit, initial=initial, disable=not enabled, leave=leave,
                file=file, dynamic_ncols=True)


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
        done = f"{self.n}/{self.total}" if self.total else str(self.n)
        share = f"{100 * self.n / self.total:.0f}%, " if self.total else ""
        rate = (self.n - self._start_n) / max(now - self._start, 1e-9)
        postfix = f" {self._postfix}" if self._postfix else ""
        prefix = f"{self.desc}: " if self.desc else ""
        print(f"{prefix}{done} {self.unit} ({share}{rate:.1f} {self.unit}/s){postfix}", file=self.file, flush=True)

    def __enter__(self) -> "ProgressLines":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
