"""Training from the FeatureStore: samples, batches, stages, crash and resume, end-to-end tuning."""

import json

import numpy as np
import pytest
import torch
from torchvision.ops import box_iou

from tests.helpers.worlds import copy_world, run_config
from train.data.annotations import AnnotationFile, AnswerVocabulary
from train.data.collate import collate, to_device
from train.data.regions import RegionBank
from train.data.sources.text import TextCorpus
from train.end2end import EndToEndVisual
from train.engine.config import StageConfig
from train.engine.model_building import stage_model
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from train.tasks.pretrain import CaptionPretraining, TextOnlyCorpus
from train.tasks.refexp import ReferringExpressions
from train.tasks.vqa import QuestionAnswering
from vlbert.tokenization import load_tokenizer, word_pieces


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("training"))


@pytest.fixture(scope="module")
def parts(world):
    tokenizer = load_tokenizer(world / "vocab")
    bank = RegionBank(str(world / "cache"))
    return tokenizer, AnnotationFile(world / "world" / "train.jsonl", keep=bank.__contains__), bank


def test_regions_put_the_whole_image_first(parts, world):
    _, annotations, bank = parts
    image_id = annotations[0].image_id
    regions = bank.get(image_id, class_probs=True, variants=True)
    record = bank.store[image_id]
    assert regions.boxes[0].tolist() == [0, 0, record["image_w"], record["image_h"]]
    assert np.allclose(regions.appearance[0], record["image_feature"])
    assert np.allclose(regions.appearance[1:], record["features"])
    assert not regions.variant_masks[:, 0].any() and regions.variant_masks[:, 1:].any(axis=1).all()
    assert regions.class_probs[0].sum() == 0 and np.allclose(regions.class_probs[1:].sum(1), 1, atol=0.05)
    # Features keep the store's float16 until they reach the device, where they widen exactly.
    assert regions.appearance.dtype == regions.variant_appearance.dtype == np.float16
    assert bank[image_id].variant_masks is None and bank[image_id].class_probs is None


def test_pixel_masking_takes_one_cached_variant(parts):
    tokenizer, annotations, bank = parts
    dataset = CaptionPretraining(annotations, bank, tokenizer, 48, roi_masking="pixel", seed=1)
    for index in range(5):
        sample = dataset[index]
        regions = bank.get(dataset.item(index)[0].image_id, class_probs=True, variants=True).truncated(len(sample.regions))
        variant = [k for k in range(len(regions.variant_masks))
                   if np.array_equal(regions.variant_masks[k], sample.masked_regions)]
        assert variant, "the masked RoIs are one cached variant's"
        assert np.allclose(sample.regions.appearance, regions.variant_appearance[variant[0]])
        labels = sample.region_targets["region_labels"]
        assert np.array_equal(labels.sum(1) > 0, sample.masked_regions)
        assert np.allclose(labels[sample.masked_regions], regions.class_probs[sample.masked_regions])


def test_samples_depend_on_seed_epoch_and_index_only(parts):
    tokenizer, annotations, bank = parts
    dataset = CaptionPretraining(annotations, bank, tokenizer, 48, roi_masking="feature", seed=2)
    first = [dataset[i].sequence.input_ids for i in range(8)]
    assert [dataset[i].sequence.input_ids for i in reversed(range(8))][::-1] == first
    dataset.set_epoch(1)
    assert [dataset[i].sequence.input_ids for i in range(8)] != first
    sample = dataset[0]
    assert not sample.masked_regions[0]  # never the whole-image box


def test_relationship_mismatches_are_half_and_never_a_caption_of_the_image(parts):
    """Count captions repeat across images: drawn as another image's caption, one would be a matching
    pair labelled as a mismatch. (Relationship alone: captions unmasked, so each sample's reads back.)"""
    tokenizer, annotations, bank = parts
    dataset = CaptionPretraining(annotations, bank, tokenizer, 64, relationship=True, seed=0, masked_lm=False,
                                 masked_roi=False)
    images = [annotations[k] for k in range(len(annotations))]
    assert any(set(a.captions) & set(b.captions) for a in images for b in images if a is not b)  # the trap exists
    labels = []
    for epoch in range(8):
        dataset.set_epoch(epoch)
        for index in range(len(dataset)):
            sample, image = dataset[index], dataset.item(index)[0]
            text = sample.sequence.input_ids[1 : sample.sequence.input_ids.index(tokenizer.sep_token_id)]
            own = [word_pieces(tokenizer, caption).ids for caption in image.captions]
            labels.append(sample.targets["relationship_labels"])
            assert (text in own) == (labels[-1] == 1)
    assert 0.4 < np.mean(labels) < 0.6


@pytest.mark.parametrize("roi_masking", ["pixel", "feature"])
def test_words_and_rois_are_masked_only_for_the_losses_that_predict_them(parts, roi_masking):
    tokenizer, annotations, bank = parts
    for masked_lm, masked_roi in [(False, False), (True, False), (False, True)]:
        dataset = CaptionPretraining(annotations, bank, tokenizer, 48, roi_masking=roi_masking, relationship=True,
                                     seed=3, masked_lm=masked_lm, masked_roi=masked_roi)
        samples = [dataset[index] for index in range(len(dataset))]
        masks = sum(s.sequence.input_ids.count(tokenizer.mask_token_id) for s in samples)
        assert (masks > 0) == masked_lm
        assert any(s.masked_regions.any() for s in samples) == masked_roi
        if not masked_roi:  # the stored features, as evaluation reads them
            for index, sample in zip(range(len(dataset)), samples):
                stored = bank[dataset.item(index)[0].image_id].appearance[: len(sample.regions)]
                assert np.array_equal(sample.regions.appearance, stored) and not sample.region_targets


def test_mixed_batches_hold_text_only_samples(parts, tmp_path):
    tokenizer, annotations, bank = parts
    captions = CaptionPretraining(annotations, bank, tokenizer, 48, relationship=True, seed=0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a long sentence about a red circle and a blue square\n")
    text = TextOnlyCorpus(TextCorpus(corpus), tokenizer, 48)
    batch = collate([captions[0], captions[1], text[0]], tokenizer.pad_token_id)
    assert batch["box_mask"][2].sum() == 0 and batch["box_mask"][0, 0]
    assert batch["relationship_labels"][2] == -100 and batch["relationship_labels"][0] in (0, 1)
    assert batch["region_labels"].shape[:2] == batch["box_mask"].shape
    sequence = text[0].sequence
    assert batch["mlm_labels"][2, : len(sequence)].tolist() == sequence.labels
    assert batch["text_mask"][2].sum() == len(sequence)
    assert batch["image_files"][2] is None


def test_vqa_and_referring_expression_targets(parts):
    tokenizer, annotations, bank = parts
    answers = AnswerVocabulary.from_annotations(annotations)
    vqa = QuestionAnswering(annotations, bank, tokenizer, 48, answers)
    sample = vqa[0]
    answer = vqa.item(0)[1].answers[0]
    assert sample.targets["labels"].sum() == 1 and answers.answers[int(sample.targets["labels"].argmax())] == answer
    assert sample.sequence.input_ids[sample.sequence.answer_position] == tokenizer.mask_token_id
    # The official soft score: the mean over the ten leave-one-out subsets of min(1, matches / 3).
    ten = ["cat"] * 2 + ["Dog."] * 8  # answers are compared after the official normalisation
    assert np.allclose(AnswerVocabulary(["cat", "dog", "cow"]).scores(ten), [(8 * 2 / 3 + 2 * 1 / 3) / 10, 1.0, 0.0])

    refs = ReferringExpressions(annotations, bank, tokenizer, 48)
    sample = refs[0]
    target = np.asarray(refs.item(0)[1].box, np.float32)
    expected = box_iou(torch.from_numpy(sample.regions.boxes), torch.from_numpy(target)[None])[:, 0].numpy() >= 0.5
    expected[0] = False
    assert np.array_equal(sample.region_targets["labels"] > 0, expected)


STAGES = [StageConfig("pretrain", "pretrain", steps=6, batch_size=4, checkpoint_every=2, base_lr=5e-4),
          StageConfig("vqa", "vqa", steps=3, batch_size=4, base_lr=5e-4)]


def losses(out) -> list[tuple]:
    records = [json.loads(line) for line in RunFolder(out).metrics_file.read_text().splitlines()]
    return [(r["stage"], r["step"], r["loss"]) for r in records if "step" in r]


def test_resume_after_a_crash_repeats_the_uninterrupted_run(world, monkeypatch):
    straight = Trainer(run_config(world, "straight", STAGES))
    results = straight.fit()
    assert [r["metric"] for r in results] == ["masked_word_accuracy", "vqa_accuracy"]

    calls = {"n": 0}
    original_step = torch.optim.AdamW.step

    def crashing_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # mid pre-training, after the checkpoint of step 4
            raise RuntimeError("simulated crash")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", crashing_step)
    crashed = Trainer(run_config(world, "crashed", STAGES))
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.fit()
    monkeypatch.setattr(torch.optim.AdamW, "step", original_step)
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(run_config(world, "crashed", STAGES)).fit()
    Trainer(run_config(world, "crashed", STAGES)).fit(resume=True)
    assert losses(world / "crashed") == losses(world / "straight")
    for index, stage in enumerate(("pretrain", "vqa")):
        a = (RunFolder(world / "straight").stage(index, stage).final / "model.safetensors").read_bytes()
        b = (RunFolder(world / "crashed").stage(index, stage).final / "model.safetensors").read_bytes()
        assert a == b


def test_end_to_end_stage_trains_res3_to_res5_only(world):
    run = run_config(world, "e2e", [StageConfig("vqa", "vqa", steps=2, batch_size=2, visual="end2end", base_lr=1e-3)])
    trainer = Trainer(run)
    before = EndToEndVisual.from_store_meta(trainer.regions.store.meta, None, None).detector.state_dict()
    before = {k: v.clone() for k, v in before.items()}
    trainer.fit()
    from safetensors.torch import load_file

    after = load_file(RunFolder(world / "e2e").stage(0, "vqa").final / "detector.safetensors")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("backbone.res3.") for k in changed) and any(k.startswith("roi_heads.res5.") for k in changed)
    assert not any(k.startswith(("backbone.stem.", "backbone.res2.")) or "norm" in k for k in changed)


def test_end_to_end_features_match_the_cache_before_tuning(parts, world):
    """With the extraction detector and no masking, recomputed features equal the cached ones."""
    tokenizer, annotations, bank = parts
    dataset = QuestionAnswering(annotations, bank, tokenizer, 48, AnswerVocabulary.from_annotations(annotations))
    batch = collate([dataset[0], dataset[1]], tokenizer.pad_token_id)
    batch.update(to_device(batch, torch.device("cpu")))  # as the trainer hands it over: features widened
    visual = EndToEndVisual.from_store_meta(bank.store.meta, str(world / "world"), None)
    with torch.no_grad():
        recomputed = visual(batch)
    mask = batch["box_mask"]
    assert torch.allclose(recomputed[mask], batch["appearance"][mask], atol=2e-2, rtol=1e-2)


def test_two_processes_train_like_one_with_the_whole_batch(world):
    """DDP with gloo: 2 processes of batch 2, or of batch 1 accumulating 2 micro-batches (gradients
    all-reduced once, on the last), see the same samples per step as 1 process of batch 4 (each rank
    takes every other index of one permutation) and average the same gradients. Evaluation is
    split between the ranks and merged: every item is scored once."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    tests = Path(__file__).parents[1]
    env = dict(os.environ, PYTHONPATH=str(tests.parent))
    script = "tests.helpers.distributed_run"
    # The three runs side by side: most of each is starting up and meeting its peer, not computing.
    runs = [subprocess.Popen([sys.executable, "-m", script, str(world), "single", "4", "1"], env=env)]
    variants = (("29517", "ddp", "2", "1"), ("29518", "ddp-accumulated", "1", "2"))
    for port, out, batch_size, accumulation in variants:
        runs.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                      "--master_port", port, "--module", script, str(world), out, batch_size,
                                      accumulation], env=env))
    try:
        assert [run.wait(timeout=600) for run in runs] == [0, 0, 0]
    finally:
        for run in runs:
            run.kill()

    def stage(out):
        return RunFolder(world / out).stage(0, "vqa")

    single = load_file(stage("single").final / "model.safetensors")
    trained = losses(world / "single")
    assert len(trained) == 3 and trained[-1][2] < trained[0][2]
    scored = json.loads(stage("single").item_scores("val").read_text())["items"]
    for out in ("ddp", "ddp-accumulated"):
        ddp = load_file(stage(out).final / "model.safetensors")
        for name in single:
            assert torch.allclose(single[name], ddp[name], atol=1e-5), (out, name)
        assert json.loads(stage(out).item_scores("val").read_text())["items"].keys() \
            == scored.keys()
        assert stage(out).evaluation()["samples"] == len(scored)


def test_multiple_choice_samples_and_a_stage(parts, world):
    from train.data.annotations import answers_by_type
    from train.tasks.choice import MultipleChoice

    tokenizer, annotations, bank = parts
    dataset = MultipleChoice(annotations, bank, tokenizer, 48, answers_by_type(annotations), num_choices=3)
    candidates, label = dataset.candidates(0)
    assert len(candidates) == 3 and len(set(candidates)) == 3 and candidates[label] == dataset.item(0)[1].answers[0]
    assert dataset.candidates(0) == (candidates, label)  # fixed per item
    batch = collate([dataset[0], dataset[1]], tokenizer.pad_token_id)
    assert batch["input_ids"].shape[:2] == (2, 3) and batch["appearance"].shape[0] == 2
    assert batch["labels"].tolist() == [label, dataset.candidates(1)[1]]
    run = run_config(world, "choice", [StageConfig("choice", "choice", steps=2, batch_size=2, options={"num_choices": 3})])
    result = Trainer(run).fit()[0]
    assert result["metric"] == "choice_accuracy" and 0 <= result["value"] <= 1 and result["chance"] >= 1 / 3


def test_first_stage_starts_from_a_local_bert_checkpoint(world, tmp_path):
    from transformers import BertConfig, BertForPreTraining

    tokenizer = load_tokenizer(world / "vocab")
    bert = BertForPreTraining(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    bert.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    run = run_config(world, "from-bert", [StageConfig("vqa", "vqa", steps=1, batch_size=2)],
                     bert=str(tmp_path / "bert"), vocabulary=str(tmp_path / "bert"), model={"geometry_frequencies": 8})
    trainer = Trainer(run)
    model = stage_model(run, run.stages[0], trainer.data, None)
    expected = bert.bert.encoder.layer[1].attention.self.query.weight
    assert torch.equal(model.vlbert.encoder.bert.layer[1].attention.self.query.weight, expected)
    assert model.config.hidden_size == 32 and model.config.visual_feature_size == trainer.regions.feature_dim
