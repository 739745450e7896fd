"""`vlbert pipeline run` checks at load what used to fail when a step started (paths, device, detector,
vocabulary and store against the model), names every problem together with misspelt `--set` names,
sets any step field with `--set STEP.FIELD=VALUE`, takes `null` for an optional input, and builds a
vocabulary from the user's own texts."""

import json

import pytest
import yaml
from click.testing import CliRunner

from extract.presets import PRESETS, load_config
from extract.store.schema import build_meta
from pipelines.cli import main
from pipelines.runner import load_pipeline
from pipelines.world.tiny import TINY_MODEL
from train.data.vocabulary import write_vocabulary
from train.engine.run_folder import RunFolder
from vlbert import VLBertConfig
from vlbert.modeling import VLBertForPreTraining
from vlbert.utils.device import DeviceError, check_device

WORDS = "a red blue square circle left right of the is what colour".split()


def write_pipeline(tmp_path, steps, inputs=None, name="pipeline.yaml"):
    path = tmp_path / name
    document = {"out": str(tmp_path / "out"), "steps": steps} | ({"inputs": inputs} if inputs is not None else {})
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def pipeline_run(path, *settings):
    return CliRunner().invoke(main, ["pipeline", "run", str(path), "--jobs", "1",
                                     *(a for s in settings for a in ("--set", s))])


def error_lines(result):
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Error: "))
    return [lines[start][len("Error: "):], *lines[start + 1:]]


def world_steps(**train):
    """A world, its extraction by `cache_detector`, its vocabulary and a train step over them."""
    return [
        {"name": "world", "kind": "world", "images": 4},
        {"name": "cache", "kind": "extract", "images": "${world}", "detector": "tiny", "progress": False},
        {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"},
        {"name": "finetune", "kind": "train", "store": "${cache}", "train_annotations": "${world}/train.jsonl",
         "eval_annotations": "${world}/val.jsonl", "vocabulary": "${vocabulary}", "max_length": 40,
         "stages": [{"name": "vqa", "task": "vqa", "steps": 2, "batch_size": 2}], **train},
    ]


def test_paths_device_detector_and_set_names_are_all_named_before_any_step_runs(tmp_path):
    steps = world_steps(bert="${inputs.bert}", device="${inputs.device}")
    steps[1].update(images="${inputs.images}", detector="butd-gv", device="${inputs.device}")
    steps[3]["stages"][0]["options"] = {"answers": "${inputs.answers}"}
    path = write_pipeline(tmp_path, steps, {"images": None, "answers": None, "bert": None, "device": "cpu"})
    result = pipeline_run(path, f"images={tmp_path / 'photos'}", f"answers={tmp_path / 'answers.txt'}",
                          f"bert={tmp_path / 'bert'}", "device=cuda:99", "finetune.vqa.stepz=3",
                          "fientune.max_length=9")
    with pytest.raises(DeviceError) as device:
        check_device("cuda:99")
    cache, finetune = f"{path}: step 'cache' (extract)", f"{path}: step 'finetune' (train)"
    assert error_lines(result) == [
        f"{path}: --set fientune.max_length: not an input nor a step of this pipeline (did you mean 'finetune'?); "
        "inputs: images, answers, bert, device, out; steps (--set STEP.FIELD=VALUE): world, cache, vocabulary, finetune",
        f"{cache}: images: {tmp_path / 'photos'} does not exist",
        f"{cache}: {device.value}",
        f"{cache}: detector 'butd-gv': not a preset ({', '.join(PRESETS)}) nor a .yaml file",
        f"{finetune}: --set finetune.vqa.stepz: stage 'vqa' has no field 'stepz' (did you mean 'steps'?)",
        f"{finetune}: bert: {tmp_path / 'bert'} does not exist",
        f"{finetune}: stages[0].options.answers: {tmp_path / 'answers.txt'} does not exist",
        f"{finetune}: {device.value}",
    ]
    assert not (tmp_path / "out").exists()  # nothing ran


def test_missing_inputs_are_named_with_the_other_problems_and_a_null_one_is_none(tmp_path):
    steps = world_steps(init_from="${inputs.vlbert}")
    steps[3]["stages"][0]["options"] = {"answers": "${inputs.answers}"}
    path = write_pipeline(tmp_path, steps, {"vlbert": None, "answers": None})
    missing = pipeline_run(path, "finetune.vqa.steps=many")
    assert error_lines(missing) == [
        f"{path}: no value for inputs vlbert, answers; pass --set vlbert=... --set answers=...",
        f"{path}: step 'finetune' (train): stages[0].steps: expected an integer, found 'many'"]
    in_text = world_steps(init_from="${inputs.vlbert}")
    in_text[3]["stages"][0]["options"] = {"answers": "${inputs.answers}/answers.txt"}
    text = write_pipeline(tmp_path, in_text, {"vlbert": None, "answers": None}, name="text.yaml")
    assert error_lines(pipeline_run(text, "vlbert=null", "answers=null")) == [
        f"{text}: step 'finetune' (train): '${{inputs.answers}}/answers.txt': input answers is null (none), but "
        "this text needs its value"]
    pipeline = load_pipeline(path, {"vlbert": None, "answers": None})  # none: from scratch, every training answer
    finetune = pipeline.steps[3].params
    assert finetune["init_from"] is None and finetune["stages"][0]["options"]["answers"] is None


def test_set_reaches_every_step_field_stage_field_and_mapping_key(tmp_path):
    path = write_pipeline(tmp_path, world_steps(model=dict(TINY_MODEL)))
    settings = {"world.images": 3, "cache.overrides.max_boxes": 5, "finetune.max_length": 64,
                "finetune.vqa.steps": 100, "finetune.vqa.base_lr": "1e-4", "finetune.model.hidden_size": 64}
    finetune = load_pipeline(path, settings).steps[3].params
    assert finetune["max_length"] == 64 and finetune["model"] == {**TINY_MODEL, "hidden_size": 64}
    assert finetune["stages"] == [{"name": "vqa", "task": "vqa", "steps": 100, "batch_size": 2, "base_lr": "1e-4"}]
    assert load_pipeline(path, settings).steps[1].params["overrides"] == {"max_boxes": 5}
    assert load_pipeline(path, {"finetune.model": "tiny"}).steps[3].params["model"] == "tiny"  # a named size

    result = pipeline_run(path, "world.imgs=3", "finetune.pretrain.steps=1", "finetune.model.hidden_size=abc",
                          "vocabulary.size=0")
    assert error_lines(result) == [
        f"{path}: step 'world' (world): --set world.imgs: no field 'imgs' (did you mean 'images'?)",
        f"{path}: step 'vocabulary' (vocabulary): size: expected at least 1, found 0",
        f"{path}: step 'finetune' (train): --set finetune.pretrain.steps: no field or stage 'pretrain' (did you mean 'tracking'?)",
        f"{path}: step 'finetune' (train): model.hidden_size: expected an integer, found 'abc'",
    ]

    only_world = write_pipeline(tmp_path, world_steps()[:1], name="world.yaml")
    result = pipeline_run(only_world, "world.images=3", "world.seed=4")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "world" / "step.json").read_text())["params"] == {"images": 3, "seed": 4}


def tiny_vlbert(folder, **sizes):
    VLBertForPreTraining(VLBertConfig(**{**TINY_MODEL, **sizes})).save_pretrained(folder)
    return folder


def test_a_starting_model_that_does_not_fit_the_vocabulary_or_the_store_is_refused_at_load(tmp_path):
    bert = write_vocabulary([" ".join(WORDS)], tmp_path / "bert")
    tokens = len((bert / "vocab.txt").read_text().split())
    feature_size = load_config("tiny").feature_dim
    vlbert = tiny_vlbert(tmp_path / "vlbert", vocab_size=tokens + 3, visual_feature_size=feature_size + 1)
    steps = world_steps(init_from="${inputs.vlbert}")
    steps[2] = {"name": "vocabulary", "kind": "vocabulary", "given": "${inputs.bert}",
                "texts": ["${world}/train.jsonl"]}
    path = write_pipeline(tmp_path, steps, {"vlbert": None, "bert": None})
    step = f"{path}: step 'finetune' (train)"
    assert error_lines(pipeline_run(path, f"vlbert={vlbert}", f"bert={bert}")) == [
        f"{step}: vocabulary: {bert / 'vocab.txt'}: {tokens} word pieces, but the model's vocab_size is {tokens + 3}; "
        f"use the vocabulary the model was trained with (the model of init_from {vlbert})",
        f"{step}: store: {tmp_path / 'out' / 'cache'} holds {feature_size}-d features, the model of init_from "
        f"{vlbert} takes visual_feature_size {feature_size + 1}"]

    fitting = tiny_vlbert(tmp_path / "fitting", vocab_size=tokens, visual_feature_size=feature_size)
    assert load_pipeline(path, {"vlbert": str(fitting), "bert": str(bert)}).steps[3].params["init_from"] == str(fitting)

    store = tmp_path / "store"  # an existing store, named by its meta.json
    store.mkdir()
    (store / "meta.json").write_text(json.dumps(build_meta(feature_dim=7, mode="detect")))
    given_store = write_pipeline(tmp_path, world_steps(init_from=str(fitting), vocabulary=str(bert), store=str(store)),
                                 name="store.yaml")
    assert error_lines(pipeline_run(given_store))[-1] == (
        f"{given_store}: step 'finetune' (train): store: {store} holds 7-d features, the model of init_from "
        f"{fitting} takes visual_feature_size {feature_size}")


def test_a_res5_layout_the_detector_cannot_run_is_refused_at_load(tmp_path):
    path = write_pipeline(tmp_path, world_steps())
    cache = f"{path}: step 'cache' (extract)"
    assert error_lines(pipeline_run(path, "cache.res5_layout=polyphase", "cache.overrides.pooler_resolution=7")) == [
        f"{cache}: res5 layout polyphase does not apply to detector tiny: pooler_resolution 7 is not a multiple of "
        "res5's dilation 2"]
    assert error_lines(pipeline_run(path, "cache.res5_layout=strided")) == [
        f"{cache}: res5_layout 'strided': expected one of dilated, polyphase"]
    assert load_pipeline(path, {"cache.res5_layout": "polyphase"}).steps[1].params["res5_layout"] == "polyphase"
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_speed_path_that_does_not_apply_is_refused_at_load(tmp_path):
    path = write_pipeline(tmp_path, world_steps())
    cache = f"{path}: step 'cache' (extract)"
    assert error_lines(pipeline_run(path, "cache.speed_paths=[bf16-roi-pooling]")) == [
        f"{cache}: speed path bf16-roi-pooling applies under precision bf16 only, not fp32"]
    assert error_lines(pipeline_run(path, "cache.speed_paths=[fast]")) == [
        f"{cache}: speed_paths 'fast': expected one of folded-res5-norms, cudnn-benchmark, bf16-roi-pooling, "
        "batched-rpn"]
    step = load_pipeline(path, {"cache.speed_paths": ["batched-rpn"]}).steps[1]
    assert step.params["speed_paths"] == ["batched-rpn"]
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_loss_name_is_checked_at_load(tmp_path):
    path = write_pipeline(tmp_path, world_steps(model={**TINY_MODEL, "matching_loss": "tripplet"}))
    (line,) = error_lines(pipeline_run(path))
    assert line.startswith(f"{path}: step 'finetune' (train): model") and "tripplet" in line


def test_the_vocabulary_step_builds_a_wordpiece_vocabulary_from_texts_or_copies_a_given_one(tmp_path):
    bert = write_vocabulary([" ".join(WORDS)], tmp_path / "bert")
    steps = [{"name": "world", "kind": "world", "images": 6},
             {"name": "built", "kind": "vocabulary", "given": "${inputs.bert}",
              "texts": ["${world}/train.jsonl", "${world}/corpus.txt"], "size": 300, "min_frequency": 1},
             {"name": "copied", "kind": "vocabulary", "given": str(bert), "texts": ["${world}/train.jsonl"]}]
    path = write_pipeline(tmp_path, steps, {"bert": None})
    result = pipeline_run(path, "bert=null")
    assert result.exit_code == 0, result.output
    built = (tmp_path / "out" / "built" / "vocab.txt").read_text().splitlines()
    assert built[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and 5 < len(built) <= 300
    assert (tmp_path / "out" / "copied" / "vocab.txt").read_text() == (bert / "vocab.txt").read_text()

    nothing = write_pipeline(tmp_path, [{"name": "vocabulary", "kind": "vocabulary", "given": str(tmp_path)}],
                             name="nothing.yaml")
    assert error_lines(pipeline_run(nothing)) == [
        f"{nothing}: step 'vocabulary' (vocabulary): given: {tmp_path} holds no vocab.txt (a tokenizer folder, "
        "e.g. a BERT checkpoint's)"]


def test_a_later_step_names_a_train_step_s_final_model_and_predictions_not_their_paths(tmp_path):
    steps = world_steps()
    steps[-1]["stages"].insert(0, {"name": "pre", "task": "pretrain", "steps": 2, "batch_size": 2})
    steps.append({**world_steps()[-1], "name": "again", "init_from": "${finetune.final}",
                  "predict": ["${finetune.pre.predictions}/x.jsonl", "${finetune.predictions}/y.jsonl"]})
    pipeline = load_pipeline(write_pipeline(tmp_path, steps))
    finetune, again = RunFolder(pipeline.steps[3].folder), pipeline.steps[4]
    assert again.params["init_from"] == str(finetune.stage(1, "vqa").final)
    assert again.params["predict"] == [str(finetune.stage(0, "pre").predictions_folder / "x.jsonl"),
                                       str(finetune.stage(1, "vqa").predictions_folder / "y.jsonl")]
    assert list(again.reads) == ["cache", "world", "vocabulary", "finetune"]

    steps[-1]["init_from"] = "${finetune.vqa.fianl}"
    steps[-1]["predict"] = ["${cache.final}/x.jsonl"]
    path = write_pipeline(tmp_path, steps)
    assert error_lines(pipeline_run(path)) == [
        f"{path}: step 'again' (train): refers to ${{finetune.vqa.fianl}}, but step 'finetune' offers no "
        "'vqa.fianl'; it offers pre.final, pre.predictions, vqa.final, vqa.predictions, final, predictions",
        f"{path}: step 'again' (train): refers to ${{cache.final}}, but step 'cache' offers nothing by name: a "
        "train step (without seeds) offers final, predictions, STAGE.final and STAGE.predictions",
    ]
