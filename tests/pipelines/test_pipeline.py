"""Pipeline files: steps chain, up-to-date steps are skipped, interrupted ones resume, reports are written."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from pipelines.runner import PipelineError, StepFailed, load_pipeline, parse_setting, run_pipeline
from pipelines.world.tiny import TINY_MODEL
from train.engine.run_folder import RunFolder

COMMON = {"store": "${cache}", "train_annotations": "${world}/train.jsonl", "eval_annotations": "${world}/val.jsonl",
          "vocabulary": "${vocabulary}", "images": "${world}", "max_length": 40,
          "model": TINY_MODEL}


def pipeline_file(tmp_path, vqa_steps=3):
    steps = [
        {"name": "world", "kind": "world", "images": 16, "seed": 5},
        {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny", "mask_variants": 1,
         "batch_size": 4, "progress": False},
        {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"},
        {"name": "pretrain", "kind": "train", **COMMON,
         "stages": [{"name": "pretrain", "task": "pretrain", "steps": 2, "batch_size": 4,
                     "options": {"corpus": "${world}/corpus.txt"}}]},
        {"name": "vqa-frozen", "kind": "train", "detector": "frozen", **COMMON,
         "init_from": "${pretrain.final}",
         "stages": [{"name": "vqa", "task": "vqa", "steps": vqa_steps, "batch_size": 4}]},
        {"name": "vqa-tuned", "kind": "train", "detector": "tuned", **COMMON,
         "init_from": "${pretrain.final}",
         "stages": [{"name": "vqa", "task": "vqa", "steps": 2, "batch_size": 4, "checkpoint_every": 1},
                    {"name": "vqa-e2e", "task": "vqa", "steps": 1, "batch_size": 2, "visual": "end2end"}]},
        {"name": "report", "kind": "report", "runs": ["${vqa-frozen}", "${vqa-tuned}"]},
    ]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "test", "out": str(tmp_path / "out"), "steps": steps}))
    return path


def test_pipeline_runs_skips_resumes_and_reports(tmp_path, monkeypatch):
    path = pipeline_file(tmp_path)
    original_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def crash_in_tuned_run(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2 + 3 + 2:  # pretrain 2, vqa-frozen 3, then the tuned run's second step
            raise RuntimeError("simulated crash")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", crash_in_tuned_run)
    with pytest.raises(StepFailed, match="step 'vqa-tuned': simulated crash") as failed:
        run_pipeline(path, log=lambda _: None)
    assert isinstance(failed.value.cause, RuntimeError)
    monkeypatch.setattr(torch.optim.AdamW, "step", original_step)

    messages = []
    out = run_pipeline(path, log=messages.append)
    assert "[world] up to date" in messages and "[vqa-frozen] up to date" in messages
    assert "[vqa-tuned] resuming an interrupted run" in messages
    report = json.loads((out / "report" / "report.json").read_text())
    assert [(r["name"], r["detector"], r["task"], r["metric"]) for r in report["runs"]] == [
        ("vqa-frozen", "frozen", "vqa", "vqa_accuracy"), ("vqa-tuned", "tuned", "vqa", "vqa_accuracy")]
    assert [r["init_from"] for r in report["runs"]] == [str(RunFolder(Path("pretrain")).stage(0, "pretrain").final)] * 2
    for row in report["runs"]:
        assert 0 <= row["value"] <= 1 and 0 < row["chance"] <= 1 and row["wall_s"] > 0 and row["samples_per_s"] > 0
    assert (out / "report" / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "| vqa-tuned | tuned | vqa |" in (out / "report" / "report.md").read_text()

    messages.clear()
    run_pipeline(path, log=messages.append)
    assert all(m.endswith("up to date") for m in messages if m.startswith("["))

    messages.clear()
    run_pipeline(pipeline_file(tmp_path, vqa_steps=4), log=messages.append)
    assert "[vqa-frozen] parameters or inputs changed: starting again" in messages
    assert "[vqa-tuned] up to date" in messages and "[report] parameters or inputs changed: starting again" in messages


@pytest.mark.parametrize("steps, message", [
    ([{"name": "a", "kind": "bake"}], "unknown kind 'bake'"),
    ([{"name": "a", "kind": "world", "x": "${b}"}], r"refers to \$\{b\}, not an earlier step"),
    ([{"kind": "world"}], "needs a `name` and a `kind`"),
    ([{"name": "a", "kind": "world", "images": "${inputs.n}"}], r"refers to \$\{inputs.n\}, not a declared input"),
    ([{"name": "a", "kind": "world"}, {"name": "a", "kind": "world"}], r"step 'a' \(world\): the name 'a' is taken"),
    ([{"name": "a", "kind": "world", "imgs": 4}],
     r"step 'a' \(world\): unknown field 'imgs' \(did you mean 'images'\?\)"),
    ([{"name": "a", "kind": "world", "images": "4"}], r"images: expected an integer, found '4'"),
])
def test_bad_pipelines_are_named(tmp_path, steps, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"steps": steps}))
    with pytest.raises(PipelineError, match=message):
        run_pipeline(path)


def test_train_command_runs_a_yaml_config_and_names_bad_ones(tmp_path, tiny_world_copy):
    from click.testing import CliRunner

    from pipelines.cli import main
    from tests.helpers.worlds import run_config
    from train.engine.config import StageConfig

    root = tiny_world_copy
    run = run_config(root, "cli-run", [StageConfig("refexp", "refexp", steps=2, batch_size=2)])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run.to_dict()))
    result = CliRunner().invoke(main, ["train", str(config)])
    assert result.exit_code == 0, result.output
    assert json.loads(RunFolder(root / "cli-run").stage(0, "refexp").evaluation_file.read_text())["metric"] == "refexp_accuracy"
    again = CliRunner().invoke(main, ["train", str(config)])
    assert again.exit_code == 0  # a finished run has nothing left to do
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({**run.to_dict(), "stages": [{"name": "x", "task": "dance", "steps": 1}]}))
    result = CliRunner().invoke(main, ["train", str(broken)])
    assert result.exit_code != 0 and "task 'dance' is not one of" in result.output


@pytest.mark.parametrize("name", ["demo", "pretrain_finetune", "ablation", "grounding"])
def test_shipped_pipelines_are_well_formed(name):
    from pathlib import Path

    pipeline = load_pipeline(Path(__file__).parents[2] / "pipelines" / "configs" / f"{name}.yaml")  # checks every step
    assert [s.kind for s in pipeline.steps].count("train") >= 2
    report = [s for s in pipeline.steps if s.kind == "report"]
    assert len(report) == 1 and len(report[0].params["runs"]) >= 2
    assert set(report[0].reads) == {s.name for s in pipeline.steps if s.kind == "train" and str(s.folder) in
                                    report[0].params["runs"]}


# ---- inputs, checks at load, step errors, the prepare step -----------------------------------------

def write_pipeline(tmp_path, steps, inputs=None, name="inputs.yaml"):
    path = tmp_path / name
    document = {"out": str(tmp_path / "out"), "steps": steps} | ({"inputs": inputs} if inputs is not None else {})
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def train_step(name="finetune", **stage):
    return {"name": name, "kind": "train", **COMMON, "stages": [{"name": "vqa", "task": "vqa", "steps": 2, **stage}]}


def test_set_values_fill_inputs_as_yaml_and_changes_redo_the_steps_using_them(tmp_path):
    inputs = {"images": None, "seed": 0, "lr": None, "answers": "${here}/answers.txt"}
    steps = [{"name": "world", "kind": "world", "images": "${inputs.images}", "seed": "${inputs.seed}"},
             {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny", "progress": False},
             {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"},
             {**train_step(base_lr="${inputs.lr}", options={"answers": "${inputs.answers}"}),
              "eval_batch_size": "${inputs.images}"}]
    path = write_pipeline(tmp_path, steps, inputs)
    (tmp_path / "answers.txt").write_text("yes\n")  # a given path must exist when the pipeline loads
    settings = dict(parse_setting(text) for text in ["images=3", "lr=1e-5", "seed=7"])
    assert settings == {"images": 3, "lr": "1e-5", "seed": 7}  # YAML 1.1 reads 1e-5 as text
    assert parse_setting("day=2020-01-31") == ("day", "2020-01-31") and parse_setting("a=b=c") == ("a", "b=c")
    pipeline = load_pipeline(path, settings)
    world, train = pipeline.steps[0], pipeline.steps[3]
    assert world.params == {"images": 3, "seed": 7}
    assert train.params["stages"][0]["options"]["answers"] == f"{tmp_path}/answers.txt"
    assert train.params["eval_batch_size"] == 3
    from train.engine.config import RunConfig
    assert RunConfig.from_dict({**train.params, "out": "x"}).stages[0].base_lr == 1e-5  # the train rule reads it
    assert list(train.reads) == ["cache", "world", "vocabulary"]

    only_world = write_pipeline(tmp_path, steps[:1], inputs | {"lr": 0}, name="world.yaml")
    messages = []
    out = run_pipeline(only_world, log=messages.append, settings={"images": 3})
    assert json.loads((out / "world" / "step.json").read_text())["params"] == {"images": 3, "seed": 0}
    messages.clear()
    run_pipeline(only_world, log=messages.append, settings={"images": 3, "lr": 2})  # lr: used by no step
    assert messages == ["[world] up to date"]
    run_pipeline(only_world, log=messages.append, settings={"images": 3, "seed": 1, "out": str(out)})
    assert "[world] parameters or inputs changed: starting again" in messages
    assert json.loads((out / "world" / "step.json").read_text())["params"]["seed"] == 1


def test_missing_inputs_are_listed_together_and_unknown_set_names_refused(tmp_path):
    path = write_pipeline(tmp_path, [{"name": "world", "kind": "world", "images": "${inputs.images}",
                                      "seed": "${inputs.seed}"}], {"images": None, "seed": None, "lr": 1})
    with pytest.raises(PipelineError) as missing:
        load_pipeline(path, {"lr": 2})
    assert str(missing.value) == f"{path}: no value for inputs images, seed; pass --set images=... --set seed=..."
    with pytest.raises(PipelineError) as unknown:
        load_pipeline(path, {"imgaes": 3, "seed": 1})
    assert str(unknown.value).splitlines() == [  # the misspelt name and the input it leaves without a value
        f"{path}: --set imgaes: not an input nor a step of this pipeline (did you mean 'images'?); "
        "inputs: images, seed, lr, out; steps (--set STEP.FIELD=VALUE): world",
        f"{path}: no value for input images; pass --set images=..."]
    with pytest.raises(PipelineError, match="expected NAME=VALUE"):
        parse_setting("images")


def test_every_step_is_checked_at_load_before_anything_runs(tmp_path):
    steps = [{"name": "world", "kind": "world", "images": 4},
             {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny", "mask_variant": 2},
             {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"},
             train_step("typo", base_Lr=1e-5),
             train_step("text-number", base_lr="1,5e-5"),
             train_step("wrong-type", batch_size=[4]),
             {**train_step("ok", base_lr="1e-5"), "detector": "frozen"},
             {"name": "report", "kind": "report", "runs": {"ok": "${ok}"}}]
    path = write_pipeline(tmp_path, steps)
    with pytest.raises(PipelineError) as error:
        run_pipeline(path, log=lambda _: None)
    assert str(error.value).splitlines() == [
        f"{path}: step 'cache' (extract): unknown field 'mask_variant' (did you mean 'mask_variants'?)",
        f"{path}: step 'typo' (train): stages[0] ('vqa'): unknown field 'base_Lr' (did you mean 'base_lr'?)",
        f"{path}: step 'text-number' (train): stages[0].base_lr: expected a number, found '1,5e-5'",
        f"{path}: step 'wrong-type' (train): stages[0].batch_size: expected an integer, found a list",
        f"{path}: step 'report' (report): runs: expected a list, found a mapping",
    ]
    assert not (tmp_path / "out").exists()  # no step ran, no folder was made


def toy_source(calls):
    """A fake published dataset: `toy_<split>.json` under the root, {"items": [{"id", "image", "text"}]}."""
    from train.data.files import read_json
    from train.data.prepare import Source, SourceOption

    def prepare(preparation):
        calls.append(dict(preparation.options))
        files = {split: preparation.root / f"toy_{split}.json" for split in ("train", "val")}
        for split in preparation.present(files):
            with preparation.split(split) as writer:
                for item in read_json(files[split])["items"]:
                    if len(item["text"]) < preparation.options["min_length"]:
                        writer.skip(item["id"], "too short")
                    elif preparation.image_exists(item["image"]):
                        writer.add({"file": item["image"], "captions": [item["text"]]}, items=1)
                    else:
                        writer.skip_missing_image(item["id"], item["image"])

    return Source("toy", ("train", "val"), prepare, "a test source",
                  options=(SourceOption("min_length", int, "the shortest text kept", minimum=1),))


@pytest.fixture
def toy_dataset(tmp_path, monkeypatch):
    import train.data.sources

    calls = []
    # Into the module's namespace: its SOURCES attribute would import every real source.
    monkeypatch.setitem(vars(train.data.sources), "SOURCES", {"toy": toy_source(calls)})
    root = tmp_path / "toy"
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.jpg").write_bytes(b"jpeg")
    items = [{"id": 1, "image": "a.jpg", "text": "a red ball"}, {"id": 2, "image": "b.jpg", "text": "a cube"},
             {"id": 3, "image": "a.jpg", "text": "ok"}]
    (root / "toy_train.json").write_text(json.dumps({"items": items}))
    steps = [{"name": "data", "kind": "prepare", "source": "${inputs.source}", "root": "${inputs.root}",
              "images": "${inputs.root}/images", "max_missing": "${inputs.max_missing}", "min_length": 3}]
    path = write_pipeline(tmp_path, steps, {"source": "toy", "root": None, "max_missing": 1})
    return path, root, calls


def test_a_misspelt_source_option_is_refused_when_the_pipeline_loads(toy_dataset, tmp_path):
    path, root, calls = toy_dataset
    path.write_text(path.read_text().replace("min_length", "min_lenght"))
    with pytest.raises(PipelineError, match=r"step 'data' \(prepare\): unknown field 'min_lenght' "
                                            r"\(did you mean 'min_length'\?\)"):
        run_pipeline(path, log=lambda _: None, settings={"root": str(root), "out": str(tmp_path / "out")})
    assert not calls and not (tmp_path / "out").exists()


def test_prepare_step_runs_a_source_and_is_skipped_when_rerun(toy_dataset):
    path, root, calls = toy_dataset
    messages = []
    out = run_pipeline(path, log=messages.append, settings={"root": str(root)})
    assert calls == [{"min_length": 3}]
    assert [json.loads(line) for line in (out / "data" / "train.jsonl").read_text().splitlines()] == [
        {"file": "a.jpg", "captions": ["a red ball"]}]
    summary = json.loads((out / "data" / "summary.json").read_text())
    assert summary["splits"] == {"train": {"items": 1, "skipped": 2, "missing_images": 1}}
    assert summary["absent"] == ["val"]
    messages.clear()
    run_pipeline(path, log=messages.append, settings={"root": str(root)})
    assert messages == ["[data] up to date"] and len(calls) == 1
    with pytest.raises(PipelineError, match=r"step 'data' \(prepare\): source: 'tyo' is not one of .*toy.* "
                                            r"\(did you mean 'toy'\?\)"):
        load_pipeline(path, {"root": str(root), "source": "tyo"})


def test_a_failing_step_ends_the_command_with_one_line_naming_it(toy_dataset):
    from click.testing import CliRunner

    from pipelines.cli import main

    path, root, calls = toy_dataset
    # --jobs 1: the step runs in this process, where the toy source is registered
    command = ["pipeline", "run", str(path), "--jobs", "1", "--set", f"root={root}", "--set", "max_missing=0.2"]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2  # a DataError's status
    assert result.output.splitlines()[-1].startswith(  # the rest of the line is the prepare step's own
        f"Error: pipeline {path}, step 'data': toy train: 1 of 3 items (33.3%) have no image under "
        f"{root / 'images'}, more than --max-missing 20.0%; ")
    debug = CliRunner().invoke(main, ["--debug", *command])
    assert isinstance(debug.exception, StepFailed) and type(debug.exception.__cause__).__name__ == "DataError"

    (root / "toy_train.json").write_text(json.dumps({"items": [{"id": 1}]}))  # the toy reader then fails: a bug
    bug = CliRunner().invoke(main, command[:7])
    assert bug.exit_code == 1 and isinstance(bug.exception, StepFailed) and isinstance(bug.exception.cause, KeyError)
    missing = CliRunner().invoke(main, command[:5])
    assert missing.exit_code == 2 and f"Error: {path}: no value for input root; pass --set root=..." in missing.output


# ---- seeds and comparisons -----------------------------------------------------------------------

def test_a_train_step_with_seeds_trains_one_run_per_seed_and_the_report_gives_their_spread(tmp_path, monkeypatch):
    steps = [{"name": "world", "kind": "world", "images": 16, "seed": 5},
             {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny", "batch_size": 4,
              "progress": False},
             {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"},
             {**train_step("single", batch_size=4)},
             {**train_step("seeded", batch_size=4), "seeds": [0, 1]},
             {"name": "report", "kind": "report", "runs": ["${single}", "${seeded}"], "baseline": "${single}"}]
    path = write_pipeline(tmp_path, steps)
    original_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def crash_in_second_seed(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2 + 2 + 1:  # the single run's 2 steps, seed 0's 2, then seed 1's first
            raise RuntimeError("simulated crash")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", crash_in_second_seed)
    with pytest.raises(StepFailed, match="step 'seeded': simulated crash"):
        run_pipeline(path, log=lambda _: None)
    monkeypatch.setattr(torch.optim.AdamW, "step", original_step)
    messages = []
    out = run_pipeline(path, log=messages.append)
    assert "[seeded] resuming an interrupted run" in messages
    assert "stage vqa: done (" in "\n".join(messages)  # seed 0 finished before the crash: nothing to train

    seeded = RunFolder(out / "seeded")
    assert seeded.runs() == [seeded.seed_run(0), seeded.seed_run(1)]
    for seed in (0, 1):
        assert seeded.seed_run(seed).config()["seed"] == seed
        assert seeded.seed_run(seed).stage(0, "vqa").item_scores("val").is_file()
    assert not seeded.is_run and RunFolder(out / "single").is_run

    report = json.loads((out / "report" / "report.json").read_text())
    single, row = report["runs"]
    values = [seeded.seed_run(s).stage(0, "vqa").evaluation()["value"] for s in (0, 1)]
    assert single["seeds"] is None and single["std"] is None and single["interval"][0] <= single["value"]
    assert row["seeds"] == [0, 1] and row["seed_values"] == values
    assert row["value"] == pytest.approx(sum(values) / 2) and row["std"] == pytest.approx(abs(values[0] - values[1])
                                                                                          / 2 ** 0.5)
    assert row["interval"][0] <= row["value"] <= row["interval"][1]
    (comparison,) = report["comparisons"]
    assert (comparison["a"], comparison["b"]) == ("single", "seeded") and comparison["items"] == row["items"] > 0
    assert comparison["verdict"].startswith(("seeded scores above single", "seeded scores below single",
                                              "not distinguishable"))
    assert f"| seeded | frozen | vqa | vqa_accuracy | {row['value']:.3f} ± {row['std']:.3f} (2 seeds) |" in (
        out / "report" / "report.md").read_text()


@pytest.mark.parametrize("step, message", [
    ({**train_step(), "seeds": [0, 0]}, r"step 'finetune' \(train\): seeds: \[0, 0\] repeats a seed"),
    ({**train_step(), "seeds": [1, -2]}, r"seeds\[1\]: expected at least 0 and at most 4294967295, found -2"),
    ({**train_step(), "seeds": 3}, r"seeds: expected a list, found 3"),
    ({**train_step(), "seeds": [0, "1"]}, r"seeds\[1\]: expected an integer, found '1'"),
    ({**train_step(), "detector": 5}, r"detector: expected a string, found 5"),
    ({**train_step(), "seeds": [0, 1], "seed": 2}, "seed and seeds: give one"),
    ({"name": "report", "kind": "report", "runs": ["${finetune}"], "compare": [["${finetune}"]]},
     r"step 'report' \(report\): compare\[0\]: expected a pair \[RUN_A, RUN_B\] of run folders"),
    ({"name": "report", "kind": "report", "runs": ["${finetune}"], "compare": [["${finetune}", "elsewhere"]]},
     r"compare\[0\]\[1\]: elsewhere is not one of `runs`"),
    ({"name": "report", "kind": "report", "runs": ["${finetune}"], "baseline": "${world}"},
     r"baseline: .*/out/world is not one of `runs`"),
])
def test_seeds_and_comparisons_are_checked_at_load(tmp_path, step, message):
    steps = [{"name": "world", "kind": "world", "images": 4},
             {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny"},
             {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}, train_step()]
    with pytest.raises(PipelineError, match=message):
        load_pipeline(write_pipeline(tmp_path, steps + [step] if step["kind"] == "report" else steps[:3] + [step]))


def test_shipped_reports_compare_frozen_with_tuned_and_ablation_rows_with_a():
    from pathlib import Path

    from pipelines.steps.report import report_params

    def pairs(name):
        pipeline = load_pipeline(Path(__file__).parents[2] / "pipelines" / "configs" / f"{name}.yaml")
        (report,) = [s for s in pipeline.steps if s.kind == "report"]
        return [(Path(a).name, Path(b).name) for a, b in report_params(report.params).pairs()]

    assert pairs("demo") == [("vqa-frozen", "vqa-tuned"), ("refexp-frozen", "refexp-tuned")]
    ablation = pairs("ablation")
    assert ablation == [(f"a-{task}", f"{row}-{task}") for task in ("vqa", "refexp")
                        for row in ("b", "c", "d", "e", "f", "c-feature")] + [
        pair for task in ("vqa", "refexp") for pair in ((f"e-{task}", f"f-{task}"), (f"c-feature-{task}", f"c-{task}"))]
