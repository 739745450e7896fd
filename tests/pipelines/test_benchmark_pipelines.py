"""The shipped benchmark pipelines end to end, as a user runs them (`vlbert pipeline run FILE --set
...`), on tiny datasets written here in the published layouts: prepare → extract (the demo
detector) → fine-tune (a tiny VL-BERT) → predictions that `vlbert evaluate` scores.

Each test loads the shipped file and shrinks only what makes it slow (step counts and batch sizes),
so the steps, references and inputs under test are those users get.
"""

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from transformers import BertConfig, BertForPreTraining

from pipelines.cli import main
from pipelines.runner import PipelineError, load_pipeline
from tests.helpers.pipelines import run_pipeline_file, tiny_checkpoints, write_image
from train.data.files import DataError
from train.engine.run_folder import RunFolder
from vlbert.tokenization import load_tokenizer

CONFIGS = Path(__file__).parents[2] / "pipelines" / "configs"
WORDS = ("what colour is the shape on left right of it a red blue green square circle two three yes no why "
         "because person dog car near is are there".split())


def shrunk(config: str, tmp_path: Path, **stage_values) -> Path:
    """The shipped pipeline with 2-step stages of batch 2 (and `stage_values`), written to tmp_path."""
    pipeline = yaml.safe_load((CONFIGS / config).read_text())
    for step in pipeline["steps"]:
        for stage in step.get("stages", []):
            stage.update(steps=2, batch_size=2, grad_accumulation=1, warmup_steps=1, **stage_values)
            if stage.get("lr_milestones"):
                stage["lr_milestones"] = [1]
    path = tmp_path / config
    path.write_text(yaml.safe_dump(pipeline))
    return path


def evaluate(*arguments: str) -> dict:
    result = CliRunner().invoke(main, ["evaluate", *arguments])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ---- VQA v2 ------------------------------------------------------------------------------------


def write_vqa2(root: Path) -> None:
    """Questions and annotations of train2014 and val2014 as published, and their COCO images."""
    question_id = 1
    for split, image_ids in (("train2014", range(1, 5)), ("val2014", range(5, 8))):
        questions, annotations = [], []
        for image_id in image_ids:
            write_image(root / "images" / split / f"COCO_{split}_{image_id:012d}.jpg", image_id)
            for text, answer in (("what colour is the square ?", "red"), ("is there a dog ?", "no")):
                questions.append({"image_id": image_id, "question": text, "question_id": question_id})
                answers = [answer] * 8 + ["blue", "yes"]
                annotations.append({"question_id": question_id, "image_id": image_id, "question_type": "what colour",
                                    "answer_type": "other", "multiple_choice_answer": answer,
                                    "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": i + 1}
                                                for i, a in enumerate(answers)]})
                question_id += 1
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "data" / f"v2_OpenEnded_mscoco_{split}_questions.json").write_text(json.dumps({"questions": questions}))
        (root / "data" / f"v2_mscoco_{split}_annotations.json").write_text(json.dumps({"annotations": annotations}))


def test_the_vqa2_pipeline_prepares_extracts_finetunes_and_writes_scorable_predictions(tmp_path):
    write_vqa2(tmp_path / "vqa")
    settings = {"data": str(tmp_path / "vqa" / "data"), "images": str(tmp_path / "vqa" / "images"),
                "min_answer_count": "1", **tiny_checkpoints(tmp_path, WORDS)}
    out = tmp_path / "run"
    run_pipeline_file(shrunk("vqa2.yaml", tmp_path), out, settings)

    summary = json.loads((out / "data" / "summary.json").read_text())
    assert {s: v["items"] for s, v in summary["splits"].items()} == {"train2014": 8, "val2014": 6}
    result = json.loads(RunFolder(out / "finetune").stage(0, "vqa").evaluation_file.read_text())
    predictions = RunFolder(out / "finetune").stage(0, "vqa").predictions("val2014", ".json")
    assert result["metric"] == "vqa_accuracy" and result["samples"] == 6
    data = tmp_path / "vqa" / "data"
    scores = evaluate("vqa2", "--questions", str(data / "v2_OpenEnded_mscoco_val2014_questions.json"),
                      "--annotations", str(data / "v2_mscoco_val2014_annotations.json"),
                      "--predictions", str(predictions))
    assert scores == result["official"]
    assert result["value"] == round(scores["overall"] / 100, 4)
    items = json.loads(RunFolder(out / "finetune").stage(0, "vqa").item_scores("val2014").read_text())
    assert len(items["items"]) == 6 and round(np.mean(list(items["items"].values())), 4) == result["value"]

    (row,) = json.loads((out / "report" / "report.json").read_text())["runs"]
    assert row["value"] == result["value"] and row["interval"][0] <= row["value"] <= row["interval"][1]

    rerun = run_pipeline_file(shrunk("vqa2.yaml", tmp_path), out, settings)
    assert rerun.output.count("up to date") == 5


def test_the_vqa2_pipeline_trains_from_scratch_at_a_named_size_with_a_vocabulary_of_its_questions(tmp_path):
    write_vqa2(tmp_path / "vqa")
    checkpoints = tiny_checkpoints(tmp_path, WORDS)
    settings = {"data": str(tmp_path / "vqa" / "data"), "images": str(tmp_path / "vqa" / "images"),
                "min_answer_count": "1", "detector": checkpoints["detector"],
                "detector_weights": checkpoints["detector_weights"], "vlbert": "null", "bert": "null",
                "finetune.model": "tiny", "finetune.max_length": "64", "vocabulary.min_frequency": "1"}
    out = tmp_path / "run"
    run_pipeline_file(shrunk("vqa2.yaml", tmp_path), out, settings)

    vocabulary = (out / "vocabulary" / "vocab.txt").read_text().splitlines()
    assert vocabulary[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and "colour" in vocabulary
    model = json.loads((RunFolder(out / "finetune").stage(0, "vqa").final / "config.json").read_text())
    assert (model["vocab_size"], model["hidden_size"], model["num_hidden_layers"]) == (len(vocabulary), 32, 2)
    assert json.loads(RunFolder(out / "finetune").stage(0, "vqa").evaluation_file.read_text())["samples"] == 6


def test_the_vqa2_pipeline_starts_from_bert_without_vlbert_and_names_a_bert_folder_without_weights(tmp_path):
    write_vqa2(tmp_path / "vqa")
    checkpoints = tiny_checkpoints(tmp_path, WORDS)
    settings = {"data": str(tmp_path / "vqa" / "data"), "images": str(tmp_path / "vqa" / "images"),
                **checkpoints, "vlbert": None}
    pipeline = shrunk("vqa2.yaml", tmp_path)
    with pytest.raises(PipelineError) as vocabulary_only:  # tiny_checkpoints's bert is a vocab.txt
        load_pipeline(pipeline, settings)
    assert str(vocabulary_only.value) == (f"{pipeline}: step 'finetune' (train): bert: {checkpoints['bert']} holds "
                                          "no config.json; expected a checkpoint folder")
    bert = BertForPreTraining(BertConfig(vocab_size=len(load_tokenizer(checkpoints["bert"])), hidden_size=32,
                                         num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
    bert.save_pretrained(checkpoints["bert"])
    finetune = next(step for step in load_pipeline(pipeline, settings).steps if step.name == "finetune").params
    assert finetune["init_from"] is None and finetune["bert"] == checkpoints["bert"]
    bert.save_pretrained(tmp_path / "other")
    (tmp_path / "other" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nword\n")
    with pytest.raises(PipelineError, match=r"vocab.txt: 6 word pieces, but the model's vocab_size is \d+"):
        load_pipeline(pipeline, {**settings, "bert": str(tmp_path / "other")})


# ---- VCR ---------------------------------------------------------------------------------------


def write_vcr(root: Path) -> None:
    """train.jsonl and val.jsonl as published, vcr1images with each image's metadata JSON."""
    choices = [["because", [0], "is", "near", "."], ["no", "."], ["yes", "."], ["it", "is", "red", "."]]
    for split, count in (("train", 4), ("val", 3)):
        lines = []
        for i in range(count):
            scene = f"movie/{split}_{i}"
            write_image(root / "vcr1images" / f"{scene}.jpg", i + (10 if split == "val" else 0))
            boxes = [[4, 4, 40, 40, 0.9], [50, 20, 120, 90, 0.8]]
            (root / "vcr1images" / f"{scene}.json").write_text(
                json.dumps({"boxes": boxes, "segms": [], "names": ["1", "2"], "width": 128, "height": 96}))
            lines.append({"annot_id": f"{split}-{i}", "objects": ["person", "dog"], "img_fn": f"{scene}.jpg",
                          "metadata_fn": f"{scene}.json", "question": ["why", "is", [0], "near", [1], "?"],
                          "answer_choices": choices, "rationale_choices": choices[::-1],
                          "answer_label": i % 4, "rationale_label": (i + 1) % 4})
        (root / f"{split}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_vcr_pipeline_trains_both_steps_and_scores_q2ar_from_their_merged_predictions(tmp_path):
    write_vcr(tmp_path / "vcr")
    settings = {"data": str(tmp_path / "vcr"), "images": str(tmp_path / "vcr" / "vcr1images"),
                **tiny_checkpoints(tmp_path, WORDS)}
    out = tmp_path / "run"
    run_pipeline_file(shrunk("vcr.yaml", tmp_path), out, settings)

    boxes = json.loads((out / "data" / "boxes.json").read_text())
    assert boxes["movie/val_0.jpg"] == [[4, 4, 40, 40], [50, 20, 120, 90]]
    q2a = json.loads(RunFolder(out / "q2a").stage(0, "q2a").evaluation_file.read_text())
    qa2r = json.loads(RunFolder(out / "qa2r").stage(0, "qa2r").evaluation_file.read_text())
    scores = json.loads((out / "scores" / "scores.json").read_text())
    assert set(scores) == {"q2a", "qa2r", "q2ar"}
    assert scores["q2a"] == round(q2a["value"] * 100, 2) and scores["qa2r"] == round(qa2r["value"] * 100, 2)
    items = json.loads(RunFolder(out / "qa2r").stage(0, "qa2r").item_scores("val").read_text())["items"]
    assert sorted(items) == ["val-0", "val-1", "val-2"]  # one score per annotation: given its right answer
    assert scores["q2ar"] <= min(scores["q2a"], scores["qa2r"])
    again = evaluate("vcr", "--annotations", str(tmp_path / "vcr" / "val.jsonl"),
                     "--predictions", str(RunFolder(out / "q2a").stage(0, "q2a").predictions("val", ".csv")),
                     "--predictions", str(RunFolder(out / "qa2r").stage(0, "qa2r").predictions("val", ".csv")))
    assert again == scores


# ---- RefCOCO+ ----------------------------------------------------------------------------------


def write_refcoco_plus(root: Path) -> None:
    """DATA/refcoco+/{refs(unc).p, instances.json} as the refer toolkit lays them out; COCO train2014."""
    images, annotations, refs = [], [], []
    sent_id = 1
    for image_id, split in zip(range(1, 8), ["train"] * 3 + ["val"] * 2 + ["testA", "testB"]):
        file_name = f"COCO_train2014_{image_id:012d}.jpg"
        write_image(root / "coco" / "train2014" / file_name, image_id)
        images.append({"id": image_id, "file_name": file_name, "width": 128, "height": 96})
        for k, bbox in enumerate(([4, 4, 36, 30], [60, 40, 50, 40])):
            ann_id = image_id * 10 + k
            annotations.append({"id": ann_id, "image_id": image_id, "bbox": bbox, "category_id": 1, "area": 1.0})
            refs.append({"ref_id": ann_id, "ann_id": ann_id, "image_id": image_id, "split": split, "category_id": 1,
                         "sentences": [{"sent_id": sent_id, "sent": ("left" if k == 0 else "right") + " square",
                                        "raw": "", "tokens": []}]})
            sent_id += 1
    folder = root / "DATA" / "refcoco+"
    folder.mkdir(parents=True)
    (folder / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                       "categories": [{"id": 1, "name": "square"}]}))
    (folder / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))


def test_the_refcoco_plus_pipeline_grounds_expressions_among_the_ground_truth_boxes(tmp_path):
    write_refcoco_plus(tmp_path)
    settings = {"data": str(tmp_path / "DATA"), "images": str(tmp_path / "coco"), **tiny_checkpoints(tmp_path, WORDS)}
    out = tmp_path / "run"
    run_pipeline_file(shrunk("refcoco+.yaml", tmp_path), out, settings)

    stage = RunFolder(out / "finetune").stage(0, "refcoco+")
    result = stage.evaluation()
    assert result["metric"] == "refexp_accuracy" and result["samples"] == 4
    scores = evaluate("refcoco+", "--data", str(tmp_path / "DATA"), "--split", "val",
                      "--predictions", str(stage.predictions("val", ".json")))
    assert scores == {"accuracy": round(result["value"] * 100, 2), "count": 4}
    items = json.loads(stage.item_scores("val").read_text())["items"]
    assert len(items) == 4 and np.mean(list(items.values())) == result["value"]
    # The candidates are the ground-truth boxes, so every prediction is one of the image's two boxes.
    boxes = json.loads((out / "data" / "boxes.json").read_text())
    predicted = json.loads(stage.predictions("testA", ".json").read_text())
    assert len(predicted) == 2
    assert all(p["box"] in boxes["train2014/COCO_train2014_000000000006.jpg"] for p in predicted)


# ---- pre-training ------------------------------------------------------------------------------


def test_the_pretraining_pipeline_reads_conceptual_captions_and_a_text_corpus(tmp_path):
    rows = {"training": 6, "validation": 3}
    files = {"training": "Train_GCC-training.tsv", "validation": "Validation_GCC-1.1.0-Validation.tsv"}
    for split, count in rows.items():
        lines = [f"a red square near {i} blue circles\thttp://example.com/{split}/{i}.jpg" for i in range(count)]
        (tmp_path / "cc" / files[split]).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cc" / files[split]).write_text("\n".join(lines) + "\n")
        for i in range(count - 1):  # the last row's image was not downloaded
            write_image(tmp_path / "images" / split / "00000" / f"{i:09d}.jpg", i)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "books.txt").write_text("the red square is left .\nit is near a circle .\n\n"
                                                   "there are two dogs .\n")
    settings = {"data": str(tmp_path / "cc"), "images": str(tmp_path / "images"), "corpus": str(tmp_path / "corpus"),
                **{k: v for k, v in tiny_checkpoints(tmp_path, WORDS).items() if k != "vlbert"}}
    # `bert` as users give it: a BERT checkpoint saved by transformers, with its vocab.txt.
    bert = BertForPreTraining(BertConfig(vocab_size=len(load_tokenizer(settings["bert"])), hidden_size=32,
                                         num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
    bert.save_pretrained(settings["bert"])
    out = tmp_path / "run"
    run_pipeline_file(shrunk("pretrain.yaml", tmp_path), out, settings)

    summary = json.loads((out / "data" / "summary.json").read_text())["splits"]
    assert summary["training"]["items"] == 5 and summary["training"]["missing_images"] == 1
    meta = json.loads((out / "features" / "meta.json").read_text())
    assert meta["mask_variants"]["count"] == 3
    result = json.loads(RunFolder(out / "pretrain").stage(0, "pretrain").evaluation_file.read_text())
    assert result["metric"] == "masked_word_accuracy"
    logged = [json.loads(line) for line in RunFolder(out / "pretrain").metrics_file.read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [1, 2]


def test_data_prepare_on_the_command_line_counts_missing_images_and_fails_above_max_missing(tmp_path):
    write_vqa2(tmp_path / "vqa")
    (tmp_path / "vqa" / "images" / "val2014" / "COCO_val2014_000000000005.jpg").unlink()
    arguments = ["data", "prepare", "vqa2", "--root", str(tmp_path / "vqa" / "data"),
                 "--images", str(tmp_path / "vqa" / "images"), "--min-answer-count", "1"]
    result = CliRunner().invoke(main, [*arguments, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "vqa2 val2014: 4 items, 2 skipped (2 for a missing image)" in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["splits"]["val2014"] == {**summary["splits"]["val2014"], "items": 4, "missing_images": 2}
    failed = CliRunner().invoke(main, [*arguments, "--out", str(tmp_path / "strict"), "--max-missing", "0.2"])
    assert failed.exit_code == 2 and "Traceback" not in failed.output
    assert "vqa2 val2014: 2 of 6 items (33.3%) have no image" in failed.output
    assert not (tmp_path / "strict" / "summary.json").exists()


def test_an_option_the_source_does_not_take_is_refused_by_name(tmp_path):
    from train.data.prepare import prepare_dataset
    from train.data.sources import SOURCES

    write_vqa2(tmp_path / "vqa")
    with pytest.raises(DataError, match=r"vqa2: unknown option 'split_by'; it takes 'min_answer_count'"):
        prepare_dataset(SOURCES["vqa2"], tmp_path / "vqa" / "data", tmp_path / "out", tmp_path / "vqa" / "images",
                        log=lambda _: None, split_by="unc")
    assert not (tmp_path / "out" / "summary.json").exists()
