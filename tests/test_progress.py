"""Progress off a terminal: plain lines now and then, never a bar's redraws."""

import io

from extract.progress import ProgressLines, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_redirected_log_gets_a_line_per_period_and_one_at_the_end():
    log = io.StringIO()
    with progress_bar(10, "extract", "img", file=log, every_s=0) as bar:
        assert isinstance(bar, ProgressLines)
        bar.update(4)
        bar.every_s = 3600
        bar.update(6)
        bar.set_postfix(loss="0.5")
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in log.getvalue()
    assert lines[0].startswith("extract: 4/10 img (40%, ") and lines[0].endswith(" img/s)")
    assert lines[1].startswith("extract: 10/10 img (100%, ") and lines[1].endswith(" img/s) loss=0.5")


def test_work_shorter_than_the_period_prints_nothing():
    log = io.StringIO()
    with progress_bar(10, "extract", "img", file=log, every_s=3600) as bar:
        bar.update(10)
    assert log.getvalue() == ""


def test_every_period_prints_the_count_so_far():
    log = io.StringIO()
    bar = progress_bar(None, unit="step", initial=2, file=log, every_s=0)
    bar.update(1)
    bar.update(2)
    bar.close()
    bar.close()  # closing twice prints once
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == ["3 step", "5 step", "5 step"]


def test_a_terminal_gets_a_bar_and_disabled_progress_prints_nothing():
    terminal = Terminal()
    with progress_bar(3, "train", file=terminal) as bar:
        assert not isinstance(bar, ProgressLines)
        bar.update(3)
    assert "\r" in terminal.getvalue()
    quiet = io.StringIO()
    with progress_bar(3, "train", file=quiet, enabled=False) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""
