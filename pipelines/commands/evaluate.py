"""`vlbert evaluate BENCHMARK`: a predictions file scored as the benchmark's own tool scores it;
one JSON object on stdout and nothing else. One subcommand per record of
train/evaluation/benchmarks.py, with an option per input."""

import json
from pathlib import Path

import click

from train.evaluation.benchmarks import BENCHMARKS, Benchmark, Input

PARAMETER_TYPES = {
    "file": click.Path(exists=True, dir_okay=False, path_type=Path),
    "folder": click.Path(exists=True, file_okay=False, path_type=Path),
    "text": click.STRING,
}


@click.group("evaluate")
def evaluate_group() -> None:
    """Score predictions with the benchmarks' official metrics (percentages, 2 decimals)."""


def _option(spec: Input) -> click.Option:
    return click.Option([f"--{spec.name.replace('_', '-')}", spec.name], type=PARAMETER_TYPES[spec.kind],
                        required=spec.required, multiple=spec.multiple, help=spec.help)


def _command(benchmark: Benchmark) -> click.Command:
    def score(**values) -> None:
        values = {name: list(value) if isinstance(value, tuple) else value for name, value in values.items()}
        click.echo(json.dumps(benchmark.score(values, None)))
    return click.Command(benchmark.name, callback=score, params=[_option(spec) for spec in benchmark.inputs],
                         help=benchmark.about)


for _benchmark in BENCHMARKS.values():
    evaluate_group.add_command(_command(_benchmark))


COMMANDS = [evaluate_group]
