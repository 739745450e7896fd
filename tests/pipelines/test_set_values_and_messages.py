"""A shipped pipeline on one's own data, as a new user drives it with `--set` only: the settings apply
in the order that lets them build on each other, repeated appends all append, one path is a list of
one, an appended stage records the answers it uses, an input that refers to itself is refused; and
the messages of a refused `.pth`, an `out` that is a file, a starting checkpoint that is no
checkpoint, and a step whose own problems leave its outputs unknown."""

import pytest
import torch
import yaml
from click.testing import CliRunner

from extract.checkpoint import CheckpointError, read_state_dict
from pipelines.cli import main
from pipelines.runner import PipelineError, load_pipeline, parse_settings
from pipelines.steps.train import _run_config
from tests.helpers.worlds import run_config
from tests.pipelines.test_pipeline_checks import world_steps
from train.engine.config import RunConfig, RunConfigError, StageConfig
from train.engine.trainer import Trainer
from vlbert.modeling import read_bert_weights
from vlbert.utils.errors import UserError


def write_pipeline(tmp_path, steps, inputs=None):
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "inputs": inputs or {}, "steps": steps},
                                   sort_keys=False))
    return path


def error_lines(path, settings):
    with pytest.raises(PipelineError) as error:
        load_pipeline(path, settings)
    return str(error.value).splitlines()


E2E = {"name": "e2e", "task": "vqa", "steps": 1, "visual": "end2end"}


@pytest.mark.parametrize("settings", [
    {"finetune.e2e.steps": 7, "finetune.stages+": E2E},  # the stage's field before the stage: was refused
    {"finetune.stages+": E2E, "finetune.e2e.steps": 7},
])
def test_a_stage_field_may_be_set_before_the_stage_is_appended(tmp_path, settings):
    stages = load_pipeline(write_pipeline(tmp_path, world_steps()), settings).steps[3].params["stages"]
    assert [stage["name"] for stage in stages] == ["vqa", "e2e"] and stages[1]["steps"] == 7


def test_whole_fields_then_appends_then_keys_whatever_the_command_line_order(tmp_path):
    settings = {"finetune.vqa.steps": 5, "finetune.stages+": E2E,
                "finetune.stages": [{"name": "vqa", "task": "vqa", "steps": 1}]}
    stages = load_pipeline(write_pipeline(tmp_path, world_steps()), settings).steps[3].params["stages"]
    assert stages == [{"name": "vqa", "task": "vqa", "steps": 5}, E2E]


def test_appends_given_several_times_all_append_in_order(tmp_path):
    settings = parse_settings(["finetune.stages+={name: a, task: vqa, steps: 1}", "finetune.vqa.steps=3",
                               "finetune.stages+=[{name: b, task: vqa, steps: 1}, {name: c, task: vqa, steps: 1}]",
                               "finetune.vqa.steps=4"])
    assert settings["finetune.vqa.steps"] == 4  # any other name: the last value
    stages = load_pipeline(write_pipeline(tmp_path, world_steps()), settings).steps[3].params["stages"]
    assert [(stage["name"], stage["steps"]) for stage in stages] == [("vqa", 4), ("a", 1), ("b", 1), ("c", 1)]


def test_one_path_where_a_field_is_a_list_of_paths_is_a_list_of_one(tmp_path):
    pipeline = load_pipeline(write_pipeline(tmp_path, world_steps()), {"finetune.predict": "${world}/val.jsonl"})
    finetune = pipeline.steps[3]
    assert _run_config(finetune.params, str(finetune.folder)).predict == [str(tmp_path / "out" / "world" / "val.jsonl")]
    with pytest.raises(RunConfigError, match=r"^predict: expected a list, found 3$"):  # a path, not anything
        RunConfig.from_dict({**_run_config(finetune.params, "x").to_dict(), "predict": 3})
    report = {"name": "report", "kind": "report", "runs": "${finetune}"}  # the report step's runs, the same
    assert load_pipeline(write_pipeline(tmp_path, [*world_steps(), report])).steps[4].params["runs"] == str(
        finetune.folder)


def test_an_appended_vqa_stage_without_answers_uses_and_records_the_previous_stage_s(tmp_path):
    answers = tmp_path / "answers.txt"
    answers.write_text("red\nblue\n")
    steps = world_steps()
    steps[3]["stages"][0]["options"] = {"answers": str(answers)}
    pipeline = load_pipeline(write_pipeline(tmp_path, steps), {"finetune.stages+": E2E})
    recorded = _run_config(pipeline.steps[3].params, "out").to_dict()  # what run.json records
    assert [stage["options"] for stage in recorded["stages"]] == [{"answers": str(answers)}] * 2
    # A run whose first VQA stage names none uses every training answer in each; one that names its
    # own keeps it, and a later one without takes the latest.
    other = tmp_path / "other.txt"
    other.write_text("green\n")
    stages = [StageConfig("a", "vqa", 1), StageConfig("b", "vqa", 1, options={"answers": str(other)}),
              StageConfig("p", "pretrain", 1), StageConfig("c", "vqa", 1)]
    run = run_config(tmp_path, "run", stages)
    assert [getattr(stage.options, "answers", "-") for stage in run.stages] == [None, str(other), "-", str(other)]


def test_an_input_that_refers_to_itself_or_to_no_step_is_refused(tmp_path):
    path = write_pipeline(tmp_path, world_steps(), {"note": "x"})
    assert error_lines(path, {"note": "${note}"}) == [
        f"{path}: inputs: note refers to ${{note}}, itself (a step's value reads an input as ${{inputs.note}}); an "
        "input may refer to ${here} and steps only"]
    assert error_lines(path, {"note": "${nothing}/x"}) == [
        f"{path}: inputs: note refers to ${{nothing}}, not a step of this pipeline; an input may refer to ${{here}} "
        "and steps only"]
    assert load_pipeline(path, {"note": "${here}/${world}"}).path == path  # a step and the file's folder are fine


def test_an_out_that_is_a_file_is_one_line_before_anything_runs(tmp_path):
    path = write_pipeline(tmp_path, world_steps())
    for out, problem in ((path, "is a file"), (path / "runs", f"would be made inside {path}, a file")):
        result = CliRunner().invoke(main, ["pipeline", "run", str(path), "--jobs", "1", "--set", f"out={out}"])
        assert result.exit_code == 2 and result.output == (
            f"Error: {path}: out: {out} {problem}; the output folder must be a folder or not exist yet\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]


def test_a_step_whose_outputs_its_own_problem_hides_adds_no_line_about_them(tmp_path):
    """Two later steps read ${finetune.predictions}: a finetune step with a nameless stage was named,
    and each of them added that finetune offers nothing by name, yet that a train step offers it."""
    steps = world_steps()
    steps += [{"name": name, "kind": "evaluate", "benchmark": "vqa2", "questions": "${world}/val.jsonl",
               "annotations": "${world}/val.jsonl", "predictions": f"${{finetune.predictions}}/{name}.json"}
              for name in ("dev", "test")]
    path = write_pipeline(tmp_path, steps)
    assert error_lines(path, {"finetune.stages": [{"task": "vqa", "steps": 1}]}) == [
        f"{path}: step 'finetune' (train): stages[0]: missing required field 'name'"]
    seeds = error_lines(path, {"finetune.seeds": [1, 2]})  # a step without problems that offers none: named
    assert len(seeds) == 2 and all("offers nothing by name" in line for line in seeds)


class _Payload:
    """Stands for any object beyond tensors that a pickle may carry (and call)."""


def test_a_refused_pth_is_one_line_that_never_advises_loading_it_unsafely(tmp_path):
    torch.save({"model": {"w": torch.zeros(1)}, "extra": _Payload()}, tmp_path / "weights.pth")
    with pytest.raises(CheckpointError) as error:
        read_state_dict(tmp_path / "weights.pth")
    assert str(error.value) == (f"{tmp_path / 'weights.pth'}: holds objects beyond tensors ({__name__}._Payload), "
                                "which are not loaded: loading them could run code")
    bert = tmp_path / "bert"
    bert.mkdir()
    torch.save({"bert.pooler.dense.weight": torch.zeros(1), "x": _Payload()}, bert / "pytorch_model.bin")
    with pytest.raises(UserError) as error:
        read_bert_weights(bert)
    assert str(error.value).startswith(f"{bert / 'pytorch_model.bin'}: holds objects beyond tensors")
    damaged = tmp_path / "damaged.pth"  # a weights-only pickle with an opcode the unpickler does not know
    torch.save({"w": torch.zeros(1)}, damaged, _use_new_zipfile_serialization=False)
    damaged.write_bytes(damaged.read_bytes().replace(b"\x80\x02}", b"\x80\x02\xff", 1))
    with pytest.raises(CheckpointError) as error:
        read_state_dict(damaged)
    assert str(error.value) == f"{damaged}: a damaged PyTorch checkpoint (Unsupported operand 255)"


@pytest.mark.parametrize("field_name", ["bert", "init_from"])
def test_a_starting_folder_that_is_no_checkpoint_names_its_key(tiny_world, tmp_path, field_name):
    folder = tmp_path / "not-a-checkpoint"
    folder.mkdir()
    run = run_config(tiny_world, str(tmp_path / "run"), [StageConfig("vqa", "vqa", 1)], **{field_name: str(folder)})
    with pytest.raises(RunConfigError) as error:
        Trainer(run)
    assert str(error.value) == f"{field_name}: {folder} holds no config.json; expected a checkpoint folder"
    (folder / "config.json").write_text("{not json")
    with pytest.raises(RunConfigError, match=rf"^{field_name}: {folder / 'config.json'} is not readable JSON \("):
        Trainer(run)
    assert not (tmp_path / "run").exists()
