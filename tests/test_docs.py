"""The reference the `vlbert train --help` text points at stays complete: every field of the run
config, of a stage and of each task's options is in docs/training.md's "Run config fields", and
nothing it lists is gone."""

import dataclasses
import re
from pathlib import Path

from click.testing import CliRunner

from pipelines.cli import main
from train.engine.config import RunConfig, StageConfig
from train.tasks import TASKS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def documented_fields() -> dict[str, list[str]]:
    text = DOCS.joinpath("training.md").read_text()
    section = text.split("## Run config fields", 1)[1].split("\n## ", 1)[0]
    run, stage = section.split("### Stage", 1)
    stage = stage.split("### Task options", 1)[0]
    return {name: re.findall(r"^\| `(\w+)` \|", part, re.M) for name, part in (("run", run), ("stage", stage))}


def test_the_run_config_reference_lists_every_field_in_order():
    documented = documented_fields()
    assert documented["run"] == [f.name for f in dataclasses.fields(RunConfig)]
    assert documented["stage"] == [f.name for f in dataclasses.fields(StageConfig)]


def test_the_task_options_reference_lists_every_task_s_options_in_order():
    text = DOCS.joinpath("training.md").read_text()
    section = text.split("### Task options", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \| `(\w+)` \|", section, re.M)
    assert documented == [(name, spec.name) for name, task in TASKS.items()
                          for spec in dataclasses.fields(task.options)]


def test_train_help_names_the_reference():
    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0 and 'docs/training.md' in result.output and "Run config fields" in result.output
