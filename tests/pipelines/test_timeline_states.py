"""report.html's timeline states each step as its executor says it (`Executor.status`), the same on a
real Slurm (tests/helpers/slurm.py) as on the local executor: a run again after an input changed, in
which a step fails, shows it failed, the step that reads it not run (its folder holds an earlier
run's result), and the steps skipped up to date."""

from __future__ import annotations

import re
from html import unescape

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.executors.base import StepsFailed
from pipelines.runner import StepFailed, run_pipeline
from tests.helpers.pipelines import write_pipeline


def page_rows(page) -> dict[str, tuple[str, str]]:
    """Each step's (state, why) in the page's timeline table."""
    rows = re.findall(r'<tr><td>([^<]+)</td><td>[^<]+</td><td class="state-[^"]+">([^<]+)</td>(?:<td>.*?</td>){5}'
                      r"<td>(.*?)</td></tr>", unescape(page.read_text()))
    return {name: (state, why) for name, state, why in rows}


def run_twice_the_second_failing(tmp_path, **options) -> tuple:
    """A pipeline run to its end, then again with step `a`'s texts a file that is no JSON lines: `a`
    fails, `b` (which reads it) is not run, `world` and `fine` are up to date."""
    (tmp_path / "good.txt").write_text("a red square sits on a green circle\n" * 4)
    (tmp_path / "bad.jsonl").write_text("not JSON\n")
    path = write_pipeline(tmp_path, [{"name": "world", "kind": "world", "images": 3, "seed": 1},
                                     {"name": "a", "kind": "vocabulary", "texts": [str(tmp_path / "good.txt")]},
                                     {"name": "b", "kind": "vocabulary", "texts": ["${a}/vocab.txt"]},
                                     {"name": "fine", "kind": "vocabulary", "world": "${world}"}])
    settings = options.pop("settings", {})
    run_pipeline(path, log=lambda _: None, settings=settings, **options)
    with pytest.raises((StepFailed, StepsFailed)):
        run_pipeline(path, log=lambda _: None, settings={**settings, "a.texts": [str(tmp_path / "bad.jsonl")]},
                     **options)
    return path, tmp_path / "out"


def expected_rows(rows: dict[str, tuple[str, str]], tmp_path) -> None:
    assert {name: state for name, (state, _) in rows.items()} == {
        "world": "up to date", "a": "failed", "b": "not run", "fine": "up to date"}
    assert str(tmp_path / "bad.jsonl") in rows["a"][1] and "invalid JSON" in rows["a"][1]
    assert rows["b"][1] == "it reads a, which failed"


def test_the_timeline_of_a_local_run_again_with_a_failing_step(tmp_path):
    path, out = run_twice_the_second_failing(tmp_path)
    result = CliRunner().invoke(main, ["pipeline", "report", str(path)])
    assert result.exit_code == 0, result.output
    expected_rows(page_rows(out / "report.html"), tmp_path)


def test_the_timeline_of_a_slurm_run_again_with_a_failing_step(slurm_cluster, tmp_path):
    settings = {"slurm.partition": slurm_cluster.partition, "slurm.time": 10}
    path, out = run_twice_the_second_failing(tmp_path, settings=settings, executor="slurm", wait=True)
    result = CliRunner().invoke(main, ["pipeline", "report", str(path)])  # the settings the run recorded
    assert result.exit_code == 0, result.output
    expected_rows(page_rows(out / "report.html"), tmp_path)
    assert "missing: b: not run (it reads a, which failed)" in result.output.splitlines()
