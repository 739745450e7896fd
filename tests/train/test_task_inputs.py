"""A task's own inputs are its options: the pre-training corpus and VQA's answer vocabulary are given
in a stage's `options:`, checked and read before anything trains; the run level names none of them
(an old run YAML that does is refused in one line saying where they went, a run folder recorded
with them resumes)."""

import json
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

from pipelines.cli import main
from tests.helpers.worlds import run_config
from train.data.annotations import read_annotations
from train.data.files import DataError
from train.engine.config import RunConfig, RunConfigError, StageConfig, load_run_config, run_differences
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from vlbert.modeling import CONFIG_NAME

PRETRAIN = StageConfig("pretrain", "pretrain", steps=1, batch_size=2)
VQA = StageConfig("vqa", "vqa", steps=1, batch_size=2)


@pytest.fixture(scope="module")
def world(tiny_world):
    return tiny_world  # read only: every run here writes under its test's tmp_path


def answers_file(world, tmp_path, count: int = 3):
    """`count` of the world's training answers, one a line as `vlbert data prepare vqa2` writes them."""
    answers = sorted({a for record in read_annotations(world / "world" / "train.jsonl") for q in record.questions
                      for a in q.answers})[:count]
    path = tmp_path / "answers.txt"
    path.write_text("".join(answer + "\n" for answer in answers))
    return path


def test_a_vqa_stage_scores_the_answers_its_options_name(world, tmp_path):
    answers = answers_file(world, tmp_path)
    run = run_config(world, str(tmp_path / "run"), [replace(VQA, options={"answers": str(answers)})])
    Trainer(run, log=lambda _: None).fit()
    stage = RunFolder(tmp_path / "run").stage(0, "vqa")
    assert json.loads((stage.final / CONFIG_NAME).read_text())["num_answers"] == 3
    assert stage.evaluation()["metric"] == "vqa_accuracy"


@pytest.mark.parametrize("stage, option, content, message", [
    (VQA, "answers", None, "stages[0].options.answers: {path} does not exist"),
    (VQA, "answers", b"\n\n", "{path}: lists no answers"),
    (PRETRAIN, "corpus", b"a red square\n\xff\n", "{path}:2: not UTF-8 text (invalid start byte)"),
], ids=["missing answers", "empty answers", "corpus not UTF-8"])
def test_a_task_input_that_cannot_be_used_stops_the_run_before_anything_is_written(world, tmp_path, stage, option,
                                                                                    content, message):
    path = tmp_path / "input.txt"
    if content is not None:
        path.write_bytes(content)
    run = run_config(world, str(tmp_path / "run"), [replace(stage, options={option: str(path)})])
    with pytest.raises((RunConfigError, DataError)) as refused:
        Trainer(run, log=lambda _: None)
    assert str(refused.value) == message.format(path=path)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key, task", [("corpus", "pretrain"), ("answers", "vqa")])
def test_a_run_yaml_with_a_task_input_at_the_top_is_refused_naming_where_it_goes(world, tmp_path, key, task):
    values = {**run_config(world, str(tmp_path / "run"), [VQA]).to_dict(), key: str(tmp_path)}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    line = next(number for number, text in enumerate(path.read_text().splitlines(), 1) if text.startswith(f"{key}:"))
    expected = (f"{path}:{line}: unknown field {key!r}: an option of the task {task} now: give it in the options of each {task} "
                f"stage (options: {{{key}: ...}})")
    with pytest.raises(RunConfigError) as refused:
        load_run_config(path)
    assert str(refused.value) == expected
    result = CliRunner().invoke(main, ["train", str(path)])
    assert (result.exit_code, result.output) == (2, f"Error: {expected}\n")
    assert not (tmp_path / "run").exists()


def recorded_before_the_move(run: RunConfig) -> dict:
    """`run` as a run folder recorded it when `corpus` and `answers` were run fields."""
    recorded = run.to_dict()
    moved = {"corpus": None, "answers": None}
    for stage in recorded["stages"]:
        for key in moved:
            if key in stage["options"]:
                moved[key] = stage["options"].pop(key)
    return {**recorded, **moved}


def test_a_run_folder_recorded_with_run_level_corpus_and_answers_compares_them_as_options(world, tmp_path):
    answers = answers_file(world, tmp_path)
    run = run_config(world, str(tmp_path / "run"), [PRETRAIN, replace(VQA, options={"answers": str(answers)})])
    older = recorded_before_the_move(run)
    assert older["corpus"] == str(world / "world" / "corpus.txt") and older["answers"] == str(answers)
    assert "corpus" not in older["stages"][0]["options"] and older["stages"][1]["options"] == {}
    assert run_differences(older, run) == []
    elsewhere = replace(run, stages=[run.stages[0], replace(VQA, options={"answers": str(tmp_path)})])
    assert run_differences(older, elsewhere) == [
        f'stages[1].options.answers: the run folder has "{answers}", this config has "{tmp_path}"']


def test_a_run_recorded_with_run_level_inputs_resumes_as_done(world, tmp_path):
    answers = answers_file(world, tmp_path)
    run = run_config(world, str(tmp_path / "run"), [replace(VQA, options={"answers": str(answers)})])
    Trainer(run, log=lambda _: None).fit()
    folder = RunFolder(tmp_path / "run")
    folder.config_file.write_text(json.dumps(recorded_before_the_move(run)))
    messages = []
    Trainer(run, log=messages.append).fit(resume=True)
    assert messages == [f"stage vqa: done ({folder.stage(0, 'vqa').final}), nothing to train"]
