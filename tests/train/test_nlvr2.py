"""NLVR2 (visual reasoning over image pairs) as a task: the reader of its published files, the pair
classification head, accuracy and consistency and `vlbert evaluate nlvr2`, the task's dataset and
evaluator on a prepared split, and a tiny VL-BERT trained on the demo world written in NLVR2's
published layout."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from pipelines.cli import main
from pipelines.world.nlvr2 import write_world_nlvr2
from tests.helpers.models import make_batch
from tests.helpers.pipelines import run_pipeline_file, tiny_checkpoints, write_image
from tests.helpers.worlds import run_config
from train.data.annotations import AnnotationFile, read_annotations
from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.sources import SOURCES
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from train.evaluation.nlvr2 import evaluate_nlvr2, score_nlvr2
from train.tasks import TASKS
from vlbert import VLBertConfig, VLBertForPairClassification, VLBertForPreTraining, load_pretrained

ROOT = Path(__file__).parents[2]
SENTENCES = ("there are two dogs in total", "one image shows a red square", "the left image has a car")
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=128, geometry_frequencies=8, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, visual_dropout_prob=0.0, classifier_dropout=0.0)


def statement(split: str, set_id: int, pair_id: int, sentence_id: int, label: bool) -> dict:
    """A line as published (the fields the task does not read as well)."""
    return {"identifier": f"{split}-{set_id}-{pair_id}-{sentence_id}", "sentence": SENTENCES[sentence_id],
            "label": str(label), "left_url": "https://example.invalid/l.jpg",
            "right_url": "https://example.invalid/r.jpg", "synset": "dog", "query": "two dogs", "writer": "w1",
            "validation": {"w2": "True"}}


def write_nlvr2(root: Path, sets: dict[str, range], subfolders: bool = False) -> dict[str, list[dict]]:
    """<split>.json for each split of `sets` (split → set ids): two image pairs a set, each paired
    with sentences 0 and 1 (sentence 0 true of pair 0 only); the images under <split>/, or under
    <split>/<set % 2>/ as the official train download has them."""
    published = {}
    for split, ids in sets.items():
        lines = [statement(split, s, p, n, (n + p + s) % 2 == 0) for s in ids for n in (0, 1) for p in (0, 1)]
        for s in ids:
            for p in (0, 1):
                for side in (0, 1):
                    folder = root / split / str(s % 2) if subfolders else root / split
                    write_image(folder / f"{split}-{s}-{p}-img{side}.png", 4 * s + 2 * p + side)
        (root / f"{split}.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
        published[split] = lines
    return published


# ---- the reader ------------------------------------------------------------------------------------


def test_prepare_puts_a_pairs_statements_on_its_left_image_and_finds_images_in_subfolders(tmp_path):
    write_nlvr2(tmp_path / "data", {"train": range(2)}, subfolders=True)
    write_nlvr2(tmp_path / "data", {"dev": range(2, 4)})
    (tmp_path / "data" / "dev" / "dev-3-1-img1.png").unlink()
    summary = prepare_dataset(SOURCES["nlvr2"], tmp_path / "data", tmp_path / "out", log=lambda _: None)

    assert summary["splits"]["train"] == {"items": 8, "skipped": 0, "missing_images": 0, "image_pairs": 4}
    assert summary["splits"]["dev"] == {"items": 6, "skipped": 2, "missing_images": 2, "image_pairs": 3}
    assert summary["absent"] == ["test1"]
    records = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert records[:2] == [
        {"file": "train/0/train-0-0-img0.png", "image_id": "train-0-0-img0", "nlvr2": [
            {"identifier": "train-0-0-0", "sentence": SENTENCES[0], "label": True,
             "right": "train/0/train-0-0-img1.png"},
            {"identifier": "train-0-0-1", "sentence": SENTENCES[1], "label": False,
             "right": "train/0/train-0-0-img1.png"}]},
        {"file": "train/0/train-0-0-img1.png", "image_id": "train-0-0-img1"}]
    annotation = read_annotations(tmp_path / "out" / "train.jsonl")[0]
    assert annotation.image_id == "train/0/train-0-0-img0"
    assert annotation.items("nlvr2")[0].right_image_id == "train/0/train-0-0-img1"
    skipped = [json.loads(line) for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert skipped == [{"split": "dev", "id": "dev-3-1", "reason": skipped[0]["reason"]}]
    assert "dev/[*/]dev-3-1-img1" in skipped[0]["reason"]
    images = (tmp_path / "out" / "images.txt").read_text().splitlines()
    assert len(images) == 2 * (4 + 3) and images[-2:] == ["dev/dev-3-0-img0.png", "dev/dev-3-0-img1.png"]


@pytest.mark.parametrize("change, message", [
    (lambda line: {**line, "label": "true"}, "'label' is 'true', expected \"True\" or \"False\""),
    (lambda line: {k: v for k, v in line.items() if k != "sentence"}, "'sentence': expected a string, found None"),
    (lambda line: {**line, "identifier": "dev-850-0"}, "'identifier' is 'dev-850-0', expected "
                                                       "split-setid-pairid-sentenceid (e.g. dev-850-0-0)"),
    (lambda line: [line], "expected a JSON object, found list"),
])
def test_a_line_that_is_not_a_statement_fails_the_preparation_naming_the_file_and_line(tmp_path, change, message):
    published = write_nlvr2(tmp_path / "data", {"dev": range(2)})
    lines = [json.dumps(line) for line in published["dev"]]
    lines[4] = json.dumps(change(published["dev"][4]))
    (tmp_path / "data" / "dev.json").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as error:
        prepare_dataset(SOURCES["nlvr2"], tmp_path / "data", tmp_path / "out", log=lambda _: None)
    assert str(error.value) == f"{tmp_path / 'data' / 'dev.json'}:5: {message}"
    assert not (tmp_path / "out").exists()


def test_two_images_of_one_name_in_a_splits_folders_fail_the_preparation(tmp_path):
    write_nlvr2(tmp_path / "data", {"train": range(2)}, subfolders=True)
    first = next((tmp_path / "data" / "train").rglob("train-0-0-img0.png"))
    (tmp_path / "data" / "train" / "99").mkdir()
    (tmp_path / "data" / "train" / "99" / first.name).write_bytes(first.read_bytes())
    with pytest.raises(DataError, match=rf"{first.relative_to(tmp_path / 'data').as_posix()} and train/99/"
                                        r"train-0-0-img0.png: two images named train-0-0-img0; keep one"):
        prepare_dataset(SOURCES["nlvr2"], tmp_path / "data", tmp_path / "out", log=lambda _: None)


def test_an_identifier_given_twice_fails_the_preparation(tmp_path):
    published = write_nlvr2(tmp_path / "data", {"dev": range(1)})
    with (tmp_path / "data" / "dev.json").open("a") as f:
        f.write(json.dumps(published["dev"][1]) + "\n")
    with pytest.raises(DataError, match=r"dev.json:5: identifier 'dev-0-1-0' appears again \(first on line 2\)"):
        prepare_dataset(SOURCES["nlvr2"], tmp_path / "data", tmp_path / "out", log=lambda _: None)


# ---- the head ----------------------------------------------------------------------------------------

# Six sequences, three pairs: each pair's left image, then its right.
PAIRS = dict(text_lengths=(7, 5, 6, 4, 6, 5), region_counts=(5, 3, 4, 5, 4, 5))


def test_pair_classification_joins_each_pairs_two_pooled_outputs_and_scores_them_with_cross_entropy():
    torch.manual_seed(0)
    model = VLBertForPairClassification(VLBertConfig.tiny(**TINY)).eval()
    inputs = make_batch(model.config, **PAIRS)
    output = model(**inputs, labels=torch.tensor([[1, 1], [0, 0], [-100, -100]]))
    assert output.logits.shape == (3, 2)
    pooled = model.vlbert(**inputs).pooled_output
    joined = torch.cat([pooled[0::2], pooled[1::2]], dim=1)  # (3, 2H): left, right
    head = model.pair_head
    expected = head.classifier(head.layer_norm(head.activation(head.dense(joined))))
    torch.testing.assert_close(output.logits, expected)
    torch.testing.assert_close(output.loss, F.cross_entropy(expected[:2], torch.tensor([1, 0])))
    torch.testing.assert_close(model(**inputs, labels=torch.tensor([1, 0, -100])).loss, output.loss)
    assert model(**inputs).loss is None
    with pytest.raises(ValueError, match="one label per pair"):
        model(**inputs, labels=torch.tensor([[1, 0], [0, 0], [1, 1]]))
    with pytest.raises(ValueError, match="with_pooler=True"):
        VLBertForPairClassification(VLBertConfig.tiny(with_pooler=False))


def test_pair_classification_saves_loads_and_starts_from_a_pretraining_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = VLBertForPairClassification(VLBertConfig.tiny(**TINY)).eval()
    model.save_pretrained(tmp_path / "nlvr2")
    loaded = load_pretrained(tmp_path / "nlvr2").eval()
    assert type(loaded) is VLBertForPairClassification and loaded.config == model.config
    inputs = make_batch(model.config, **PAIRS)
    assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)

    pretrained = VLBertForPreTraining(VLBertConfig.tiny(**TINY))
    pretrained.save_pretrained(tmp_path / "pretrained")
    fine_tuned = VLBertForPairClassification.from_pretrained(tmp_path / "pretrained")
    for name, tensor in pretrained.vlbert.state_dict().items():
        assert torch.equal(fine_tuned.vlbert.state_dict()[name], tensor), name


# ---- the metrics -------------------------------------------------------------------------------------


def test_consistency_is_the_share_of_distinct_statements_right_on_every_pair():
    # Set 1's sentence 0 on pairs 0, 1, 2 (all right), its sentence 1 on pairs 0, 1 (one wrong); set 2's
    # sentence 0 (another set: another statement) on pair 0 (wrong).
    truth = {"dev-1-0-0": True, "dev-1-1-0": False, "dev-1-2-0": True, "dev-1-0-1": True, "dev-1-1-1": True,
             "dev-2-0-0": False}
    predicted = {"dev-1-0-0": True, "dev-1-1-0": False, "dev-1-2-0": True, "dev-1-0-1": True, "dev-1-1-1": False,
                 "dev-2-0-0": True}
    assert score_nlvr2(truth, predicted) == {"accuracy": 66.67, "consistency": 33.33, "count": 6, "statements": 3}


def test_consistency_groups_by_split_set_and_sentence_id_as_the_official_script(tmp_path):
    """lil-lab/nlvr's nlvr2/eval/metrics.py groups an identifier split-setid-pairid-sentenceid by all
    but its pair id: one text written twice for a set (sentence ids 0 and 1) is two statements, and the
    same ids in two splits are two statements."""
    statements = [("dev-7-0-0", "Two dogs.", True, True), ("dev-7-1-0", "Two dogs.", False, False),
                  ("dev-7-0-1", "Two dogs.", False, True), ("test1-7-0-0", "Two dogs.", True, True)]
    truth = {identifier: label for identifier, _, label, _ in statements}
    predicted = {identifier: prediction for identifier, _, _, prediction in statements}
    assert score_nlvr2(truth, predicted) == {"accuracy": 75.0, "consistency": 66.67, "count": 4, "statements": 3}
    # The same through `vlbert evaluate nlvr2` on a published file (one split) and its predictions CSV.
    dev = [(identifier, text, label, prediction) for identifier, text, label, prediction in statements
           if identifier.startswith("dev-")]
    (tmp_path / "dev.json").write_text("".join(json.dumps({"identifier": identifier, "sentence": text,
                                                           "label": str(label)}) + "\n"
                                               for identifier, text, label, _ in dev))
    (tmp_path / "dev.csv").write_text("".join(f"{identifier},{prediction}\n" for identifier, _, _, prediction in dev))
    result = evaluate_command("--annotations", str(tmp_path / "dev.json"), "--predictions", str(tmp_path / "dev.csv"))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"accuracy": 66.67, "consistency": 50.0, "count": 3, "statements": 2}


def evaluate_command(*arguments: str):
    return CliRunner().invoke(main, ["evaluate", "nlvr2", *arguments])


def test_evaluate_nlvr2_scores_a_predictions_file_and_refuses_a_wrong_one(tmp_path):
    published = write_nlvr2(tmp_path, {"dev": range(2)})["dev"]
    predictions = tmp_path / "predictions.csv"
    predictions.write_text("".join(f"{line['identifier']},True\n" for line in published))
    result = evaluate_command("--annotations", str(tmp_path / "dev.json"), "--predictions", str(predictions))
    assert result.exit_code == 0, result.output
    # Truth: sentence 0 of set s true of pair s % 2; sentence 1 of pair 1 - s % 2: each statement half right.
    assert json.loads(result.stdout) == {"accuracy": 50.0, "consistency": 0.0, "count": 8, "statements": 4}

    predictions.write_text("".join(f"{line['identifier']},True\n" for line in published[1:]))
    with pytest.raises(DataError, match=r"1 of 8 identifiers have no prediction \(first: 'dev-0-0-0'\)"):
        evaluate_nlvr2(tmp_path / "dev.json", predictions)
    predictions.write_text("dev-0-0-0,yes\n")
    result = evaluate_command("--annotations", str(tmp_path / "dev.json"), "--predictions", str(predictions))
    assert result.exit_code != 0 and f"{predictions}:1: 'dev-0-0-0,yes', expected identifier,True" in result.output


# ---- the task ----------------------------------------------------------------------------------------


def test_the_task_evaluator_scores_merges_shards_and_writes_what_evaluate_scores(tmp_path):
    write_nlvr2(tmp_path / "data", {"dev": range(2)})
    prepare_dataset(SOURCES["nlvr2"], tmp_path / "data", tmp_path / "out", log=lambda _: None)
    held = {f"dev/dev-{s}-{p}-img{side}" for s in range(2) for p in range(2) for side in range(2)}
    data = SimpleNamespace(regions=held, tokenizer=None, max_length=32)  # the evaluator reads no sample
    annotations = AnnotationFile(tmp_path / "out" / "dev.jsonl")
    lacking = SimpleNamespace(**{**vars(data), "regions": held - {"dev/dev-1-0-img1"}})
    partial = TASKS["nlvr2"].dataset(lacking, None, annotations, 0, False)
    assert len(partial) == 6 and partial.missing_right == 2  # a right image the store lacks: its statements left out
    dataset = TASKS["nlvr2"].dataset(data, None, annotations, 0, False)
    statements = [dataset.item(index)[1] for index in range(len(dataset))]
    assert len(statements) == 8 and dataset.missing_right == 0
    logits = torch.eye(2)[[1, 1, 0, 1, 0, 0, 1, 1]]  # rows: predicted false, true

    def evaluator(rows):
        evaluator = TASKS["nlvr2"].evaluator(data, dataset)
        groups = [SimpleNamespace(samples=[SimpleNamespace(item_id=statements[row].identifier)] * 2) for row in rows]
        evaluator.add(groups, {}, SimpleNamespace(logits=logits[rows]))
        return evaluator

    whole = evaluator(list(range(8)))
    merged = TASKS["nlvr2"].evaluator(data, dataset)
    merged.merge([evaluator(rows).state() for rows in ([0, 2, 4, 6], [1, 3, 5, 7])])
    assert merged.result() == whole.result()
    right = [bool(row.argmax()) == s.label for row, s in zip(logits, statements)]
    assert whole.item_scores() == {s.identifier: float(hit) for s, hit in zip(statements, right)}
    result = whole.result()
    assert result["value"] == round(sum(right) / 8, 4) and result["chance"] == 0.5
    assert result["consistency"] == round(result["official"]["consistency"] / 100, 4)
    whole.write(tmp_path / "dev.csv")
    assert evaluate_nlvr2(tmp_path / "data" / "dev.json", tmp_path / "dev.csv") == result["official"]


def test_a_tiny_model_trained_on_the_demo_world_in_nlvr2s_layout_scores_above_the_majority_class(tiny_world, tmp_path):
    """Published layout → prepare → extract (tiny detector) → train → accuracy on the training split
    (the demo world's val split is too small to show learning in seconds) above always saying false."""
    assert write_world_nlvr2(tiny_world / "world", tmp_path / "nlvr2") == {"train": 240, "dev": 48}
    summary = prepare_dataset(SOURCES["nlvr2"], tmp_path / "nlvr2", tmp_path / "prepared", log=lambda _: None)
    assert summary["splits"]["train"]["items"] == 240 and summary["splits"]["train"]["image_pairs"] == 20
    run_extraction(ExtractionConfig(tmp_path / "nlvr2", "tiny", image_list=tmp_path / "prepared" / "images.txt",
                                    batch_size=4, progress=False), tmp_path / "cache")
    train = str(tmp_path / "prepared" / "train.jsonl")
    stage = StageConfig("nlvr2", "nlvr2", steps=150, batch_size=8, base_lr=5e-4, num_workers=0)
    # The run folder outside the read-only world (an absolute `out` stays itself under the world's root).
    run = run_config(tiny_world, str(tmp_path / "run"), [stage], store=str(tmp_path / "cache"),
                     train_annotations=train, eval_annotations=train)
    result = Trainer(run).fit()[0]
    assert result["metric"] == "nlvr2_accuracy" and result["samples"] == 240
    assert result["chance"] == 0.65 and result["value"] > result["chance"]
    assert result["official"]["statements"] == 120 and 0 <= result["consistency"] <= result["value"]


# ---- the pipeline ------------------------------------------------------------------------------------


def shrunk_pipeline(tmp_path: Path) -> Path:
    """The shipped pipeline with 2-step stages of batch 2."""
    pipeline = yaml.safe_load((ROOT / "pipelines" / "configs" / "nlvr2.yaml").read_text())
    for step in pipeline["steps"]:
        for stage in step.get("stages", []):
            stage.update(steps=2, batch_size=2, grad_accumulation=1, warmup_steps=1)
    path = tmp_path / "nlvr2.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    return path


def test_the_nlvr2_pipeline_prepares_extracts_finetunes_and_scores_dev_and_test1(tmp_path):
    data = tmp_path / "nlvr2"
    write_nlvr2(data, {"train": range(2)}, subfolders=True)
    write_nlvr2(data, {"dev": range(2, 4), "test1": range(4, 6)})
    settings = {"data": str(data), "images": str(data), **tiny_checkpoints(tmp_path, " ".join(SENTENCES).split())}
    out = tmp_path / "run"
    run_pipeline_file(shrunk_pipeline(tmp_path), out, settings)

    summary = json.loads((out / "data" / "summary.json").read_text())
    assert {s: v["items"] for s, v in summary["splits"].items()} == {"train": 8, "dev": 8, "test1": 8}
    stage = RunFolder(out / "finetune").stage(0, "nlvr2")
    result = stage.evaluation()
    assert result["metric"] == "nlvr2_accuracy" and result["samples"] == 8 and result["chance"] == 0.5
    assert json.loads((out / "dev_scores" / "scores.json").read_text()) == result["official"]
    assert result["value"] == round(result["official"]["accuracy"] / 100, 4)
    items = json.loads(stage.item_scores("dev").read_text())["items"]
    assert len(items) == 8 and round(float(np.mean(list(items.values()))), 4) == result["value"]
    test_scores = json.loads((out / "test1_scores" / "scores.json").read_text())
    assert test_scores == evaluate_nlvr2(data / "test1.json", stage.predictions("test1", ".csv"))
    assert test_scores["count"] == 8
