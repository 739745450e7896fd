"""Configs that build on others and change from the command line: `base: other.yaml` in run configs and
detector YAML files, `vlbert train --set KEY=VALUE` (key paths, by the pipeline's --set parser), and
report tables whose cells hold a `|`."""

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import train.engine.trainer
from extract.config import ConfigError
from extract.presets import PRESETS, load_config
from pipelines.cli import main
from pipelines.report.page import markdown_html
from pipelines.report.summary import runs_table, stages_table
from train.engine.config import RunConfigError, load_run_config
from train.evaluation.markdown import markdown_cells

RUN = {"out": "runs/base", "store": "cache", "train_annotations": "train.jsonl", "eval_annotations": "val.jsonl",
       "vocabulary": "vocab", "model": {"size": "tiny", "hidden_dropout_prob": 0.1},
       "stages": [{"name": "vqa", "task": "vqa", "steps": 10, "base_lr": 1e-4}]}


def written(path, document) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False))
    return str(path)


def test_a_run_config_builds_on_its_base_key_by_key(tmp_path):
    written(tmp_path / "common" / "base.yaml", RUN)
    written(tmp_path / "common" / "middle.yaml",
            {"base": "base.yaml", "seed": 3, "model": {"hidden_dropout_prob": 0.2}})
    run = load_run_config(written(tmp_path / "run.yaml", {
        "base": "common/middle.yaml", "out": "runs/mine",
        "stages": [{"name": "pre", "task": "pretrain", "steps": 5}, {"name": "vqa", "task": "vqa", "steps": 8}]}))
    assert (run.out, run.seed, run.store) == ("runs/mine", 3, "cache")  # this file's, the middle's, the first's
    assert run.model == {"size": "tiny", "hidden_dropout_prob": 0.2}  # a mapping merges key by key
    assert [(stage.name, stage.steps, stage.base_lr) for stage in run.stages] == [("pre", 5, 1e-5), ("vqa", 8, 1e-5)]


def test_a_mistake_is_named_with_the_file_and_line_it_comes_from(tmp_path):
    base = written(tmp_path / "base.yaml", yaml.safe_dump(RUN, sort_keys=False) + "seed: three\n")
    line = len(Path(base).read_text().splitlines())
    with pytest.raises(RunConfigError, match=rf"^{re.escape(base)}:{line}: seed: expected an integer, found 'three'$"):
        load_run_config(written(tmp_path / "run.yaml", {"base": "base.yaml", "max_length": 32}))
    run = written(tmp_path / "run.yaml", "base: base.yaml\nseed: 1\nmax_lenght: 32\n")
    with pytest.raises(RunConfigError, match=rf"^{re.escape(run)}:3: unknown field 'max_lenght' "
                                             r"\(did you mean 'max_length'\?\)$"):
        load_run_config(run)


@pytest.mark.parametrize("documents, message", [
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "base: a.yaml\n"},
     "{b}:1: base: a cycle of bases, {a} → {b} → {a}"),
    ({"a.yaml": "base: a.yaml\n"}, "{a}:1: base: a cycle of bases, {a} → {a}"),
    ({"a.yaml": "out: x\nbase: missing.yaml\n"},
     "{a}:2: base: 'missing.yaml' is not a run config file ({dir}/missing.yaml: no such file)"),
    ({"a.yaml": "base: [b.yaml]\n"}, "{a}:1: base: expected a run config file, found a list"),
    ({"a.yaml": "base: b.yaml\n", "b.yaml": "- a list\n"}, "{a}:1: base: {b} holds a list, not a mapping to build on"),
], ids=["cycle", "itself", "missing", "not text", "not a mapping"])
def test_a_base_that_cannot_be_built_on_is_refused_in_one_line(tmp_path, documents, message):
    for name, text in documents.items():
        written(tmp_path / name, text)
    with pytest.raises(RunConfigError) as refused:
        load_run_config(tmp_path / "a.yaml")
    assert str(refused.value) == message.format(a=tmp_path / "a.yaml", b=tmp_path / "b.yaml", dir=tmp_path)


def test_a_detector_yaml_builds_on_another_detector_yaml(tmp_path):
    written(tmp_path / "small.yaml", "base: tiny\nmax_boxes: 7\nscore_thresh: 0.3\n")
    config = load_config(written(tmp_path / "mine.yaml", "base: small.yaml\nscore_thresh: 0.4\n"))
    assert config == PRESETS["tiny"].replace(max_boxes=7, score_thresh=0.4, name="mine")
    bad = written(tmp_path / "bad.yaml", "base: tiny\nmin_boxes: many\n")
    with pytest.raises(ConfigError, match=rf"^detector config {re.escape(bad)}:2: min_boxes: expected an integer"):
        load_config(written(tmp_path / "on_bad.yaml", "base: bad.yaml\n"))
    with pytest.raises(ConfigError, match=r"base: 'tinyy' is not a preset \(butd-vg, .*\) or a detector YAML file"):
        load_config(written(tmp_path / "typo.yaml", "base: tinyy\n"))


@pytest.fixture
def trained(monkeypatch):
    """The run each `vlbert train` would train, instead of training it."""
    runs = []

    class Recorder:
        def __init__(self, run, log):
            runs.append(run)

        def fit(self, resume, restart):
            pass

    monkeypatch.setattr(train.engine.trainer, "Trainer", Recorder)
    return runs


def test_vlbert_train_set_changes_a_field_by_its_key_path(tmp_path, trained):
    config = written(tmp_path / "run.yaml", RUN)
    result = CliRunner().invoke(main, ["train", config, "--set", "stages[0].base_lr=1e-5", "--set",
                                       "model.hidden_size=64", "--set", "stages+={name: more, task: vqa, steps: 2}",
                                       "--set", "out=elsewhere", "--out", "there"])
    assert result.exit_code == 0, result.output
    run = trained[0]
    assert run.stages[0].base_lr == 1e-5 and isinstance(run.stages[0].base_lr, float)
    assert run.model == {"size": "tiny", "hidden_dropout_prob": 0.1, "hidden_size": 64}
    assert [stage.name for stage in run.stages] == ["vqa", "more"] and run.out == "there"


@pytest.mark.parametrize("setting, message", [
    ("stages[2].base_lr=1e-5", "{run}: stages[2].base_lr: stages holds 1 item(s), it has no [2]"),
    ("stages[0].bse_lr=1e-5", "{run}: stages[0] ('vqa'): unknown field 'bse_lr' (did you mean 'base_lr'?)"),
    ("stages[0].base_lr=-1", "{run}: stages[0].base_lr: expected more than 0, found -1.0"),
    ("out.inner=1", "{run}: out.inner: out is 'runs/base', not a mapping whose 'inner' could be set"),
    ("stages[0]base_lr=1", "{run}: 'stages[0]base_lr': not a key path (NAME, NAME.KEY, NAME[INDEX].KEY, ...)"),
    ("seed", "--set seed: expected NAME=VALUE"),
], ids=["no such stage", "misspelt", "out of range", "through a value", "not a key path", "no value"])
def test_a_setting_that_does_not_fit_the_run_config_is_one_line(tmp_path, trained, setting, message):
    config = written(tmp_path / "run.yaml", RUN)
    result = CliRunner().invoke(main, ["train", config, "--set", setting])
    assert result.exit_code == 2 and result.output == f"Error: {message.format(run=config)}\n" and not trained


def test_a_report_cell_holding_a_pipe_stays_one_cell():
    row = {"name": "frozen | tuned", "detector": "d|2", "task": "vqa", "metric": "vqa_accuracy", "value": 0.5,
           "std": None, "seeds": [0], "interval": None, "chance": 0.25, "wall_s": 1.0, "samples_per_s": 2.0,
           "stages": ["a|b"], "init_from": None,
           "stage_results": [{"stage": "a|b", "visual": "cached", "done": False}]}
    for table in (runs_table([row]), stages_table([row])):
        header, rule, line = table
        assert len(markdown_cells(line)) == len(markdown_cells(header)) == rule.count("|") - 1
    assert markdown_cells(runs_table([row])[2])[:2] == ["frozen | tuned", "d|2"]
    assert "<td>frozen | tuned</td><td>d|2</td>" in markdown_html(runs_table([row]))
