"""The CLI starts at once: `--help` imports no heavy module; the command list, the evaluate
commands, the evaluate step and the data prepare options come from their one declaration; the run
config's fields are documented where `vlbert train --help` points."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.commands import COMMANDS, load_command
from pipelines.steps import KINDS
from train.data.sources import SOURCES
from train.engine.config import RunConfig, StageConfig
from train.evaluation.benchmarks import BENCHMARKS

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "lmdb", "numpy")

# `vlbert --help` and subcommands' help, with the heavy modules each may import: the evaluate and
# data commands list the refer datasets, whose module reads images' extensions from extract.images
# (numpy). The other commands' help needs constants of extract/ modules that import torch.
LIGHT_HELP = {
    "vlbert": ([], ()),
    "train": (["train"], ()),
    "pipeline run": (["pipeline", "run"], ()),
    "vocab build": (["vocab", "build"], ()),
    "demo": (["demo"], ()),
    "evaluate vqa2": (["evaluate", "vqa2"], ("numpy",)),
    "data prepare": (["data", "prepare"], ("numpy",)),
}


def heavy_modules_after(arguments: list[str]) -> list[str]:
    """The HEAVY modules imported by a fresh interpreter that shows `vlbert ARGUMENTS --help`."""
    program = ("import sys; from click.testing import CliRunner; from pipelines.cli import main; "
               f"result = CliRunner().invoke(main, {arguments!r} + ['--help']); "
               "assert result.exit_code == 0, result.output; "
               f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().replace("'", '"'))


@pytest.mark.parametrize("name", LIGHT_HELP)
def test_help_imports_no_heavy_module(name):
    arguments, allowed = LIGHT_HELP[name]
    assert [module for module in heavy_modules_after(arguments) if module not in allowed] == []


def test_the_command_list_is_each_commands_first_sentence():
    for name, entry in COMMANDS.items():
        command = load_command(name)
        assert command.name == name and " ".join(command.help.split()).startswith(entry.summary), name
    listed = CliRunner().invoke(main, ["--help"]).output
    assert all(re.search(rf"^  {re.escape(name)}\s", listed, re.M) for name in COMMANDS)


def test_train_help_names_the_doc_of_the_run_config_fields():
    shown = " ".join(CliRunner().invoke(main, ["train", "--help"]).output.split())
    assert 'docs/training.md, section "Run config fields"' in shown


def test_every_run_config_field_is_in_the_training_doc():
    text = (ROOT / "docs" / "training.md").read_text()
    section = text.split("## Run config fields", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(\w+)`", section))
    fields = [spec.name for cls in (RunConfig, StageConfig) for spec in dataclasses.fields(cls)]
    assert [name for name in fields if name not in documented] == []


def test_the_evaluate_command_and_step_take_each_benchmarks_inputs():
    group = load_command("evaluate")
    assert sorted(group.commands) == sorted(BENCHMARKS)
    for name, benchmark in BENCHMARKS.items():
        options = [param.name for param in group.commands[name].params if isinstance(param, click.Option)]
        inputs = [spec.name for spec in benchmark.inputs]
        assert options == inputs and KINDS["evaluate"].fields({"benchmark": name}) == ["benchmark", *inputs]
    step = {"benchmark": "refcocog", "data": "DATA", "split": "val", "split_by": "google", "predictions": "p.json"}
    assert KINDS["evaluate"].check(step).split_by == "google"


def test_the_prepare_command_and_step_take_each_sources_options():
    command = load_command("data").commands["prepare"]
    options = {param.name for param in command.params}
    for name, source in SOURCES.items():
        declared = [option.name for option in source.options]
        assert set(declared) <= options
        fields = KINDS["prepare"].fields({"source": name})
        assert fields[len(fields) - len(declared):] == declared


@pytest.mark.parametrize("value, message", [
    ("many", "min_answer_count: expected an integer, found 'many'"),
    (0, "min_answer_count: expected at least 1, found 0"),
])
def test_a_prepare_steps_source_options_are_checked_as_declared(value, message):
    from train.engine.config import RunConfigError

    with pytest.raises(RunConfigError, match=message):
        KINDS["prepare"].check({"source": "vqa2", "root": "r", "min_answer_count": value})
