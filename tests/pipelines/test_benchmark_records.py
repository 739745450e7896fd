"""Benchmarks and dataset sources are records: the `evaluate` command and the pipeline's evaluate
step both take each benchmark's inputs, and `data prepare` and the prepare step each source's options,
checked as declared."""

from __future__ import annotations

import click
import pytest

from pipelines.cli import main
from pipelines.steps import KINDS
from train.data.sources import SOURCES
from train.evaluation.benchmarks import BENCHMARKS


def test_the_evaluate_command_and_step_take_each_benchmarks_inputs():
    group = main.get_command(None, "evaluate")
    assert sorted(group.commands) == sorted(BENCHMARKS)
    for name, benchmark in BENCHMARKS.items():
        options = [param.name for param in group.commands[name].params if isinstance(param, click.Option)]
        inputs = [spec.name for spec in benchmark.inputs]
        assert options == inputs and KINDS["evaluate"].fields({"benchmark": name}) == ["benchmark", *inputs]
    step = {"benchmark": "refcocog", "data": "DATA", "split": "val", "split_by": "google", "predictions": "p.json"}
    assert KINDS["evaluate"].check(step).split_by == "google"


def test_the_prepare_command_and_step_take_each_sources_options():
    command = main.get_command(None, "data").commands["prepare"]
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
