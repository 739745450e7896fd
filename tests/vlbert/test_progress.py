"""Progress off a terminal: plain lines now and then, never a bar's redraws."""

import io
import json

from tests.helpers.worlds import run_config
from train.data.annotations import AnnotationFile
from train.engine.config import StageConfig
from train.engine.trainer import Trainer
from vlbert.utils.progress import PROGRESS_VARIABLE, ProgressLines, progress_bar, progress_line, progress_summary


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
    assert lines[0].startswith("extract: 4/10 img (40%, ") and " img/s, ETA " in lines[0] and lines[0].endswith("s)")
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


def test_lines_give_the_rate_and_the_time_left_and_slow_work_its_seconds_per_unit():
    assert progress_line("vqa on val", 120, 400, "item", 40.0) == \
        "vqa on val: 120/400 item (30%, 40.0 item/s, ETA 0m07s)"
    # A step of 14 s read "0.0/s" as a rate; it is given per step instead, the time left from it.
    assert progress_line("vqa-end2end", 3, 100, "step", 1 / 14.2, "loss=0.512") == \
        "vqa-end2end: 3/100 step (3%, 14.2 s/step, ETA 22m57s) loss=0.512"
    assert progress_line("", 0, 40, "step", 0.0) == "0/40 step (0%, no step done yet)"
    assert progress_line("extract", 10, None, "img", 2.0) == "extract: 10 img (2.0 img/s)"


def test_a_step_status_sums_its_processes_snapshots(tmp_path):
    for shard, n in enumerate((30, 50)):
        (tmp_path / f".progress-{shard}.json").write_text(json.dumps(
            {"desc": "extract", "unit": "img", "n": n, "total": 100, "postfix": "", "rate": 2.0}))
    (tmp_path / ".progress-2.json").write_text("{half a snapsh")  # being replaced: left out
    assert progress_summary(sorted(tmp_path.glob(".progress*.json"))) == \
        "extract: 80/200 img (40%, 4.0 img/s, ETA 0m30s)"
    assert progress_summary([tmp_path / "absent.json"]) == ""


def test_a_stage_evaluation_publishes_its_items_after_the_training_steps(tiny_world_copy, monkeypatch):
    """What `pipeline status` reads once a stage's steps are done: the items of its evaluation, not
    the training bar at 100% for as long as evaluation takes."""
    published = tiny_world_copy / ".progress.json"
    monkeypatch.setenv(PROGRESS_VARIABLE, str(published))
    Trainer(run_config(tiny_world_copy, "run", [StageConfig("vqa", "vqa", steps=1, batch_size=4)])).fit()
    evaluated = AnnotationFile(tiny_world_copy / "world" / "val.jsonl").item_counts()["vqa"]
    assert progress_summary([published]).startswith(f"vqa on val: {evaluated}/{evaluated} item (100%, ")
