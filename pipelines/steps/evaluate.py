"""The `evaluate` step: predictions scored as `vlbert evaluate` scores them, into scores.json."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from pipelines.steps.base import Foreknown, Log, StepKind, missing_paths, parse, registered
from train.engine.errors import RunConfigError
from vlbert.utils.typed_config import EXISTING_PATHS


@functools.cache
def _evaluation_params(benchmark: str) -> type:
    """The dataclass of an evaluate step's parameters for `benchmark`: its name and the record's inputs
    (strings, as YAML spells paths)."""
    from train.evaluation.benchmarks import BENCHMARKS

    fields = [("benchmark", str)]
    for spec in sorted(BENCHMARKS[benchmark].inputs, key=lambda spec: not spec.required):  # defaults last
        kind = list[str] if spec.multiple else str
        metadata = EXISTING_PATHS if spec.multiple else {}  # one file alone is a list of one
        fields.append((spec.name, kind, dataclasses.field(metadata=metadata)) if spec.required else
                      (spec.name, kind | None, dataclasses.field(default=None, metadata=metadata)))
    return dataclasses.make_dataclass("EvaluateParams", fields)


def _evaluation(params: dict[str, Any]) -> Any:
    """`vlbert evaluate BENCHMARK`'s inputs, as train/evaluation/benchmarks.py declares them."""
    from train.evaluation.benchmarks import BENCHMARKS

    name = registered(params, "benchmark", BENCHMARKS)
    chosen = parse(_evaluation_params(name), params)
    empty = [spec.name for spec in BENCHMARKS[name].inputs if spec.multiple and getattr(chosen, spec.name) == []]
    if empty:
        raise RunConfigError(f"benchmark {name}: needs {', '.join(empty)}")
    return chosen


def _evaluate_fields(params: dict[str, Any]) -> list[str]:
    from train.evaluation.benchmarks import BENCHMARKS

    benchmark = BENCHMARKS.get(params["benchmark"]) if isinstance(params.get("benchmark"), str) else None
    return ["benchmark", *(spec.name for spec in (benchmark.inputs if benchmark else ()))]


def _input_paths(chosen: Any) -> list[tuple[str, Any]]:
    """(name, path) of each file and folder input given."""
    from train.evaluation.benchmarks import BENCHMARKS

    named = []
    for spec in BENCHMARKS[chosen.benchmark].inputs:
        value = getattr(chosen, spec.name)
        if spec.kind != "text":
            named += [(f"{spec.name}[{i}]", v) for i, v in enumerate(value)] if spec.multiple else [(spec.name, value)]
    return named


def _verify_evaluate(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    return missing_paths(_input_paths(_evaluation(params)), known)


def evaluate(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """Predictions scored as `vlbert evaluate` scores them, into scores.json."""
    from train.evaluation.benchmarks import BENCHMARKS
    from vlbert.utils.atomic import write_atomically

    chosen = _evaluation(params)
    scores = BENCHMARKS[chosen.benchmark].score(dataclasses.asdict(chosen), folder)
    write_atomically(folder / "scores.json", json.dumps(scores, indent=1))
    log(f"{chosen.benchmark}: {json.dumps(scores)}")


KIND = StepKind(evaluate, _evaluation, _evaluate_fields, _verify_evaluate, light=True)
