"""What a run says while it goes on: events as lines and, for each running step, its progress line."""

from __future__ import annotations

import time
from typing import Callable, TextIO

Log = Callable[[str], None]
STATUS_EVERY_S = 30.0  # status lines when the output is not a terminal


class StatusBoard:
    """Events as lines; on a terminal, below them, a line per running step redrawn every second;
    elsewhere, those lines every STATUS_EVERY_S seconds."""

    def __init__(self, log: Log, stream: TextIO | None) -> None:
        self.log, self.stream = log, stream
        self.live = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.shown = 0  # lines of the live block on the screen
        self.last = time.monotonic()

    def event(self, message: str) -> None:
        self._clear()
        self.log(message)

    def refresh(self, lines: list[str]) -> None:
        now = time.monotonic()
        if self.live:
            if now - self.last >= 1.0:
                self._clear()
                self.stream.write("".join(line + "\n" for line in lines))
                self.stream.flush()
                self.shown, self.last = len(lines), now
        elif lines and now - self.last >= STATUS_EVERY_S:
            for line in lines:
                self.log(f"  {line}")
            self.last = now

    def _clear(self) -> None:
        if self.live and self.shown:
            self.stream.write(f"\x1b[{self.shown}F\x1b[J")
            self.stream.flush()
            self.shown = 0
