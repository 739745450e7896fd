"""SNLI-VE (visual entailment) as a task: the reader of its published files, the sequence
classification head, the accuracy scorer and `vlbert evaluate snli-ve`, and the shipped pipeline end
to end on tiny files in the published layout (prepare → extract with the demo detector → fine-tune a
tiny VL-BERT → predictions that `vlbert evaluate snli-ve` scores)."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner

from pipelines.cli import main
from tests.helpers.models import make_batch
from tests.helpers.pipelines import run_pipeline_file, tiny_checkpoints, write_image
from train.data.annotations import ENTAILMENT_LABELS, AnnotationFile, read_annotations
from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.sources import SOURCES
from train.engine.run_folder import RunFolder
from train.evaluation.snli_ve import evaluate_snli_ve, score_snli_ve
from train.tasks import TASKS
from vlbert import VLBertConfig, VLBertForPreTraining, VLBertForSequenceClassification, load_pretrained

ROOT = Path(__file__).parents[2]
LABELS = ("entailment", "neutral", "contradiction")
HYPOTHESES = ("a dog runs on the grass", "two people are near a car", "the square is red", "nobody is there")
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=128, geometry_frequencies=8, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, visual_dropout_prob=0.0, classifier_dropout=0.0)


def pair(image_id: str, number: int, label: str) -> dict:
    """A line as published: SNLI's fields, with the Flickr30K image of the premise caption."""
    return {"Flickr30K_ID": image_id, "pairID": f"{image_id}.jpg#{number}r1{label[0]}",
            "captionID": f"{image_id}.jpg#1",
            "sentence1": "a premise caption", "sentence2": HYPOTHESES[number % len(HYPOTHESES)], "gold_label": label}


def write_snli_ve(root: Path, images: dict[str, range]) -> dict[str, list[dict]]:
    """snli_ve_<split>.jsonl for each split of `images` (split → Flickr30K ids), three pairs an image
    (one per label, lines interleaved across images), and the images under flickr30k_images/."""
    published = {}
    for split, ids in images.items():
        lines = [pair(str(1000 + i), n, label) for n, label in enumerate(LABELS) for i in ids]
        for i in ids:
            write_image(root / "flickr30k_images" / f"{1000 + i}.jpg", i)
        (root / f"snli_ve_{split}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        published[split] = lines
    return published


# ---- the reader ------------------------------------------------------------------------------------


def test_prepare_groups_pairs_by_image_and_counts_missing_images_and_unlabelled_pairs(tmp_path):
    published = write_snli_ve(tmp_path / "data", {"train": range(3), "dev": range(3, 5)})
    (tmp_path / "data" / "flickr30k_images" / "1004.jpg").unlink()
    with (tmp_path / "data" / "snli_ve_train.jsonl").open("a") as f:
        f.write(json.dumps(pair("1000", 7, "-")) + "\n")
    summary = prepare_dataset(SOURCES["snli-ve"], tmp_path / "data", tmp_path / "out", log=lambda _: None)

    assert summary["splits"]["train"] == {"items": 9, "skipped": 1, "missing_images": 0, "images": 3}
    assert summary["splits"]["dev"] == {"items": 3, "skipped": 3, "missing_images": 3, "images": 1}
    assert summary["absent"] == ["test"]
    records = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert [record["file"] for record in records] == [f"flickr30k_images/{1000 + i}.jpg" for i in range(3)]
    first = [p for p in published["train"] if p["Flickr30K_ID"] == "1000"]
    assert records[0] == {"file": "flickr30k_images/1000.jpg", "image_id": "1000", "snli_ve": [
        {"pair_id": p["pairID"], "hypothesis": p["sentence2"], "label": p["gold_label"]} for p in first]}
    annotation = read_annotations(tmp_path / "out" / "train.jsonl")[0]
    assert annotation.image_id == "flickr30k_images/1000" and [p.label for p in annotation.items("snli_ve")] == list(LABELS)
    skipped = [json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert {(s["split"], s["id"]) for s in skipped} == {("train", "1000.jpg#7r1-"), ("dev", "1004")}
    assert (tmp_path / "out" / "images.txt").read_text().splitlines() == [
        f"flickr30k_images/{1000 + i}.jpg" for i in (0, 1, 2, 3)]


@pytest.mark.parametrize("change, message", [
    (lambda line: {**line, "gold_label": "yes"}, "'gold_label' is 'yes', expected one of entailment, neutral, "
                                                 "contradiction"),
    (lambda line: {k: v for k, v in line.items() if k != "sentence2"}, "'sentence2': expected a string, found None"),
    (lambda line: {**line, "Flickr30K_ID": 1000}, "'Flickr30K_ID': expected a string, found 1000"),
    (lambda line: [line], "expected a JSON object, found list"),
])
def test_a_line_that_is_not_a_pair_fails_the_preparation_naming_the_file_and_line(tmp_path, change, message):
    published = write_snli_ve(tmp_path / "data", {"train": range(2)})
    lines = [json.dumps(line) for line in published["train"]]
    lines[4] = json.dumps(change(published["train"][4]))
    (tmp_path / "data" / "snli_ve_train.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as error:
        prepare_dataset(SOURCES["snli-ve"], tmp_path / "data", tmp_path / "out", log=lambda _: None)
    assert str(error.value) == f"{tmp_path / 'data' / 'snli_ve_train.jsonl'}:5: {message}"
    assert not (tmp_path / "out").exists()


def test_a_pair_id_given_twice_fails_the_preparation(tmp_path):
    published = write_snli_ve(tmp_path / "data", {"dev": range(2)})
    with (tmp_path / "data" / "snli_ve_dev.jsonl").open("a") as f:
        f.write(json.dumps(published["dev"][1]) + "\n")
    with pytest.raises(DataError, match=r"snli_ve_dev.jsonl:7: pairID '1001.jpg#0r1e' appears again \(first on "
                                        r"line 2\)"):
        prepare_dataset(SOURCES["snli-ve"], tmp_path / "data", tmp_path / "out", log=lambda _: None)


# ---- the head ----------------------------------------------------------------------------------------


def test_sequence_classification_scores_the_pooled_cls_with_cross_entropy():
    torch.manual_seed(0)
    model = VLBertForSequenceClassification(VLBertConfig.tiny(**TINY, num_labels=3)).eval()
    inputs = make_batch(model.config)
    labels = torch.tensor([0, 2, 1, -100])
    output = model(**inputs, labels=labels)
    assert output.logits.shape == (4, 3)
    expected = model.classifier_head(model.vlbert(**inputs).pooled_output)
    torch.testing.assert_close(output.logits, expected)
    torch.testing.assert_close(output.loss, F.cross_entropy(expected[:3], labels[:3]))
    assert model(**inputs).loss is None
    with pytest.raises(ValueError, match="with_pooler=True"):
        VLBertForSequenceClassification(VLBertConfig.tiny(with_pooler=False))


def test_sequence_classification_saves_loads_and_starts_from_a_pretraining_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = VLBertForSequenceClassification(VLBertConfig.tiny(**TINY, num_labels=5)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    model.save_pretrained(tmp_path / "ve")
    loaded = load_pretrained(tmp_path / "ve").eval()
    assert type(loaded) is VLBertForSequenceClassification and loaded.config == model.config
    assert torch.equal(loaded(**make_batch(model.config)).logits, model(**make_batch(model.config)).logits)

    pretrained = VLBertForPreTraining(VLBertConfig.tiny(**TINY))
    pretrained.save_pretrained(tmp_path / "pretrained")
    fine_tuned = VLBertForSequenceClassification.from_pretrained(tmp_path / "pretrained")
    assert fine_tuned.classifier_head.classifier.out_features == 3
    for name, tensor in pretrained.vlbert.state_dict().items():
        assert torch.equal(fine_tuned.vlbert.state_dict()[name], tensor), name


# ---- the scorer --------------------------------------------------------------------------------------


def test_accuracy_is_the_share_of_gold_labels_overall_and_per_label():
    truth = {"a": "entailment", "b": "entailment", "c": "neutral", "d": "contradiction", "e": "contradiction",
             "f": "contradiction"}
    predicted = {"a": "entailment", "b": "neutral", "c": "neutral", "d": "contradiction", "e": "entailment",
                 "f": "neutral"}
    assert score_snli_ve(truth, predicted) == {"accuracy": 50.0, "count": 6, "per_label": {
        "entailment": 50.0, "neutral": 100.0, "contradiction": 33.33}}


def evaluate_command(*arguments: str):
    return CliRunner().invoke(main, ["evaluate", "snli-ve", *arguments])


def test_evaluate_snli_ve_scores_a_predictions_file_and_refuses_a_wrong_one(tmp_path):
    published = write_snli_ve(tmp_path, {"dev": range(2)})["dev"]
    annotations = tmp_path / "snli_ve_dev.jsonl"
    predictions = tmp_path / "predictions.json"
    given = [{"pair_id": p["pairID"], "label": "entailment"} for p in published]
    predictions.write_text(json.dumps(given))
    result = evaluate_command("--annotations", str(annotations), "--predictions", str(predictions))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"accuracy": 33.33, "count": 6, "per_label": {
        "entailment": 100.0, "neutral": 0.0, "contradiction": 0.0}}

    predictions.write_text(json.dumps(given[1:]))
    with pytest.raises(DataError, match=r"1 of 6 pair_ids have no prediction \(first: '1000.jpg#0r1e'\)"):
        evaluate_snli_ve(annotations, predictions)
    predictions.write_text(json.dumps([{**given[0], "label": "yes"}, *given[1:]]))
    result = evaluate_command("--annotations", str(annotations), "--predictions", str(predictions))
    assert result.exit_code != 0 and f"{predictions}: item 0 is" in result.output
    assert "expected {\"pair_id\": str, \"label\": one of entailment, neutral, contradiction}" in result.output


def test_the_task_evaluator_scores_merges_shards_and_writes_what_evaluate_scores(tmp_path):
    published = write_snli_ve(tmp_path / "data", {"dev": range(3)})["dev"]
    prepare_dataset(SOURCES["snli-ve"], tmp_path / "data", tmp_path / "out", log=lambda _: None)
    data = SimpleNamespace(regions=None, tokenizer=None, max_length=32)  # the evaluator reads no sample
    dataset = TASKS["snli_ve"].dataset(data, None, AnnotationFile(tmp_path / "out" / "dev.jsonl"), 0, False)
    pair_ids = [dataset.item(index)[1].pair_id for index in range(len(dataset))]
    assert sorted(pair_ids) == sorted(p["pairID"] for p in published)
    logits = torch.eye(3)[[0, 0, 1, 1, 2, 2, 0, 1, 2]]  # rows: predicted entailment, ..., contradiction

    def evaluator(rows):
        evaluator = TASKS["snli_ve"].evaluator(data, dataset)
        samples = [SimpleNamespace(item_id=pair_ids[row]) for row in rows]
        evaluator.add(samples, {}, SimpleNamespace(logits=logits[rows]))
        return evaluator

    whole = evaluator(list(range(9)))
    merged = TASKS["snli_ve"].evaluator(data, dataset)
    merged.merge([evaluator(rows).state() for rows in ([0, 3, 6], [1, 4, 7], [2, 5, 8])])
    assert merged.result() == whole.result()
    truth = {pair_id: dataset.item(index)[1].label for index, pair_id in enumerate(pair_ids)}
    right = [ENTAILMENT_LABELS[int(row.argmax())] == truth[pair_id] for row, pair_id in zip(logits, pair_ids)]
    assert whole.item_scores() == {pair_id: float(hit) for pair_id, hit in zip(pair_ids, right)}
    assert whole.result()["value"] == round(sum(right) / 9, 4) and whole.result()["chance"] == round(3 / 9, 4)
    whole.write(tmp_path / "dev.json")
    scored = evaluate_snli_ve(tmp_path / "data" / "snli_ve_dev.jsonl", tmp_path / "dev.json")
    assert scored == whole.result()["official"]


# ---- the pipeline ------------------------------------------------------------------------------------


def shrunk_pipeline(tmp_path: Path) -> Path:
    """The shipped pipeline with 2-step stages of batch 2."""
    pipeline = yaml.safe_load((ROOT / "pipelines" / "configs" / "snli_ve.yaml").read_text())
    for step in pipeline["steps"]:
        for stage in step.get("stages", []):
            stage.update(steps=2, batch_size=2, grad_accumulation=1, warmup_steps=1)
    path = tmp_path / "snli_ve.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    return path


def test_the_snli_ve_pipeline_prepares_extracts_finetunes_and_scores_dev_and_test(tmp_path):
    data = tmp_path / "snli_ve"
    write_snli_ve(data, {"train": range(4), "dev": range(4, 6), "test": range(6, 8)})
    settings = {"data": str(data), "images": str(data), **tiny_checkpoints(tmp_path, HYPOTHESES)}
    out = tmp_path / "run"
    run_pipeline_file(shrunk_pipeline(tmp_path), out, settings)

    summary = json.loads((out / "data" / "summary.json").read_text())
    assert {s: v["items"] for s, v in summary["splits"].items()} == {"train": 12, "dev": 6, "test": 6}
    stage = RunFolder(out / "finetune").stage(0, "snli_ve")
    result = stage.evaluation()
    assert result["metric"] == "snli_ve_accuracy" and result["samples"] == 6 and result["chance"] == round(2 / 6, 4)
    assert json.loads((out / "dev_scores" / "scores.json").read_text()) == result["official"]
    assert result["value"] == round(result["official"]["accuracy"] / 100, 4)
    items = json.loads(stage.item_scores("dev").read_text())["items"]
    assert len(items) == 6 and set(items.values()) <= {0.0, 1.0}
    assert round(float(np.mean(list(items.values()))), 4) == result["value"]
    test_scores = json.loads((out / "test_scores" / "scores.json").read_text())
    assert test_scores == evaluate_snli_ve(data / "snli_ve_test.jsonl", stage.predictions("test", ".json"))
    assert test_scores["count"] == 6

    rerun = run_pipeline_file(shrunk_pipeline(tmp_path), out, settings)
    assert rerun.output.count("up to date") == 7
