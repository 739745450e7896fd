"""Image–text retrieval: recall from a score matrix, negative sampling, the Karpathy split reader,
and a retrieval stage on the tiny world."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipelines.runner import load_pipeline
from pipelines.world.tiny import TINY_MODEL
from tests.helpers.worlds import copy_world, run_config
from train.data.annotations import AnnotationFile
from train.data.collate import collate
from train.data.collate import model_inputs
from train.data.files import DataError
from train.data.prepare import prepare_dataset
from train.data.regions import RegionBank
from train.data.sources import SOURCES
from train.engine.config import StageConfig
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from train.evaluation.retrieval import chance_recalls, recall_hits, retrieval_ranks
from train.tasks.retrieval import RetrievalCandidates, RetrievalPairs, RetrievalRecall, caption_similarity
from vlbert import VLBertConfig
from vlbert.losses import group_softmax_loss, hardest_negative_triplet_loss
from vlbert.modeling import VLBertForImageTextMatching
from vlbert.tokenization import load_tokenizer, word_pieces


# ---- recall on a hand-built score matrix ----------------------------------------------------

# 3 images × 5 captions; captions 0, 1 describe image 0, caption 2 image 1, captions 3, 4 image 2.
CAPTION_IMAGE = np.array([0, 0, 1, 2, 2])
SCORES = np.array([
    [0.9, 0.1, 0.5, 0.8, 0.0],   # image 0: caption 0 ranks first
    [0.2, 0.7, 0.3, 0.6, 0.4],   # image 1: caption 2 (0.3) below 0.7, 0.6, 0.4 → rank 3
    [0.1, 0.2, 0.9, 0.5, 0.5],   # image 2: best own 0.5; 0.9 above it → rank 1
])


def test_ranks_and_recalls_of_a_known_score_matrix() -> None:
    ranks = retrieval_ranks(SCORES, CAPTION_IMAGE)
    assert ranks.image_to_text.tolist() == [0, 3, 1]
    # caption 0: image 0 (0.9) first; 1: image 1 (0.7) above image 0 (0.1) → 2; 2: images 2 (0.9), 0 (0.5)
    # above image 1 → 2; 3: image 0 (0.8) and 1 (0.6) above 0.5 → 2; 4: 0.5 first.
    assert ranks.text_to_image.tolist() == [0, 2, 2, 2, 0]
    recalls = {name: round(float(hits.mean()), 4) for name, hits in recall_hits(ranks).items()}
    assert recalls == {"i2t_r1": round(1 / 3, 4), "i2t_r5": 1.0, "i2t_r10": 1.0,
                       "t2i_r1": 0.4, "t2i_r5": 1.0, "t2i_r10": 1.0}


def test_ties_and_unscored_pairs_count_against_the_right_match() -> None:
    tied = np.zeros((3, 5))
    assert retrieval_ranks(tied, CAPTION_IMAGE).text_to_image.tolist() == [2, 2, 2, 2, 2]
    assert retrieval_ranks(tied, CAPTION_IMAGE).image_to_text.tolist() == [3, 4, 3]
    unscored = SCORES.copy()
    unscored[0, 0] = np.nan
    assert retrieval_ranks(unscored, CAPTION_IMAGE).text_to_image[0] == 2


def test_chance_recall_is_that_of_a_random_ranking() -> None:
    chance = chance_recalls(CAPTION_IMAGE, 3)
    assert chance["t2i_r1"] == round(1 / 3, 4) and chance["t2i_r5"] == 1.0
    # image with 2 of 5 captions: 1 - C(3,1)/C(5,1) = 0.4; with 1: 0.2 → mean (0.4 + 0.2 + 0.4) / 3
    assert chance["i2t_r1"] == round(1 / 3, 4) and chance["i2t_r10"] == 1.0
    rng = np.random.default_rng(0)
    draws = [recall_hits(retrieval_ranks(rng.random((3, 5)), CAPTION_IMAGE))["i2t_r1"].mean() for _ in range(4000)]
    assert abs(np.mean(draws) - 1 / 3) < 0.02


def test_a_ranks_evaluation_state_carries_the_rows_it_scored_not_the_whole_matrix():
    """Ranks score contiguous runs of (image, caption) pairs, image by image: rank 0 receives each
    rank's rows (one row shared at a boundary), and merging them gives the whole matrix."""
    candidates = SimpleNamespace(images=[None] * 3, captions=[None] * 5, caption_image=CAPTION_IMAGE)
    pairs = [(image, caption) for image in range(3) for caption in range(5)]
    shards = []
    for part in (pairs[:7], pairs[7:]):  # image 1's row is split between the two
        evaluator = RetrievalRecall(None, candidates)
        for image, caption in part:
            evaluator.scores[image, caption] = SCORES[image, caption]
        evaluator.pairs = len(part)
        shards.append(evaluator.state())
    assert [(first, rows.shape) for first, rows in (state["rows"] for state in shards)] == [(0, (2, 5)), (1, (2, 5))]
    assert "scores" not in shards[0]
    merged = RetrievalRecall(None, candidates)
    merged.merge(shards)
    assert np.array_equal(merged.scores, SCORES.astype(np.float32)) and merged.pairs == 15


# ---- datasets on the tiny world ------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("retrieval"))


@pytest.fixture(scope="module")
def parts(world):
    bank = RegionBank(str(world / "cache"))
    annotations = AnnotationFile(world / "world" / "train.jsonl", keep=bank.__contains__)
    return load_tokenizer(world / "vocab"), annotations, bank


def test_negatives_are_deterministic_and_never_the_positive(parts) -> None:
    tokenizer, annotations, bank = parts
    dataset = RetrievalPairs(annotations, bank, tokenizer, 48, negatives=3, hard_negatives=1, seed=5)
    assert len(dataset) == len(annotations.items("captions")) and dataset.group_size == 7
    for index in range(10):
        group = dataset[index].samples
        image, caption = dataset.item(index)
        assert [sample.item_id for sample in group] == [(index, slot) for slot in range(7)]
        for slot, sample in enumerate(group):
            text = caption_ids(tokenizer, sample)
            own_image = np.array_equal(sample.regions.appearance, bank[image.image_id].truncated(
                len(sample.regions)).appearance)
            if slot == 0:
                assert sample.targets["labels"] == 1 and own_image
            elif slot <= 3:  # another image's caption with this image
                assert sample.targets["labels"] == 0 and own_image
                assert text not in [word_pieces(tokenizer, c).ids for c in image.captions]
            else:  # this caption with another image
                assert sample.targets["labels"] == 0 and not own_image and text == word_pieces(tokenizer, caption).ids
        again = dataset[index].samples
        assert [s.sequence.input_ids for s in again] == [s.sequence.input_ids for s in group]
        assert all(np.array_equal(a.regions.appearance, b.regions.appearance) for a, b in zip(again, group))
    dataset.set_epoch(1)
    fresh = RetrievalPairs(annotations, bank, tokenizer, 48, seed=5)
    changed = [dataset[i].samples[2].sequence.input_ids != fresh[i].samples[2].sequence.input_ids for i in range(10)]
    assert any(changed)  # negatives are drawn afresh each epoch


def test_groups_collate_to_pairs_with_grouped_labels(parts) -> None:
    tokenizer, annotations, bank = parts
    dataset = RetrievalPairs(annotations, bank, tokenizer, 48, negatives=2)
    batch = collate([dataset[0], dataset[1], dataset[2]], tokenizer.pad_token_id)
    assert batch["labels"].tolist() == [[1, 0, 0, 0, 0]] * 3
    assert batch["input_ids"].shape[0] == batch["appearance"].shape[0] == len(batch["image_files"]) == 15
    assert batch["image_files"][:5] == [s.image_file for s in dataset[0].samples]


def test_the_triplet_loss_takes_each_direction_s_hardest_negative(parts) -> None:
    # Groups (positive, 2 negative captions, 2 negative images); margin 0.2.
    scores = torch.tensor([[1.0, 0.5, 0.9, 0.0, 1.5],   # caption side: 0.2 − 1 + 0.9; image side: 0.2 − 1 + 1.5
                           [2.0, 0.0, 0.1, 0.3, 0.2]])  # both margins met: 0
    expected = ((0.2 - 1 + 0.9) + (0.2 - 1 + 1.5) + 0.0) / 2
    labels = torch.tensor([[1, 0, 0, 0, 0]] * 2)
    assert hardest_negative_triplet_loss(scores, labels, 0.2).item() == pytest.approx(expected)
    # The softmax: the positive against all of its group at once.
    assert group_softmax_loss(scores, labels, 0.2).item() == pytest.approx(
        -torch.log_softmax(scores, dim=1)[:, 0].mean().item())
    # The matching head applies the config's loss to grouped labels, its scores in group order.
    tokenizer, annotations, bank = parts
    dataset = RetrievalPairs(annotations, bank, tokenizer, 48, negatives=1)
    config = VLBertConfig(**TINY_MODEL, vocab_size=len(tokenizer), visual_feature_size=bank.feature_dim)
    model = VLBertForImageTextMatching(config).eval()
    batch = collate([dataset[0], dataset[1]], tokenizer.pad_token_id)
    inputs = model_inputs(model, {k: v for k, v in batch.items() if torch.is_tensor(v)})
    output = model(**inputs)
    assert inputs["labels"].shape == (2, 3) and output.logits.shape == (6,)
    assert output.loss.item() == pytest.approx(
        hardest_negative_triplet_loss(output.logits.view(2, 3), inputs["labels"], config.matching_margin).item())
    model.config.matching_loss = "binary"
    assert model(**inputs).loss.item() == pytest.approx(
        F.binary_cross_entropy_with_logits(output.logits, inputs["labels"].flatten().float()).item())
    with pytest.raises(ValueError, match="matching_loss must be one of"):
        VLBertConfig(**TINY_MODEL, matching_loss="hinge")
    with pytest.raises(ValueError, match="positive then an even number"):
        model(**{**inputs, "labels": inputs["labels"].flip(1)})


def test_hard_negatives_are_the_most_similar_of_their_pool(parts) -> None:
    tokenizer, annotations, bank = parts
    hard = RetrievalPairs(annotations, bank, tokenizer, 48, negatives=1, hard_negatives=1, hard_pool=12)
    uniform = RetrievalPairs(annotations, bank, tokenizer, 48, negatives=1, hard_negatives=0)

    def similarity(dataset: RetrievalPairs, index: int) -> float:
        image, _ = dataset.item(index)
        negative_caption = dataset[index].samples[1]
        return caption_similarity(tokenizer.decode(caption_ids(tokenizer, negative_caption)), image)

    indices = range(len(hard))
    assert np.mean([similarity(hard, i) for i in indices]) > np.mean([similarity(uniform, i) for i in indices])
    assert caption_similarity("a red circle.", _image(["A red circle", "two shapes"])) == 1.0
    assert caption_similarity("a red square", _image(["a red circle"])) == 0.5


def caption_ids(tokenizer, sample) -> list[int]:
    """The caption's word pieces in `[CLS] caption [SEP] …`."""
    ids = sample.sequence.input_ids
    return ids[1:ids.index(tokenizer.sep_token_id)]


def _image(captions: list[str]):
    from train.data.annotations import ImageAnnotation

    return ImageAnnotation("x", "x.png", {"captions": captions})


def test_candidates_pair_every_image_with_every_caption_reading_each_image_once(parts, monkeypatch) -> None:
    tokenizer, annotations, bank = parts
    dataset = RetrievalCandidates(annotations, bank, tokenizer, 48)
    images, captions = len(dataset.images), len(dataset.captions)
    assert len(dataset) == images * captions and dataset.caption_image.tolist() == sorted(dataset.caption_image)
    reads = []
    original = RegionBank.__getitem__
    monkeypatch.setattr(RegionBank, "__getitem__", lambda self, key: reads.append(key) or original(self, key))
    samples = [dataset[i] for i in range(2 * captions)]
    assert reads == [dataset.images[0].image_id, dataset.images[1].image_id]
    assert [s.targets["labels"] for s in samples[:captions]] == (dataset.caption_image == 0).astype(int).tolist()
    assert dataset.caption_id(int(np.argmax(dataset.caption_image == 1)) + 1) == f"{dataset.images[1].image_id}#1"
    batch = collate(samples[:4], tokenizer.pad_token_id)
    assert batch["labels"].shape == (4,) and batch["appearance"].shape[0] == 4


def test_too_few_images_for_negatives(tmp_path: Path, parts) -> None:
    tokenizer, _, bank = parts
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"file": "a.png", "captions": ["a", "b"]}) + "\n")
    with pytest.raises(DataError, match="one.jsonl: retrieval needs captions of at least two images, found 1"):
        RetrievalPairs(AnnotationFile(path), bank, tokenizer, 48)


# ---- a retrieval stage end to end --------------------------------------------------------------


def test_retrieval_stage_end_to_end(world) -> None:
    run = run_config(world, "retrieval", [StageConfig("retrieval", "retrieval", steps=3, batch_size=8)],
                     eval_batch_size=32)
    result = Trainer(run).fit()[0]
    stage = RunFolder(world / "retrieval").stage(0, "retrieval")
    assert result["metric"] == "t2i_recall@1" and set(result["recalls"]) == {
        f"{d}_r{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)}
    assert result["pairs"] == result["images"] * result["samples"] and result["pairs_per_s"] > 0
    assert result["chance"] == round(1 / result["images"], 4)
    items = json.loads(stage.item_scores("val").read_text())["items"]
    assert len(items) == result["samples"] and round(np.mean(list(items.values())), 4) == result["value"]
    predictions = json.loads(stage.predictions("val", ".json").read_text())
    assert len(predictions["text_to_image"]) == result["samples"]
    assert len(predictions["image_to_text"]) == result["images"]
    first = predictions["text_to_image"][0]
    assert len(first["top10"]) == min(10, result["images"])
    assert (first["rank"] == 0) == (first["top10"][0] == first["image"])


def test_the_shipped_retrieval_pipeline_is_well_formed() -> None:
    pipeline = load_pipeline(Path(__file__).parents[2] / "pipelines" / "configs" / "retrieval.yaml")
    (train,) = [step for step in pipeline.steps if step.kind == "train"]
    assert [stage["task"] for stage in train.params["stages"]] == ["retrieval"]


# ---- the Karpathy split files ---------------------------------------------------------------


def karpathy_entry(imgid: int, filename: str, split: str, sentences: list[str], **extra) -> dict:
    return {"filename": filename, "imgid": imgid, "split": split, "sentids": list(range(len(sentences))),
            "sentences": [{"raw": s, "tokens": s.lower().split(), "imgid": imgid, "sentid": n}
                          for n, s in enumerate(sentences)], **extra}


def touch(root: Path, *files: str) -> None:
    for file in files:
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_bytes(b"not decoded")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_flickr30k_karpathy_reader(tmp_path: Path) -> None:
    root, images, out = tmp_path / "root", tmp_path / "images", tmp_path / "out"
    root.mkdir()
    (root / "dataset_flickr30k.json").write_text(json.dumps({"dataset": "flickr30k", "images": [
        karpathy_entry(0, "1000092795.jpg", "train", ["Two young guys. ", "Men outside."]),
        karpathy_entry(1, "10002456.jpg", "test", ["Workers on a building."]),
        karpathy_entry(2, "1000268201.jpg", "test", ["A child in pink."]),  # image missing
        karpathy_entry(3, "1000344755.jpg", "val", []),
    ]}))
    touch(images, "flickr30k-images/1000092795.jpg", "flickr30k-images/10002456.jpg", "flickr30k-images/1000344755.jpg")

    summary = prepare_dataset(SOURCES["flickr30k-karpathy"], root, out, images, log=lambda _: None)

    assert summary["splits"] == {"train": {"items": 2, "skipped": 0, "missing_images": 0, "images": 1},
                                 "val": {"items": 0, "skipped": 0, "missing_images": 0, "images": 0},
                                 "test": {"items": 1, "skipped": 1, "missing_images": 1, "images": 1}}
    assert read_jsonl(out / "train.jsonl") == [{"file": "flickr30k-images/1000092795.jpg", "image_id": 0,
                                                "captions": ["Two young guys.", "Men outside."]}]
    assert read_jsonl(out / "test.jsonl")[0]["file"] == "flickr30k-images/10002456.jpg"
    assert read_jsonl(out / "skipped.jsonl")[0]["id"] == 2


def test_coco_karpathy_reader_with_restval(tmp_path: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "out"
    root.mkdir()
    (root / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": [
        karpathy_entry(0, "COCO_val2014_000000391895.jpg", "test", ["A man on a moped."], filepath="val2014",
                       cocoid=391895),
        karpathy_entry(1, "COCO_val2014_000000522418.jpg", "restval", ["A woman cutting a cake."],
                       filepath="val2014", cocoid=522418),
        karpathy_entry(2, "COCO_train2014_000000000009.jpg", "train", ["Food."], filepath="train2014", cocoid=9),
    ]}))
    touch(root, "val2014/COCO_val2014_000000391895.jpg", "val2014/COCO_val2014_000000522418.jpg",
          "train2014/COCO_train2014_000000000009.jpg")

    summary = prepare_dataset(SOURCES["coco-karpathy"], root, out, log=lambda _: None)

    assert {split: counts["items"] for split, counts in summary["splits"].items()} == {
        "train": 1, "val": 0, "test": 1, "restval": 1}
    assert read_jsonl(out / "restval.jsonl") == [{"file": "val2014/COCO_val2014_000000522418.jpg",
                                                  "image_id": 522418, "captions": ["A woman cutting a cake."]}]


def test_karpathy_reader_names_a_malformed_entry(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "dataset_coco.json").write_text(json.dumps({"images": [
        karpathy_entry(0, "a.jpg", "test", ["x"], filepath="val2014", cocoid=1),
        karpathy_entry(1, "b.jpg", "minival", ["y"], filepath="val2014", cocoid=2)]}))
    with pytest.raises(DataError, match=r"dataset_coco.json: images\[1\]: split 'minival' is not one of "
                                        r"train, val, test, restval"):
        prepare_dataset(SOURCES["coco-karpathy"], root, tmp_path / "out", log=lambda _: None)
    (root / "dataset_coco.json").write_text(json.dumps({"images": [{"filename": "a.jpg", "split": "test"}]}))
    with pytest.raises(DataError, match=r"images\[0\]: missing key 'cocoid'"):
        prepare_dataset(SOURCES["coco-karpathy"], root, tmp_path / "out", log=lambda _: None)
