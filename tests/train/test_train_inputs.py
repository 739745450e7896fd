"""`vlbert train` on what users write: checked when the config loads, before anything trains, and
logged as it happened."""

import json

import pytest
import yaml
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.world.tiny import TINY_MODEL
from tests.helpers.worlds import run_config
from train.engine.config import RunConfig, RunConfigError, StageConfig
from train.engine.optimization import learning_rate_factor
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer


@pytest.fixture(scope="module")
def world(tiny_world):
    return tiny_world  # read only: every run here writes under its test's tmp_path


def write_run(world, tmp_path, **changes) -> str:
    """A run YAML of the tiny world's with `changes`; its `out` under tmp_path."""
    values = run_config(world, str(tmp_path / "run"), [StageConfig("vqa", "vqa", steps=1, batch_size=2)]).to_dict()
    values.update(changes)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_a_misspelt_matching_loss_is_refused_when_the_config_loads(world, tmp_path):
    config = write_run(world, tmp_path, model={**TINY_MODEL, "matching_loss": "tripplet"})
    result = CliRunner().invoke(main, ["train", config])
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {config}: model: matching_loss must be one of (")
    assert "got 'tripplet'" in result.output and len(result.output.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_an_evaluation_split_without_store_images_is_refused_before_training(world, tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    rows = [json.loads(line) for line in (world / "world" / "val.jsonl").read_text().splitlines()]
    elsewhere.write_text("".join(json.dumps({**row, "file": "other/" + row["file"]}) + "\n" for row in rows))
    config = write_run(world, tmp_path, eval_annotations=str(elsewhere))
    result = CliRunner().invoke(main, ["train", config])
    assert result.exit_code == 2
    assert result.output == (f"Error: {elsewhere}: none of its {len(rows)} images is in the store "
                             f"{world / 'cache'}: nothing to evaluate on\n")
    assert not (tmp_path / "run").exists()


def test_the_log_says_which_model_a_run_builds(world, tmp_path):
    values = run_config(world, str(tmp_path / "run"), [StageConfig("vqa", "vqa", steps=1, batch_size=2)]).to_dict()
    for model, origin in [({}, "VL-BERT-base (no `model:` given)"), ("tiny", "VL-BERT-tiny"),
                          ({"size": "tiny", "num_hidden_layers": 1}, "VL-BERT-tiny with num_hidden_layers of `model:`")]:
        trainer = Trainer(RunConfig.from_dict({**values, "model": model}))
        assert trainer._model_origin().startswith(f"{origin}, every weight random")
    messages = []
    Trainer(RunConfig.from_dict({**values, "model": "tiny", "out": str(tmp_path / "logged")}),
            log=messages.append).fit()
    assert messages[0].startswith("model: VL-BERT-tiny, every weight random")


def test_a_named_model_size_trains(world, tmp_path):
    run = run_config(world, str(tmp_path / "run"), [StageConfig("vqa", "vqa", steps=1, batch_size=2)])
    run = RunConfig.from_dict({**run.to_dict(), "model": {"size": "tiny", "num_hidden_layers": 1}})
    Trainer(run).fit()
    config = json.loads((RunFolder(tmp_path / "run").stage(0, "vqa").final / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (32, 1, 64)
    assert json.loads(RunFolder(tmp_path / "run").config_file.read_text())["model"] == {"size": "tiny", "num_hidden_layers": 1}


@pytest.mark.parametrize("model, problem", [
    ("huge", "model.size: 'huge' is not one of base, large, tiny"),
    ({"size": "larg"}, "model.size: 'larg' is not one of base, large, tiny (did you mean 'large'?)"),
    (3, "model: expected a model size (base, large, tiny) or a mapping of VL-BERT config fields, found 3"),
    ({"hiden_size": 8}, "model: unknown field 'hiden_size' (did you mean 'hidden_size'?)"),
])
def test_a_bad_model_is_one_line_naming_it(world, tmp_path, model, problem):
    values = run_config(world, str(tmp_path / "run"), [StageConfig("vqa", "vqa", steps=1)]).to_dict()
    with pytest.raises(RunConfigError) as error:
        RunConfig.from_dict({**values, "model": model})
    assert str(error.value) == problem


def test_a_size_with_a_starting_checkpoint_is_refused(world, tmp_path):
    values = run_config(world, str(tmp_path / "run"), [StageConfig("vqa", "vqa", steps=1)]).to_dict()
    with pytest.raises(RunConfigError, match="model.size: init_from sets the model's sizes"):
        RunConfig.from_dict({**values, "model": "large", "init_from": str(world / "vocab")})


def test_metrics_log_the_learning_rate_each_step_applied(world, tmp_path):
    stage = StageConfig("vqa", "vqa", steps=3, batch_size=2, base_lr=1e-3, warmup_steps=2)
    Trainer(run_config(world, str(tmp_path / "run"), [stage])).fit()
    lines = [json.loads(line) for line in RunFolder(tmp_path / "run").metrics_file.read_text().splitlines()]
    logged = [line["lr"] for line in lines if "step" in line]
    factor = learning_rate_factor(stage)
    assert logged == pytest.approx([1e-3 * 2 * factor(step) for step in range(3)])
    assert logged[0] < logged[1]  # warming up: the first step's rate is the smallest


def test_a_tokenizer_that_does_not_fit_the_starting_checkpoint_is_refused(world, tmp_path):
    start = tmp_path / "start"
    start.mkdir()
    (start / "config.json").write_text(json.dumps({"vocab_size": 30522}))
    config = write_run(world, tmp_path, init_from=str(start), model={})
    result = CliRunner().invoke(main, ["train", config])
    vocabulary = len((world / "vocab" / "vocab.txt").read_text().splitlines())
    assert result.exit_code == 2
    assert result.output == (f"Error: {world / 'vocab' / 'vocab.txt'}: {vocabulary} word pieces, but the model's "
                             "vocab_size is 30522; use the vocabulary the model was trained with\n")
    assert not (tmp_path / "run").exists()
