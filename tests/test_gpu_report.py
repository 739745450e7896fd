"""bench/gpu_report.py on a machine without a GPU: its parts' limits fit a 10-minute slot with
room to spare (the default ones together, the others each alone), and a part that runs out of time
is stopped with every process it started."""

import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]


def gpu_report():
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "bench" / "gpu_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_parts_limits_sum_to_at_most_nine_minutes():
    """The default parts together, and each part run on its own (`--parts N`), fit a 10-minute slot."""
    report = gpu_report()
    assert sum(part.limit for part in report.PARTS if part.default) <= 540
    assert all(part.limit <= 540 for part in report.PARTS)
    assert [part.limit for part in report.parts(tiny=True)] == [part.limit for part in report.PARTS]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has ended


def test_a_part_past_its_limit_is_stopped_with_the_processes_it_started(tmp_path, capsys):
    pid_file = tmp_path / "grandchild"
    # The part starts a process of its own (as pytest or a DataLoader does) and outlives its limit.
    part = [sys.executable, "-c", "import subprocess, sys, time; child = subprocess.Popen(['sleep', '300']); "
            f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(300)"]
    assert gpu_report().run_part("a part that hangs", part, 5) is False
    assert "stopped after 5 s (its time limit)" in capsys.readouterr().out
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # the kernel delivers SIGKILL at once; reaping by init may take a moment
        if not alive(grandchild):
            break
        time.sleep(0.1)
    assert not alive(grandchild)


def test_a_part_that_ends_reports_its_exit_status(capsys):
    assert gpu_report().run_part("a part that fails", [sys.executable, "-c", "raise SystemExit(4)"], 60) is False
    assert "exit status 4" in capsys.readouterr().out


def test_the_dependencies_the_host_lacks_are_named(monkeypatch):
    import importlib.metadata

    report = gpu_report()
    assert report.missing_dependencies("no-such-project-here") == ["no-such-project-here"]
    requirements = ["lmdb>=1.4", "no-such-package-here>=1", 'pytest>=8; extra == "test"',
                    'no-such-extra-package>=3.5; extra == "syntax"']
    monkeypatch.setattr(importlib.metadata, "requires", lambda project: requirements)
    assert report.missing_dependencies() == ["no-such-package-here"]
