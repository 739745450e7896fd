"""Every value is checked when a config loads: numbers in their ranges (declared once, as field
metadata the typed loader reads), floats finite, choices as `Literal`s, a task's option given on its
stage named as such, and a pipeline step's parameters (an extract step's numbers, a source or benchmark
that is not a name) — one line with the file and line, exit 2, and nothing written, before anything runs."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from click.testing import CliRunner

from extract.config import ConfigError
from extract.extraction_config import ExtractionConfig
from extract.job import JobError, run_extraction
from extract.presets import load_config
from pipelines.cli import main
from pipelines.runner import PipelineError, load_pipeline
from tests.helpers.worlds import run_config
from train.engine.config import SHORTEST_SEQUENCE, RunConfig, RunConfigError, StageConfig, load_run_config
from train.engine.run_folder import RunFolder
from vlbert.tokenization import fit_lengths


def run_document(root=None, **changes) -> dict:
    """A run config (over the tiny world at `root`, if given) with `changes`; a key `stage.NAME` changes
    the stage."""
    if root is None:
        values = {"out": "runs/x", "store": "s", "train_annotations": "t", "eval_annotations": "e", "vocabulary": "v",
                  "stages": [{"name": "vqa", "task": "vqa", "steps": 2}]}
    else:
        values = run_config(root, "run", [StageConfig("vqa", "vqa", steps=1, batch_size=2)]).to_dict()
    stage = {key.split(".", 1)[1]: value for key, value in changes.items() if key.startswith("stage.")}
    values.update({key: value for key, value in changes.items() if not key.startswith("stage.")})
    values["stages"] = [{**values["stages"][0], **stage}]
    return values


def located_line(text: str, key: str) -> int:
    return next(i + 1 for i, line in enumerate(text.splitlines()) if line.strip().startswith(f"{key}:"))


# (a changed key, its value as YAML writes it, the message after `KEY PATH: `)
OUT_OF_RANGE = [
    ("stage.base_lr", ".inf", "expected a finite number, found inf"),
    ("stage.base_lr", ".nan", "expected a finite number, found nan"),
    ("stage.base_lr", "-1.0e-4", "expected more than 0, found -0.0001"),
    ("stage.base_lr", "0", "expected more than 0, found 0.0"),
    ("stage.weight_decay", "-1", "expected at least 0, found -1.0"),
    ("stage.weight_decay", ".inf", "expected a finite number, found inf"),
    ("stage.warmup_steps", "-10", "expected at least 0, found -10"),
    ("stage.clip_grad_norm", "-1", "expected at least 0, found -1.0"),
    ("stage.clip_grad_norm", "-.inf", "expected a finite number, found -inf"),
    ("stage.checkpoint_minutes", ".inf", "expected a finite number, found inf"),
    ("stage.batch_size", "0", "expected at least 1, found 0"),
    ("eval_batch_size", "0", "expected at least 1, found 0"),
    ("max_regions", "0", "expected at least 1, found 0"),
    ("seed", "-1", "expected at least 0 and at most 4294967295, found -1"),
    ("max_length", "0", f"expected at least {SHORTEST_SEQUENCE}, found 0"),
    ("max_length", "3", f"expected at least {SHORTEST_SEQUENCE}, found 3"),
    ("max_length", str(SHORTEST_SEQUENCE - 1), f"expected at least {SHORTEST_SEQUENCE}, found {SHORTEST_SEQUENCE - 1}"),
]


def key_path(key: str) -> str:
    return key.replace("stage.", "stages[0].")


@pytest.mark.parametrize("key, value, message", OUT_OF_RANGE)
def test_a_value_out_of_range_is_named_with_its_file_line_and_key(tmp_path, key, value, message):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_document(**{key: yaml.safe_load(value)}), sort_keys=False))
    line = located_line(path.read_text(), key.rpartition(".")[2])
    with pytest.raises(RunConfigError) as refused:
        load_run_config(path)
    assert str(refused.value) == f"{path}:{line}: {key_path(key)}: {message}"


def test_each_item_of_a_list_is_in_range(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_document(**{"stage.lr_milestones": [2, 0]}), sort_keys=False))
    with pytest.raises(RunConfigError, match=r"stages\[0\]\.lr_milestones\[1\]: expected at least 1, found 0$"):
        load_run_config(path)


@pytest.mark.parametrize("model, message", [
    ({"hidden_dropout_prob": 1.5}, "model.hidden_dropout_prob: expected at least 0 and at most 1, found 1.5"),
    ({"num_attention_heads": 0}, "model.num_attention_heads: expected at least 1, found 0"),
    ({"layer_norm_eps": float("nan")}, "model.layer_norm_eps: expected a finite number, found nan"),
    ({"geometry_form": "corners"}, "model.geometry_form: 'corners' is not one of center, corner (did you mean"),
    ({"size": ["tiny"]}, "model.size: a list is not one of base, large, tiny"),
])
def test_the_model_s_values_are_checked_as_the_run_s(model, message):
    with pytest.raises(RunConfigError, match="^" + re.escape(message)):
        RunConfig.from_dict(run_document(model=model))


@pytest.mark.parametrize("key, value, message", [
    ("stage.optimizer", "adamx", "stages[0].optimizer: 'adamx' is not one of adamw, sgd (did you mean 'adamw'?)"),
    ("stage.visual", "end-to-end", "stages[0].visual: 'end-to-end' is not one of cached, end2end"),
    ("stage.precision", "fp8", "stages[0].precision: 'fp8' is not one of fp32, tf32, bf16, fp16"),
    ("damaged_records", "ignore", "damaged_records: 'ignore' is not one of fail, skip"),
])
def test_a_choice_is_a_literal_named_with_its_line(tmp_path, key, value, message):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_document(**{key: value}), sort_keys=False))
    line = located_line(path.read_text(), key.rpartition(".")[2])
    with pytest.raises(RunConfigError) as refused:
        load_run_config(path)
    assert str(refused.value).startswith(f"{path}:{line}: {message}")


@pytest.mark.parametrize("task, option, owner", [("pretrain", "masked_lm", "pretrain"), ("vqa", "num_choices", "choice")])
def test_a_task_option_given_on_its_stage_says_it_goes_under_options(tmp_path, task, option, owner):
    path = tmp_path / "run.yaml"
    document = run_document(**{"stage.task": task, f"stage.{option}": True})
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(RunConfigError) as refused:
        load_run_config(path)
    assert str(refused.value) == (f"{path}:{located_line(path.read_text(), option)}: stages[0] ('vqa'): unknown "
                                  f"field {option!r}: an option of the task {owner!r}, which goes under the stage's "
                                  "`options:`")


def test_the_shortest_max_length_holds_two_text_segments_the_whole_image_and_one_roi():
    # The two-segment form (VQA's question and [MASK], VCR's context and candidate) at its shortest.
    lengths, regions = fit_lengths([5, 1], [True, False], 1 + 10, SHORTEST_SEQUENCE)
    assert lengths == [1, 1] and regions == 2  # the whole-image box and one RoI
    assert fit_lengths([5, 1], [True, False], 1 + 10, SHORTEST_SEQUENCE - 1)[1] == 1  # no RoI left
    with pytest.raises(ValueError):
        fit_lengths([5, 1], [True, False], 1 + 10, 3)


def test_runs_at_the_shortest_max_length_train_and_evaluate(tiny_world_copy):
    from train.engine.trainer import Trainer

    stages = [StageConfig(task, task, steps=1, batch_size=2) for task in ("pretrain", "vqa", "refexp")]
    stages.append(StageConfig("choice", "choice", steps=1, batch_size=2, options={"num_choices": 3}))
    Trainer(run_config(tiny_world_copy, "short", stages, max_length=SHORTEST_SEQUENCE)).fit()
    folder = RunFolder(tiny_world_copy / "short")
    evaluations = [json.loads(folder.stage(i, s.name).evaluation_file.read_text()) for i, s in enumerate(stages)]
    assert [e["metric"] for e in evaluations] == ["masked_word_accuracy", "vqa_accuracy", "refexp_accuracy", "choice_accuracy"]


@pytest.mark.parametrize("changes, message", [
    ({"stage.base_lr": float("inf")}, "stages[0].base_lr: expected a finite number, found inf"),
    ({"stage.base_lr": -1.0}, "stages[0].base_lr: expected more than 0, found -1.0"),
    ({"stage.weight_decay": -1}, "stages[0].weight_decay: expected at least 0, found -1.0"),
    ({"stage.warmup_steps": -10}, "stages[0].warmup_steps: expected at least 0, found -10"),
    ({"max_length": 3}, "max_length: expected at least 8, found 3"),
    ({"eval_batch_size": 0}, "eval_batch_size: expected at least 1, found 0"),
    ({"stage.masked_lm": False}, "unknown field 'masked_lm': an option of the task 'pretrain'"),
    ({"stage.optimizer": "adamx"}, "stages[0].optimizer: 'adamx' is not one of adamw, sgd"),
])
def test_the_train_command_refuses_a_bad_value_in_one_line_writing_nothing(tiny_world_copy, tmp_path, changes, message):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_document(tiny_world_copy, **changes), sort_keys=False))
    result = CliRunner().invoke(main, ["train", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: {path}:") and message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tiny_world_copy / "run").exists()


# ---- pipeline steps ------------------------------------------------------------------------------

def world_and_cache(**extract) -> list[dict]:
    return [{"name": "world", "kind": "world", "images": 4},
            {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny", "progress": False, **extract}]


@pytest.mark.parametrize("steps, message", [
    (world_and_cache(batch_size=0), "step 'cache' (extract): batch_size 0: expected at least 1"),
    (world_and_cache(mask_prob=1.5), "step 'cache' (extract): mask_prob 1.5: expected 0.0 to 1.0"),
    (world_and_cache(mask_prob=float("nan")), "step 'cache' (extract): mask_prob: expected a finite number, found nan"),
    (world_and_cache(mask_seed=-1), "step 'cache' (extract): mask_seed -1: expected at least 0"),
    (world_and_cache(shard=[2, 2]), "step 'cache' (extract): shard [2, 2]: expected [i, n] with 0 <= i < n"),
    (world_and_cache(threads=0), "step 'cache' (extract): threads 0: expected at least 1"),
    (world_and_cache(feature_dtype="int4"), "step 'cache' (extract): feature_dtype 'int4': expected one of"),
    ([{"name": "world", "kind": "world", "images": 0}], "step 'world' (world): images: expected at least 1, found 0"),
    ([{"name": "data", "kind": "prepare", "source": ["coco"], "root": "."}],
     "step 'data' (prepare): source: expected one of "),
    ([{"name": "scores", "kind": "evaluate", "benchmark": {"vqa2": 1}}],
     "step 'scores' (evaluate): benchmark: expected one of "),
    ([{"name": "train", "kind": "train", "store": "s", "train_annotations": "t", "eval_annotations": "e",
       "vocabulary": "v", "stages": 5}], "step 'train' (train): stages: expected a list, found 5"),
])
def test_a_step_s_bad_value_is_refused_when_the_pipeline_loads(tmp_path, steps, message):
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "steps": steps}, sort_keys=False))
    with pytest.raises(PipelineError) as refused:
        load_pipeline(path)
    assert str(refused.value).startswith(f"{path}: {message}")
    result = CliRunner().invoke(main, ["pipeline", "run", str(path)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "out").exists()  # neither the world nor any step folder


def test_a_stage_setting_for_a_train_step_without_a_list_of_stages_is_named_not_a_traceback(tmp_path):
    steps = [{"name": "train", "kind": "train", "store": "s", "train_annotations": "t", "eval_annotations": "e",
              "vocabulary": "v", "stages": 5}]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "steps": steps}, sort_keys=False))
    with pytest.raises(PipelineError) as refused:
        load_pipeline(path, {"train.vqa.steps": 3})
    assert str(refused.value).splitlines() == [
        f"{path}: step 'train' (train): --set train.vqa.steps: no field or stage 'vqa'",
        f"{path}: step 'train' (train): stages: expected a list, found 5"]


def test_a_train_step_s_max_length_is_refused_before_the_steps_before_it_run(tmp_path):
    steps = world_and_cache() + [
        {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"},
        {"name": "train", "kind": "train", "store": "${cache}", "train_annotations": "${world}/train.jsonl",
         "eval_annotations": "${world}/val.jsonl", "vocabulary": "${vocabulary}", "max_length": 0,
         "stages": [{"name": "vqa", "task": "vqa", "steps": 1}]}]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "steps": steps}, sort_keys=False))
    result = CliRunner().invoke(main, ["pipeline", "run", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"Error: {path}: step 'train' (train): max_length: expected at least 8, found 0"
    assert not (tmp_path / "out").exists()


def test_run_extraction_checks_its_numbers_before_writing(tmp_path):
    with pytest.raises(JobError, match=r"^mask_seed -1: expected at least 0$"):
        run_extraction(ExtractionConfig(tmp_path / "images", "tiny", mask_seed=-1, progress=False), tmp_path / "store")
    with pytest.raises(JobError, match=r"^shard \[1, 0\]: expected \[i, n\] with 0 <= i < n$"):
        run_extraction(ExtractionConfig(tmp_path / "images", "tiny", shard=(1, 0), progress=False), tmp_path / "store")
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("field, value, message", [
    ("score_thresh", ".nan", "score_thresh: expected a finite number, found nan"),
    ("nms_thresh", "1.5", "nms_thresh: expected at least 0 and at most 1, found 1.5"),
    ("anchor_sizes", "[16.0, 0]", "anchor_sizes[1]: expected more than 0, found 0.0"),
    ("pooler_resolution", "0", "pooler_resolution: expected at least 1, found 0"),
])
def test_a_detector_value_out_of_range_is_named_with_its_file_and_line(tmp_path, field, value, message):
    path = tmp_path / "detector.yaml"
    path.write_text(f"base: tiny\nname: mine\n{field}: {value}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(str(path))
    assert str(refused.value) == f"detector config {path}:3: {message}"
    with pytest.raises(ConfigError) as refused:
        load_config("tiny", {field: value})
    assert str(refused.value) == message  # an override (`--override FIELD=VALUE`, a step's `overrides:`)
