"""A page opened in headless Chromium, watched through the DevTools protocol over a pipe
(`--remote-debugging-pipe`: no port, no websocket package): every request the page makes, every
console message and uncaught exception, and a screenshot of the whole page."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
WIDTH = 1200


def find_chromium() -> str | None:
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


@dataclass
class PageVisit:
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, itself included
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions, failed loads
    screenshot: bytes = b""
    height: int = 0  # of the whole page, in CSS pixels


# A cold start (nothing of Chromium in the page cache) took 14-16 s on a 2-core machine and past 30 s on a
# busier one; these limits only stop a hung browser, so they are generous.
START_TIMEOUT = 180.0
COMMAND_TIMEOUT = 120.0


class DevTools:
    """Chromium's end of the pipe: commands (fd 3 for it) and their answers and events (fd 4). Its
    stderr goes to `log`, whose last lines any failure to answer quotes."""

    def __init__(self, chromium: str, profile: str, log: Path) -> None:
        commands_read, self._commands = os.pipe()
        self._answers, answers_write = os.pipe()

        def as_devtools_fds() -> None:
            # Moved out of the way first: either pipe end may itself be fd 3 or 4.
            reading, writing = os.dup(commands_read), os.dup(answers_write)
            reading, writing = fcntl.fcntl(reading, fcntl.F_DUPFD, 10), fcntl.fcntl(writing, fcntl.F_DUPFD, 10)
            os.dup2(reading, 3)
            os.dup2(writing, 4)

        arguments = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                     f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-extensions", "--disable-dev-shm-usage", "about:blank"]
        self.log = log
        with log.open("wb") as stderr:
            self.process = subprocess.Popen(arguments, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=stderr, close_fds=False, preexec_fn=as_devtools_fds)
        os.close(commands_read)
        os.close(answers_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = COMMAND_TIMEOUT) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._commands, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            self.process.wait()
            raise RuntimeError(f"Chromium exited with {self.process.returncode} before {method}; its stderr ends:\n"
                               f"{self._log_tail()}") from None
        deadline = time.monotonic() + timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str, timeout: float = COMMAND_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            found = next((event for event in self.events if event.get("method") == method), None)
            if found is not None:
                return found
            self.events.append(self._receive(deadline))

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium did not answer in time; its stderr ends:\n{self._log_tail()}")
            # Woken each second to notice a browser that died without closing the pipe.
            if not select.select([self._answers], [], [], min(left, 1.0))[0]:
                if self.process.poll() is not None:
                    raise RuntimeError(f"Chromium exited with {self.process.returncode}; its stderr ends:\n"
                                       f"{self._log_tail()}")
                continue
            chunk = os.read(self._answers, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed its end of the pipe; its stderr ends:\n{self._log_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        try:
            os.write(self._commands, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._answers)


def visit(page: Path, chromium: str) -> PageVisit:
    """Opens `page` (a local file), waits for its load event and a moment more, and returns what it
    requested and logged, and a screenshot of the whole page at WIDTH CSS pixels."""
    with tempfile.TemporaryDirectory() as scratch:
        tools = DevTools(chromium, str(Path(scratch) / "profile"), Path(scratch) / "chromium.log")
        try:
            target = tools.send("Target.createTarget", {"url": "about:blank"}, timeout=START_TIMEOUT)["targetId"]
            session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                tools.send(f"{domain}.enable", session=session)
            tools.send("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": 900, "deviceScaleFactor": 1,
                                                              "mobile": False}, session)
            tools.events.clear()
            tools.send("Page.navigate", {"url": page.resolve().as_uri()}, session)
            tools.wait_for("Page.loadEventFired")
            height = int(tools.send("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                                         "returnByValue": True}, session)["result"]["value"])
            shot = tools.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                         "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height,
                                                                  "scale": 1}}, session)
            result = PageVisit(height=height, screenshot=base64.b64decode(shot["data"]))
            for event in tools.events:
                method, params = event.get("method"), event.get("params", {})
                if method == "Network.requestWillBeSent":
                    result.requests.append(params["request"]["url"])
                elif method == "Network.loadingFailed":
                    result.errors.append(f"failed to load: {params.get('errorText')}")
                elif method == "Runtime.exceptionThrown":
                    result.errors.append(f"exception: {params['exceptionDetails'].get('text')}")
                elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                    result.errors.append(f"console: {params.get('args')}")
                elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                    result.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            return result
        finally:
            tools.close()
