"""Zero-shot retrieval (Unicoder-VL's Table 1, first row): an evaluation-only stage (`steps: 0`) that
ranks every pair by a pre-trained relationship head; the COCO 1K protocol's mean over folds; the
three-row retrieval pipeline and its report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pipelines.runner import load_pipeline
from tests.helpers.pipelines import run_pipeline_file
from tests.helpers.worlds import copy_world, run_config
from train.data.annotations import AnnotationFile
from train.data.collate import collate, model_inputs
from train.data.regions import RegionBank
from train.engine.config import RunConfig, RunConfigError, StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from train.evaluation.retrieval import chance_recalls, folds, protocol_recalls
from train.evaluation.statistics import bootstrap_interval, grouped_bootstrap_interval
from train.tasks.retrieval import RetrievalCandidates, RetrievalPairs
from vlbert.modeling import VLBertForImageTextMatching, VLBertForPreTraining
from vlbert.tokenization import load_tokenizer

CONFIGS = Path(__file__).parents[2] / "pipelines" / "configs"
RELATIONSHIP = {"relationship": True, "text_only": False}


# ---- the COCO 1K protocol: the mean over folds ------------------------------------------------

# 4 images × 6 captions (captions 0-1: image 0, 2: image 1, 3-4: image 2, 5: image 3), in two folds of
# 2 images: fold 0 = images 0, 1 with captions 0-2; fold 1 = images 2, 3 with captions 3-5.
CAPTION_IMAGE = np.array([0, 0, 1, 2, 2, 3])
SCORES = np.array([
    [0.9, 0.1, 0.5, 0.95, 0.0, 0.0],
    [0.2, 0.7, 0.3, 0.0, 0.0, 0.99],
    [0.1, 0.2, 0.9, 0.5, 0.4, 0.6],
    [0.0, 0.0, 0.0, 0.7, 0.8, 0.9],
])


def test_folds_rank_among_their_own_images_and_captions_and_average_by_hand() -> None:
    parts = folds(SCORES, CAPTION_IMAGE, 2)
    assert [scores.shape for scores, _ in parts] == [(2, 3), (2, 3)]
    assert [own.tolist() for _, own in parts] == [[0, 0, 1], [0, 0, 1]]
    # Fold 0 (images 0, 1; captions 0, 1, 2). Image 0: own best 0.9 above caption 2's 0.5 → hit; image
    # 1: own 0.3 below caption 1's 0.7 → miss. Caption 0: image 0's 0.9 above 0.2 → hit; caption 1: 0.1
    # below 0.7 → miss; caption 2 (image 1): 0.3 below image 0's 0.5 → miss.
    # Fold 1 (images 2, 3; captions 3, 4, 5). Image 2: own best 0.5 below caption 5's 0.6 → miss; image
    # 3: own 0.9 above 0.7 and 0.8 → hit. Caption 3: 0.5 below 0.7 → miss; caption 4: 0.4 below 0.8 →
    # miss; caption 5 (image 3): 0.9 above 0.6 → hit.
    result = protocol_recalls(parts, resamples=500)
    assert result["recalls"]["i2t_r1"] == round(np.mean([1 / 2, 1 / 2]), 4)
    assert result["recalls"]["t2i_r1"] == round(np.mean([1 / 3, 1 / 3]), 4)
    assert result["recalls"]["i2t_r5"] == 1.0 and result["recalls"]["t2i_r5"] == 1.0
    # The whole split ranks among all 4 images: only caption 0 finds its image first (caption 5's
    # image 3, 0.9, is below image 1's 0.99; caption 3's image 2, 0.5, below 0.95 and 0.7).
    whole = protocol_recalls([(SCORES, CAPTION_IMAGE)], resamples=500)
    assert whole["recalls"]["t2i_r1"] == round(1 / 6, 4)
    assert result["chance_recalls"] == chance_recalls(np.array([0, 0, 1]), 2)
    assert result["chance_recalls"]["t2i_r1"] == 0.5


def test_fold_intervals_resample_within_each_fold() -> None:
    """A fold whose queries all hit and one whose queries all miss: every stratified resample has mean
    0.5, so the interval is [0.5, 0.5]; pooling the queries would spread it."""
    assert grouped_bootstrap_interval([np.ones(5), np.zeros(7)], resamples=500).to_list() == [0.5, 0.5]
    scores = np.random.default_rng(1).random(40)
    assert grouped_bootstrap_interval([scores], 500, seed=3) == bootstrap_interval(scores, 500, seed=3)


def test_images_after_the_last_full_fold_belong_to_none() -> None:
    assert [scores.shape[0] for scores, _ in folds(SCORES, CAPTION_IMAGE, 3)] == [3]
    assert folds(SCORES, CAPTION_IMAGE, 5) == []


def test_the_report_table_marks_intervals_above_the_random_ranking() -> None:
    from pipelines.report.retrieval import RECALLS, retrieval_tables

    chance = dict.fromkeys(RECALLS, 0.1)
    found = {"recalls": dict.fromkeys(RECALLS, 0.3), "chance_recalls": chance,
             "recall_intervals": {**dict.fromkeys(RECALLS, [0.2, 0.4]), "i2t_r1": [0.1, 0.5]}}
    row = {"name": "zero_shot", "init_from": "pretrain/final",
           "retrieval": {"setting": "zero-shot", "images": 4, "captions": 6, "protocols": {"whole split": found}}}
    lines = retrieval_tables([row, {"name": "vqa", "retrieval": None}])
    (line,) = [line for line in lines if line.startswith("| zero_shot |")]
    cells = [cell.strip() for cell in line.split("|")[5:-1]]
    assert cells[0] == "0.300 [0.100, 0.500]"  # the low end equals chance: not above it
    assert cells[1:] == ["0.300 [0.200, 0.400] ▲"] * 5
    assert "| random ranking | | | | 0.100 |" in "\n".join(lines) and "### whole split" in lines


# ---- retrieval options -------------------------------------------------------------------------


def test_the_stage_options_draw_unicoder_vl_s_negatives(tiny_world) -> None:
    """`hard_negatives: 0`: Unicoder-VL's 3 uniformly drawn negatives per direction (the triplet loss
    then takes the hardest of them, margin 0.2: tests/train/test_retrieval.py)."""
    stage = StageConfig("r", "retrieval", steps=1, options={"negatives": 3, "hard_negatives": 0})
    bank = RegionBank(str(tiny_world / "cache"))
    annotations = AnnotationFile(tiny_world / "world" / "train.jsonl", keep=bank.__contains__)
    from train.tasks import TASKS
    from train.tasks.base import TaskData

    data = TaskData(bank, load_tokenizer(tiny_world / "vocab"), 48, annotations)
    pairs = TASKS["retrieval"].dataset(data, stage.options, annotations, 0, True)
    assert isinstance(pairs, RetrievalPairs) and (pairs.negatives, pairs.hard_negatives) == (3, 0)
    assert pairs.group_size == 7
    with pytest.raises(RunConfigError, match="hard_negatives 4 is more than negatives 3"):
        StageConfig("r", "retrieval", steps=1, options={"hard_negatives": 4})
    with pytest.raises(RunConfigError, match="score"):
        StageConfig("r", "retrieval", steps=1, options={"score": "cosine"})


# ---- pre-training's relationship samples ----------------------------------------------------------


def test_another_image_s_caption_is_masked_as_a_matching_one_but_predicts_no_word(tiny_world) -> None:
    """[MASK]s in matching captions only would tell the relationship head the label: it learnt that
    and ranked the unmasked pairs of a retrieval evaluation at chance."""
    from train.tasks.pretrain import CaptionPretraining

    tokenizer = load_tokenizer(tiny_world / "vocab")
    bank = RegionBank(str(tiny_world / "cache"))
    annotations = AnnotationFile(tiny_world / "world" / "train.jsonl", keep=bank.__contains__)
    dataset = CaptionPretraining(annotations, bank, tokenizer, 48, relationship=True, seed=1)
    masked = {0: [], 1: []}
    for index in range(len(dataset)):
        sample = dataset[index]
        label = sample.targets["relationship_labels"]
        masked[label].append(tokenizer.mask_token_id in sample.sequence.input_ids)
        if label == 0:
            assert all(target == -100 for target in sample.sequence.labels)
    assert len(masked[0]) > 5 and len(masked[1]) > 5
    assert abs(np.mean(masked[0]) - np.mean(masked[1])) < 0.35 and np.mean(masked[0]) > 0.2


# ---- zero-shot evaluation on the tiny world ------------------------------------------------------


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    """The tiny world with a tiny model pre-trained a few steps with the relationship head."""
    root = copy_world(tiny_world, tmp_path_factory.mktemp("zeroshot"))
    run = run_config(root, "pretrain", [StageConfig("pretrain", "pretrain", steps=4, batch_size=4,
                                                    options=RELATIONSHIP)])
    Trainer(run).fit()
    return root


def pretrained(world: Path) -> Path:
    return RunFolder(world / "pretrain").stage(0, "pretrain").final


def zero_shot_run(world: Path, out: str, start: Path, **options) -> RunConfig:
    stage = StageConfig("zero_shot", "retrieval", steps=0, options={"score": "relationship", **options})
    return run_config(world, out, [stage], init_from=str(start), eval_batch_size=16)


def test_zero_shot_evaluation_trains_nothing_and_writes_recalls(world) -> None:
    result = Trainer(zero_shot_run(world, "zero_shot", pretrained(world), fold_images=1)).fit()[0]
    folder = RunFolder(world / "zero_shot")
    stage = folder.stage(0, "zero_shot")
    assert result["steps"] == 0 and result["evaluation_only"] and result["zero_shot"]
    assert [record for record in folder.metrics() if "step" in record] == []  # no optimiser step
    assert [record["eval"]["zero_shot"] for record in folder.metrics()] == [True]
    assert stage.checkpoints() == [] and stage.done
    assert folder.config()["stages"][0]["steps"] == 0
    assert folder.config()["stages"][0]["options"]["score"] == "relationship"
    names = {f"{d}_r{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)}
    assert set(result["recalls"]) == set(result["recall_intervals"]) == names
    for name, (low, high) in result["recall_intervals"].items():
        assert low <= result["recalls"][name] <= high
    assert result["pairs"] == result["images"] * result["samples"]
    assert result["folds"]["folds"] == result["images"] and result["folds"]["fold_images"] == 1
    assert result["folds"]["recalls"]["t2i_r1"] == 1.0  # one image per fold: its captions' only choice
    # the final model is the pre-trained one as the retrieval model: a later stage starts from it
    model = VLBertForImageTextMatching.from_pretrained(stage.final)
    assert model.config.with_relationship_head and not hasattr(model, "match_head")


def test_the_score_is_the_relationship_head_s_matching_probability(world) -> None:
    """Every pair's score, recomputed directly with the pre-training model: the softmax of its
    relationship head, class 1 (a matching caption); the stage's recalls are those of that matrix."""
    result = Trainer(zero_shot_run(world, "zero_shot_direct", pretrained(world))).fit()[0]
    tokenizer = load_tokenizer(world / "vocab")
    bank = RegionBank(str(world / "cache"))
    candidates = RetrievalCandidates(AnnotationFile(world / "world" / "val.jsonl", keep=bank.__contains__),
                                     bank, tokenizer, 48)
    batch = collate([candidates[i] for i in range(len(candidates))], tokenizer.pad_token_id)
    pretraining = VLBertForPreTraining.from_pretrained(pretrained(world)).eval()
    matching = VLBertForImageTextMatching.from_pretrained(pretrained(world), with_relationship_head=True).eval()
    with torch.no_grad():
        relationship = pretraining(**model_inputs(pretraining, batch, training=False)).relationship_logits
        probability = torch.softmax(relationship.float(), -1)[:, 1]
        score = matching(**model_inputs(matching, batch, training=False)).logits
    assert torch.allclose(torch.sigmoid(score), probability, atol=1e-6)
    direct = probability.numpy().reshape(len(candidates.images), len(candidates.captions))
    expected = protocol_recalls([(direct, candidates.caption_image)], resamples=100)["recalls"]
    assert result["recalls"] == expected


def test_a_model_without_a_relationship_head_is_a_one_line_error(world) -> None:
    plain = run_config(world, "plain", [StageConfig("pretrain", "pretrain", steps=1, batch_size=2)])
    Trainer(plain).fit()
    start = RunFolder(world / "plain").stage(0, "pretrain").final
    with pytest.raises(RunConfigError) as caught:
        Trainer(zero_shot_run(world, "no_head", start)).fit()
    message = str(caught.value)
    assert "\n" not in message and str(start) in message and "has no relationship_head" in message
    assert "relationship: true" in message
    assert not (world / "no_head" / "stages").exists() or not RunFolder(world / "no_head").stage(0, "zero_shot").done


def test_a_retrieval_model_evaluated_again_is_not_zero_shot_and_its_heads_must_be_there(world) -> None:
    """Evaluating a retrieval checkpoint again is evaluation only, not zero-shot; one whose matching
    head is not the relationship head cannot be scored by a relationship head."""
    Trainer(zero_shot_run(world, "first", pretrained(world))).fit()
    again = Trainer(zero_shot_run(world, "again", RunFolder(world / "first").stage(0, "zero_shot").final)).fit()[0]
    assert again["evaluation_only"] and not again["zero_shot"]
    tuned = run_config(world, "tuned", [StageConfig("tune", "retrieval", steps=1, batch_size=2)])
    Trainer(tuned).fit()
    start = RunFolder(world / "tuned").stage(0, "tune").final
    with pytest.raises(RunConfigError, match=f"{start} has no relationship_head$"):
        Trainer(zero_shot_run(world, "matching_head", start)).fit()


def test_evaluation_only_needs_every_weight_of_the_task_model(world) -> None:
    """`score: matching` from a pre-trained model: its matching head would be random."""
    run = zero_shot_run(world, "random_head", pretrained(world), score="matching")
    with pytest.raises(RunConfigError, match=r"steps: 0 evaluates the model as .* has no weights for "
                                             r"match_head.classifier \(they would be random\)"):
        Trainer(run).fit()


def test_evaluation_only_needs_a_checkpoint_to_start_from(world) -> None:
    with pytest.raises(RunConfigError, match=r"stages\[0\].steps: 0 evaluates .* starts from random weights"):
        run_config(world, "nothing", [StageConfig("zero_shot", "retrieval", steps=0)])
    stage = StageConfig("tune", "retrieval", steps=1, options={"score": "relationship"})
    with pytest.raises(RunConfigError, match="pre-trained relationship head.*starts from random weights"):
        Trainer(run_config(world, "fresh", [stage])).fit()


# ---- the three-row pipeline ----------------------------------------------------------------------


def test_the_shipped_pipeline_holds_unicoder_vl_s_three_rows() -> None:
    pipeline = load_pipeline(CONFIGS / "retrieval_unicoder.yaml")
    steps = {step.name: step for step in pipeline.steps}
    (zero_shot,) = steps["zero_shot"].params["stages"]
    assert zero_shot["steps"] == 0 and zero_shot["options"]["score"] == "relationship"
    assert steps["pretrain"].params["stages"][0]["options"]["relationship"] is True
    assert "init_from" not in steps["scratch"].params
    assert steps["finetuned"].params["init_from"] == steps["zero_shot"].params["init_from"]
    assert [Path(run).name for run in steps["report"].params["runs"]] == ["zero_shot", "scratch", "finetuned"]
    for name in ("scratch", "finetuned"):  # Unicoder-VL's objective: 3 uniform negatives, triplet, margin 0.2
        (stage,) = steps[name].params["stages"]
        assert stage["options"]["hard_negatives"] == 0 and "matching_loss" not in steps[name].params["model"]


def shrunk(tmp_path: Path) -> Path:
    """The shipped pipeline on a 24-image world with 2-step training stages; the evaluation-only stage
    stays so, and folds hold one image."""
    pipeline = yaml.safe_load((CONFIGS / "retrieval_unicoder.yaml").read_text())
    for step in pipeline["steps"]:
        if step["kind"] == "world":
            step["images"] = 24
        for name in ("detector", "weights"):  # the file moves; the demo detector stays where it is
            if name in step:
                step[name] = step[name].replace("${here}", str(CONFIGS))
        for stage in step.get("stages", []):
            if stage["steps"]:
                stage.update(steps=2, batch_size=2, warmup_steps=1, checkpoint_every=0)
            if stage["task"] == "retrieval":
                stage["options"]["fold_images"] = 1
    path = tmp_path / "retrieval_unicoder.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    return path


def test_the_pipeline_runs_to_a_report_of_the_three_rows(tmp_path) -> None:
    out = tmp_path / "run"
    run_pipeline_file(shrunk(tmp_path), out, {})
    report = json.loads((out / "report" / "report.json").read_text())
    rows = {row["name"]: row for row in report["runs"]}
    assert list(rows) == ["zero_shot", "scratch", "finetuned"]
    assert [rows[name]["retrieval"]["setting"] for name in rows] == ["zero-shot", "fine-tuned, 2 steps",
                                                                     "fine-tuned, 2 steps"]
    for row in rows.values():
        (whole, folded) = row["retrieval"]["protocols"].values()
        assert set(whole["recall_intervals"]) == set(whole["recalls"]) and len(whole["recalls"]) == 6
        assert folded["recalls"]["t2i_r1"] == 1.0
    text = (out / "report" / "report.md").read_text()
    assert "## Image–text retrieval" in text and "### whole split" in text
    table = text.split("### whole split")[1].split("###")[0]
    assert all(f"| {name} |" in table for name in rows) and "| random ranking |" in table
