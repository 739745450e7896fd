"""Every config file and `--set` value is read by one bounded YAML loader (vlbert.utils.typed_config.load_yaml):
nested aliases (a "billion laughs"), a key given twice in one mapping, a recursive alias, bytes that are
not UTF-8 and tags that would build objects are refused in one line naming the file (and the line),
while merge keys (`<<: *x`, which the shipped pipelines use) keep working."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from extract.config import ConfigError
from extract.presets import load_config
from pipelines.cli import main
from pipelines.runner import PipelineError, load_pipeline, parse_setting
from train.engine.config import RunConfigError, load_run_config
from vlbert.config import VLBertConfig, VLBertConfigError
from vlbert.utils.typed_config import MAX_ALIAS_VALUES, FieldError, from_text, load_yaml

# 9 anchors of 9 aliases each: 9**9 values once expanded, from 9 lines.
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi"))
LAUGHS_IN_ONE_LINE = "{" + ", ".join(LAUGHS.splitlines()) + "}"


def run_document(**changes) -> dict:
    return {"out": "runs/x", "store": "s", "train_annotations": "t", "eval_annotations": "e", "vocabulary": "v",
            "stages": [{"name": "vqa", "task": "vqa", "steps": 2}], **changes}


def written(tmp_path, text: str | bytes, name: str = "config.yaml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


# Each loader of a user's file: how it reads one, and its error class.
LOADERS = {
    "run": (load_run_config, RunConfigError),
    "pipeline": (load_pipeline, PipelineError),
    "detector": (lambda path: load_config(str(path)), ConfigError),
    "model": (VLBertConfig.load, VLBertConfigError),
}


@pytest.mark.parametrize("kind", LOADERS)
def test_nested_aliases_are_refused_before_they_expand(tmp_path, kind):
    load, error = LOADERS[kind]
    path = written(tmp_path, LAUGHS)
    with pytest.raises(error) as refused:
        load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: aliases (*NAME) would expand it by ") or \
        message.startswith(f"detector config {path}: aliases (*NAME) would expand it by ")
    assert f"more than the {MAX_ALIAS_VALUES:,}" in message and "\n" not in message


def test_a_set_value_of_nested_aliases_is_refused(tmp_path):
    with pytest.raises(PipelineError, match=r"^--set steps=.*: aliases \(\*NAME\) would expand it by [\d,]+ values"):
        parse_setting(f"steps={LAUGHS_IN_ONE_LINE}")
    path = written(tmp_path, yaml.safe_dump({"out": str(tmp_path / "out"),
                                             "steps": [{"name": "world", "kind": "world", "images": 2}]}))
    result = CliRunner().invoke(main, ["pipeline", "run", str(path), "--set", f"world.seed={LAUGHS_IN_ONE_LINE}"])
    assert result.exit_code == 2 and "aliases (*NAME) would expand it by" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_few_aliases_and_merge_keys_still_work(tmp_path):
    text = ("common: &common {store: s, train_annotations: t, eval_annotations: e, vocabulary: v, seed: 3}\n"
            "stage: &stage {task: vqa, steps: 2, base_lr: 1.0e-4}\n"
            "<<: *common\n"
            "out: runs/x\n"
            "seed: 5\n"  # a key the merge brings, set again: the mapping's own value wins, not a duplicate
            "stages: [{<<: *stage, name: a}, {<<: *stage, name: b, steps: 4}]\n")
    values, _ = load_yaml(written(tmp_path, text))
    assert values["seed"] == 5 and values["store"] == "s"
    assert values["stages"] == [{"task": "vqa", "steps": 2, "base_lr": 1e-4, "name": "a"},
                                {"task": "vqa", "steps": 4, "base_lr": 1e-4, "name": "b"}]


@pytest.mark.parametrize("kind", LOADERS)
def test_a_key_given_twice_is_refused_with_its_line(tmp_path, kind):
    load, error = LOADERS[kind]
    text = "steps: []\nname: first\nout: runs/x\nname: second\n"
    path = written(tmp_path, text)
    with pytest.raises(error, match=rf"{path}:4: key 'name' given twice in one mapping \(first on line 2\)$"):
        load(path)


def test_a_key_given_twice_inside_a_stage_or_a_flow_mapping_is_refused(tmp_path):
    document = yaml.safe_dump(run_document(), sort_keys=False).replace("  steps: 2\n", "  steps: 2\n  steps: 3\n")
    path = written(tmp_path, document)
    line = document.splitlines().index("  steps: 3") + 1
    with pytest.raises(RunConfigError, match=rf"^{path}:{line}: key 'steps' given twice in one mapping"):
        load_run_config(path)
    with pytest.raises(FieldError, match=r"^--set x: key 'a' given twice in one mapping \(first on line 1\)$"):
        from_text("{a: 1, b: 2, a: 3}", where="--set x")


def test_a_recursive_alias_is_refused(tmp_path):
    path = written(tmp_path, "out: runs/x\nstages: &s [*s]\n")
    with pytest.raises(RunConfigError, match=rf"^{path}:2: an alias inside the value it names"):
        load_run_config(path)


@pytest.mark.parametrize("kind", LOADERS)
def test_bytes_that_are_not_utf8_are_refused_with_their_line(tmp_path, kind):
    load, error = LOADERS[kind]
    path = written(tmp_path, b"out: runs/x\nname: caf\xe9\n")
    with pytest.raises(error, match=rf"{path}:2: not UTF-8 text \(byte 0xe9\); save the file as UTF-8$"):
        load(path)


def test_a_byte_order_mark_is_utf8(tmp_path):
    assert load_yaml(written(tmp_path, "\ufeffa: 1\n"))[0] == {"a": 1}


def test_tags_that_build_objects_run_no_code(tmp_path):
    marker = tmp_path / "ran"
    path = written(tmp_path, f"out: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(RunConfigError, match=rf"^{path}: invalid YAML, line 1, column 6: could not determine a "
                                             r"constructor for the tag"):
        load_run_config(path)
    assert not marker.exists()
    with pytest.raises(RunConfigError, match=rf"^{path}:1: !!set is not a config value"):
        load_run_config(written(tmp_path, "out: !!set {a, b}\n"))


def test_a_date_stays_the_text_it_is(tmp_path):
    assert load_yaml(written(tmp_path, "name: 2020-01-31\n"))[0] == {"name": "2020-01-31"}


def test_a_file_that_cannot_be_read_or_holds_an_unreadable_number_is_one_line(tmp_path):
    with pytest.raises(RunConfigError, match=rf"^{tmp_path}: cannot read \(Is a directory\)$"):
        load_run_config(tmp_path)
    path = written(tmp_path, "seed: " + "9" * 5000 + "\n")
    with pytest.raises(RunConfigError, match=rf"^{path}: a value that cannot be read \(Exceeds the limit"):
        load_run_config(path)
    deep = written(tmp_path, "[" * 5000 + "]" * 5000)
    with pytest.raises(RunConfigError, match=rf"^{deep}: values nested too deeply to read$"):
        load_run_config(deep)


def test_the_train_command_refuses_such_a_file_in_one_line(tmp_path):
    for text in (LAUGHS, b"out: runs/x\nseed: \xff\n", "out: a\nout: b\n"):
        path = written(tmp_path, text)
        result = CliRunner().invoke(main, ["train", str(path)])
        assert result.exit_code == 2, result.output
        assert len(result.output.strip().splitlines()) == 1 and result.output.startswith(f"Error: {path}")
