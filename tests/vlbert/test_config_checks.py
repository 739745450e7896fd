"""One typed loader for every config: detector configs, run configs, VL-BERT configs and pipeline
step parameters read `5e-5` as a number, name an unknown key with the closest known one, and name
a wrong type with its key (and, from a file, the file and line)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from extract.config import ConfigError
from extract.presets import load_config
from pipelines.steps import KINDS
from train.engine.config import RunConfigError, load_run_config
from vlbert.config import VLBertConfig, VLBertConfigError
from vlbert.utils.errors import FAILED, USAGE, UserError
from vlbert.utils.typed_config import FieldError, from_mapping


def run_document(**stage) -> dict:
    return {"out": "runs/x", "store": "s", "train_annotations": "t", "eval_annotations": "e", "vocabulary": "v",
            "stages": [{"name": "vqa", "task": "vqa", "steps": 2, **stage}]}


def detector_file(tmp_path, **values):
    path = tmp_path / "detector.yaml"
    path.write_text(yaml.safe_dump({"base": "tiny", **values}, sort_keys=False))
    return load_config(str(path))


def run_file(tmp_path, **stage):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_document(**stage), sort_keys=False))
    return load_run_config(path)


def model_file(tmp_path, **values):
    path = tmp_path / "config.json"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return VLBertConfig.load(path)


def train_step(tmp_path, **stage):
    return KINDS["train"].check({k: v for k, v in run_document(**stage).items() if k != "out"})


# Each config: how it loads, its error class, a float field, an integer field, and the file it is
# read from (None: a step's parameters, which the pipeline file holds).
LOADERS = {
    "detector": (detector_file, ConfigError, "score_thresh", "min_boxes", "detector.yaml"),
    "run": (run_file, RunConfigError, "base_lr", "steps", "run.yaml"),
    "model": (model_file, VLBertConfigError, "hidden_dropout_prob", "num_hidden_layers", "config.json"),
    "step": (train_step, RunConfigError, "base_lr", "steps", None),
}


def located(tmp_path, name: str | None, key: str) -> str:
    """`FILE:LINE: ` of `key` in the file, as an error names it."""
    if name is None:
        return ""
    lines = (tmp_path / name).read_text().splitlines()
    return f"{tmp_path / name}:{next(i + 1 for i, line in enumerate(lines) if line.strip().startswith(key + ':'))}: "


def _first_value(config, field):
    stage = getattr(config, "stages", None)
    return getattr(stage[0] if stage else config, field)


@pytest.mark.parametrize("kind", LOADERS)
def test_an_exponent_without_a_dot_is_a_number_everywhere(tmp_path, kind):
    load, _, float_field, _, _ = LOADERS[kind]
    config = load(tmp_path, **{float_field: "5e-5"})
    assert _first_value(config, float_field) == 5e-5 and isinstance(_first_value(config, float_field), float)


@pytest.mark.parametrize("kind", LOADERS)
def test_an_unknown_key_is_named_with_the_closest_known_one_everywhere(tmp_path, kind):
    load, error, float_field, _, name = LOADERS[kind]
    misspelt = float_field[:-1] + float_field[-1] * 2  # base_lrr, score_threshh, ...
    with pytest.raises(error) as refused:
        load(tmp_path, **{misspelt: 0.5})
    assert f"unknown field {misspelt!r} (did you mean {float_field!r}?)" in str(refused.value)
    assert located(tmp_path, name, misspelt) in str(refused.value)
    assert isinstance(refused.value, UserError) and refused.value.exit_status == USAGE


@pytest.mark.parametrize("kind", LOADERS)
def test_a_wrong_type_is_named_with_its_key_everywhere(tmp_path, kind):
    load, error, _, int_field, name = LOADERS[kind]
    with pytest.raises(error) as refused:
        load(tmp_path, **{int_field: "many"})
    assert f"{int_field}: expected an integer, found 'many'" in str(refused.value)
    assert located(tmp_path, name, int_field) in str(refused.value)


def test_a_run_config_mistake_names_its_file_and_line(tmp_path):
    path = tmp_path / "run.yaml"
    text = yaml.safe_dump(run_document(), sort_keys=False).replace("steps: 2", "steps: two")
    path.write_text(text)
    line = text.splitlines().index("  steps: two") + 1
    with pytest.raises(RunConfigError, match=rf"^{path}:{line}: stages\[0\]\.steps: expected an integer, found 'two'$"):
        load_run_config(path)


def test_detector_overrides_on_the_command_line_are_read_as_yaml():
    config = load_config("tiny", {"score_thresh": "5e-5", "anchor_sizes": "[8, 16]", "stride_in_1x1": "false"})
    assert (config.score_thresh, config.anchor_sizes, config.stride_in_1x1) == (5e-5, (8.0, 16.0), False)
    with pytest.raises(ConfigError, match=r"res_blocks\[1\]: expected an integer, found 'x'"):
        load_config("tiny", {"res_blocks": "[1, x, 1, 1]"})


# The exit status each user error ends a command with (the CLI asks the error; see vlbert/utils/errors.py).
@pytest.mark.parametrize("module, name, status", [
    ("extract.store.schema", "StoreMismatchError", USAGE),
    ("train.engine.config", "RunConfigError", USAGE),
    ("train.engine.config", "RunMismatchError", USAGE),
    ("extract.config", "ConfigError", USAGE),
    ("vlbert.utils.device", "DeviceError", USAGE),
    ("extract.job", "JobError", USAGE),
    ("pipelines.runner", "PipelineError", USAGE),
    ("extract.checkpoint", "CheckpointError", USAGE),
    ("train.data.files", "DataError", USAGE),
    ("vlbert.tokenization", "VocabularyError", USAGE),
    ("vlbert.config", "VLBertConfigError", USAGE),
    ("vlbert.utils.device", "StickyDeviceError", FAILED),
    ("extract.store.schema", "StoreError", FAILED),
    ("extract.store.schema", "DamagedRecordError", FAILED),
    ("extract.images", "ImageError", FAILED),
    ("extract.detector", "BoxError", FAILED),
])
def test_each_user_error_carries_its_exit_status(module, name, status):
    import importlib

    error = getattr(importlib.import_module(module), name)
    assert issubclass(error, UserError) and error.exit_status == status


@dataclass
class Head:
    kind: Literal["linear", "mlp"] = "linear"
    widths: tuple[int, ...] = ()


@dataclass
class Model:
    head: Head = field(default_factory=Head)
    heads: list[Head] = field(default_factory=list)


def test_the_loader_builds_nested_dataclasses_and_checks_choices():
    built = from_mapping(Model, {"head": {"kind": "mlp", "widths": [4, 2]}, "heads": [{}]})
    assert built == Model(Head("mlp", (4, 2)), [Head()])
    with pytest.raises(FieldError, match=r"^heads\[0\]\.kind: 'mpl' is not one of linear, mlp \(did you mean 'mlp'\?\)$"):
        from_mapping(Model, {"heads": [{"kind": "mpl"}]})
    with pytest.raises(FieldError, match=r"^head: expected a mapping of Head fields, found 3$"):
        from_mapping(Model, {"head": 3})
