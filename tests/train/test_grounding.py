"""Attention-grounding analysis: the metric on a hand-built attention tensor, and `vlbert analyze
grounding` end to end on the tiny world with a randomly initialised model."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from pipelines.cli import main
from pipelines.steps.analyze import analysis_verdicts
from pipelines.world.tiny import TINY_MODEL
from tests.helpers.worlds import copy_world
from train.analysis.common import pieces_mean, text_region_attention
from train.analysis.grounding import GroundingTally, analyze_grounding, held_out_best, phrase_sample
from train.analysis.grounding_results import Best, held_out_of
from train.analysis.phrases import MIN_LENGTH, PHRASE_READERS, Phrase
from train.analysis.verdicts import grounding_verdicts
from train.data.annotations import read_annotations
from train.data.files import DataError, shown
from train.data.regions import RegionBank
from vlbert.config import VLBertConfig
from vlbert.model_folder import read_config
from vlbert.modeling import VLBertForPreTraining
from vlbert.tokenization import load_tokenizer

TEXT, REGIONS = 4, 4  # [CLS] w w [SEP] | whole image, RoI 1, RoI 2, RoI 3 | [END]


def _hand_built() -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two phrases, 2 layers × 2 heads. Phrase 0: pieces 1 and 2, RoIs 1 and 3 match its box (IoU
    0.8, 0.6), RoI 2 does not (0.3). Phrase 1: piece 1 only, RoI 2 matches (0.9), RoI 3 is padding."""
    attention = torch.zeros(2, 2, 2, TEXT + REGIONS + 1, TEXT + REGIONS + 1)  # layer, phrase, head, from, to

    def give(layer: int, phrase: int, head: int, piece: int, **to_region: float) -> None:
        for region, weight in to_region.items():
            attention[layer, phrase, head, piece, TEXT + int(region[1:])] = weight

    give(0, 0, 0, 1, r1=0.6)
    give(0, 0, 0, 2, r1=0.4, r3=0.2)  # → RoI 1: grounded
    give(0, 0, 1, 1, r2=0.5)
    give(0, 0, 1, 2, r2=0.5)  # → RoI 2: not grounded
    give(1, 0, 0, 1, r0=0.9, r3=0.1)
    give(1, 0, 0, 2, r0=0.9, r3=0.1)  # the whole image is no candidate → RoI 3: grounded
    give(1, 0, 1, 1, r1=0.5, r2=0.3)
    give(1, 0, 1, 2, r1=0.1, r2=0.5)  # piece 1 alone would pick RoI 1; the mean picks RoI 2: not grounded
    for layer in range(2):
        for head in range(2):
            give(layer, 1, head, 1, r2=0.1, r3=0.9)  # RoI 3 is padding → RoI 2: grounded
            give(layer, 1, head, 2, r1=1.0)  # [SEP]: not part of the phrase
    give(1, 1, 1, 1, r1=0.5, r2=0.5, r3=0.0)  # a tie between RoI 1 (no match) and RoI 2: half a hit
    phrase = torch.tensor([[False, True, True, False], [False, True, False, False]])
    candidates = torch.tensor([[False, True, True, True], [False, True, True, False]])
    iou = torch.tensor([[0.0, 0.8, 0.3, 0.6], [0.0, 0.2, 0.9, 0.0]])
    return tuple(attention), phrase, candidates, iou


HELD_OUT_KEYS = {"layer", "head", "phrases", "accuracy", "interval", "random_baseline", "difference",
                 "difference_interval", "p_value", "verdict", "confidence_baseline", "against_confidence"}


def test_the_held_out_best_head_is_chosen_on_other_phrases_than_it_is_scored_on():
    rng = np.random.default_rng(0)
    phrases, random_share = 400, np.full(400, 0.25)
    confident = (rng.random(phrases) < 0.3).astype(float)
    # Sixteen heads that hit at the random rate: the best of them looks grounded on all phrases, the
    # held-out choice does not.
    chance = (rng.random((phrases, 4, 4)) < 0.25).astype(float)
    in_sample = chance.mean(0).max()
    result = held_out_best(chance, random_share, confident)
    assert set(result.to_json()) == HELD_OUT_KEYS
    assert in_sample > 0.28 and result.count == phrases // 2
    assert result.difference_interval[0] <= 0 <= result.difference_interval[1]
    assert result.verdict.startswith("not distinguishable")
    # One head (layer 2, head 3) that grounds 60% of phrases stands out on the held-out half.
    grounded = chance.copy()
    grounded[:, 1, 2] = rng.random(phrases) < 0.6
    result = held_out_best(grounded, random_share, confident)
    assert (result.layer, result.head) == (2, 3)
    assert result.accuracy == round(grounded[1::2, 1, 2].mean(), 4)
    assert result.interval[0] < result.accuracy < result.interval[1]
    assert result.difference_interval[0] > 0
    assert result.verdict == "head scores above random RoI at 95%: the interval lies above 0"
    # The random RoI's comparison is the paired one over the held-out phrases, whatever the other baseline.
    assert result.difference == round(float(np.mean(grounded[1::2, 1, 2] - 0.25)), 4)
    assert held_out_best(grounded, random_share, 1 - confident).difference_interval == result.difference_interval


def _held_out(targets: np.ndarray, matching: np.ndarray) -> dict:
    """The held-out best head of a tally where head (layer, head) of phrase p attends to RoI
    targets[p, layer, head] (1 to 4, after the whole image at 0), and RoI matching[p] alone fits the
    phrase's box; the most confident RoI is RoI 1."""
    phrases, layers, heads = targets.shape
    attention = torch.full((phrases, layers, heads, 5), 0.01)
    attention.scatter_(-1, torch.from_numpy(targets)[..., None], 0.9)
    candidates = torch.ones(phrases, 5, dtype=torch.bool)
    candidates[:, 0] = False
    iou = torch.full((phrases, 5), 0.1)
    iou[torch.arange(phrases), torch.from_numpy(matching)] = 0.9
    tally = GroundingTally(layers, heads)
    tally.add(attention, candidates, iou)
    return tally.result().figures.held_out_best


# Half the phrases fit the most confident RoI (RoI 1), 30% RoI 2, 15% RoI 3, 5% RoI 4.
MATCHING = np.random.default_rng(0).choice([1, 2, 3, 4], size=400, p=[0.5, 0.3, 0.15, 0.05])


@pytest.mark.parametrize("planted, outcome, said", [
    ("right RoI", "beats", "beats the most confident RoI on the other half: +"),
    ("confident RoI", "not distinguishable",
     "does not beat the most confident RoI on the other half (no difference distinguishable from zero): +0.000 "
     "[+0.000, +0.000]"),
    ("RoI 2", "worse", "does not beat the most confident RoI on the other half; it is worse: −"),
])
def test_the_held_out_best_head_is_compared_with_the_most_confident_roi_and_the_verdict_names_the_outcome(
        planted, outcome, said):
    targets = np.tile(np.array([[3, 4], [3, 4]]), (len(MATCHING), 1, 1))  # fit fewer phrases than RoI 2
    targets[:, 1, 0] = {"right RoI": MATCHING, "confident RoI": 1, "RoI 2": 2}[planted]  # layer 2, head 1
    result = _held_out(targets, MATCHING)
    assert set(result.to_json()) == HELD_OUT_KEYS and (result.layer, result.head) == (2, 1)
    held_out = MATCHING[1::2]
    hits = held_out == targets[1::2, 1, 0]
    assert result.accuracy == round(hits.mean(), 4)
    assert result.confidence_baseline == round(float(np.mean(held_out == 1)), 4)
    side = result.against_confidence
    assert set(side.to_json()) == {"difference", "difference_interval", "p_value", "outcome", "verdict"}
    assert side.difference == round(float(np.mean(hits.astype(float) - (held_out == 1))), 4)
    assert side.outcome == outcome
    low, high = side.difference_interval
    assert {"beats": 0 < low, "not distinguishable": low <= 0 <= high, "worse": high < 0}[outcome]
    assert side.verdict.startswith(f"the best head (layer 2, head 1, chosen on half the phrases) {said}")
    # The random RoI's comparison beside it: a uniformly drawn RoI of the four fits a quarter of the phrases.
    assert result.random_baseline == 0.25
    assert result.difference == round(hits.mean() - 0.25, 4)


def test_the_report_reads_an_analysis_folder_s_verdicts_and_names_a_result_that_is_no_object(tmp_path):
    held_out = _held_out(np.ones((6, 1, 1), dtype=np.int64), np.array([1, 2, 1, 2, 1, 2])).to_json()
    (tmp_path / "grounding.json").write_text(json.dumps({"held_out_best": held_out}))
    assert analysis_verdicts(tmp_path) == [held_out["against_confidence"]["verdict"]]
    del held_out["against_confidence"]  # written before the comparison: nothing to say
    (tmp_path / "grounding.json").write_text(json.dumps({"held_out_best": held_out}))
    assert analysis_verdicts(tmp_path) == [] and analysis_verdicts(tmp_path / "none") == []
    (tmp_path / "syntax.json").write_text("[]")
    problem = f"{tmp_path / 'syntax.json'}: expected the analysis's JSON object, found list"
    with pytest.raises(DataError, match=f"^{re.escape(problem)}$"):
        analysis_verdicts(tmp_path)
    (tmp_path / "syntax.json").unlink()
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text(json.dumps({"held_out_best": held_out}))
    (tmp_path / "syntax.json").symlink_to(outside)  # a result linked out of the step's folder is never read
    problem = f"{tmp_path / 'syntax.json'}: a symlink to {outside}, outside its step's folder: not read"
    with pytest.raises(DataError, match=f"^{re.escape(problem)}$"):
        analysis_verdicts(tmp_path)


def phrase_region_attention(attentions: tuple[torch.Tensor, ...], phrase: torch.Tensor) -> torch.Tensor:
    """(B, layers, heads, N): what the analysis takes of a phrase, its pieces' attention to the regions."""
    return pieces_mean(text_region_attention(attentions, phrase.shape[1], REGIONS), phrase)


def test_phrase_attention_is_the_mean_over_the_phrase_pieces_of_attention_to_the_regions():
    attentions, phrase, _, _ = _hand_built()
    region_attention = phrase_region_attention(attentions, phrase)
    assert region_attention.shape == (2, 2, 2, REGIONS)  # phrase, layer, head, region
    assert region_attention[0, 1, 1].tolist() == pytest.approx([0.0, 0.3, 0.4, 0.0])
    assert region_attention[1, 0, 0].tolist() == pytest.approx([0.0, 0.0, 0.1, 0.9])


def test_the_accuracy_table_and_baselines_on_a_hand_built_attention_tensor():
    attentions, phrase, candidates, iou = _hand_built()
    tally = GroundingTally(layers=2, heads=2)
    grounded = tally.add(phrase_region_attention(attentions, phrase), candidates, iou)
    assert grounded.tolist() == [[[1, 0], [1, 0]], [[1, 1], [1, 0.5]]]
    result = tally.result()
    assert result.accuracy == [[1.0, 0.5], [1.0, 0.25]]
    assert result.count == 2 and result.figures.mean_accuracy == (1 + 0.5 + 1 + 0.25) / 4
    assert result.figures.best == Best(1, 1, 1.0)
    # A uniformly drawn RoI: 2 of 3 candidates match phrase 0, 1 of 2 phrase 1.
    assert result.figures.random_baseline == round((2 / 3 + 1 / 2) / 2, 4)
    # The most confident RoI is the first candidate, RoI 1: IoU 0.8, then 0.2.
    assert result.figures.confidence_baseline == 0.5
    # Two phrases: intervals resample them; the best head hits both, so its interval is a point.
    assert result.figures.intervals.best == [1.0, 1.0]
    assert result.figures.held_out_best.count == 1
    # Attention mass on the candidates, averaged over the phrases (padding and whole image excluded).
    assert np.allclose(result.region_attention, [[(0.6 + 0.1) / 2, (0.5 + 0.1) / 2],
                                                    [(0.1 + 0.1) / 2, (0.7 + 1.0) / 2]])


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    root = copy_world(tiny_world, tmp_path_factory.mktemp("grounding"))
    tokenizer = load_tokenizer(root / "vocab")
    features = RegionBank(root / "cache").feature_dim
    config = VLBertConfig(**TINY_MODEL, vocab_size=len(tokenizer), visual_feature_size=features)
    torch.manual_seed(0)
    VLBertForPreTraining(config).save_pretrained(root / "model")
    return root


def test_analyze_grounding_writes_the_table_the_heat_map_and_the_examples(world, tmp_path):
    result = analyze_grounding(world / "model", world / "cache", world / "world" / "val.jsonl", world / "vocab",
                               tmp_path, images=world / "world", examples=2, batch_size=4)
    refs = sum(len(annotation.refs) for annotation in read_annotations(world / "world" / "val.jsonl"))
    assert result.scores.count == refs > 0
    scores = result.scores
    assert (scores.layers, scores.heads) == (TINY_MODEL["num_hidden_layers"], TINY_MODEL["num_attention_heads"])
    accuracy = np.asarray(result.scores.accuracy)
    assert accuracy.shape == (2, 4) and ((0 <= accuracy) & (accuracy <= 1)).all()
    best = result.scores.figures.best
    assert best.accuracy == accuracy.max() == accuracy[best.layer - 1, best.head - 1]
    assert 0 < result.scores.figures.random_baseline < 1 and 0 <= result.scores.figures.confidence_baseline <= 1
    assert json.loads((tmp_path / "grounding.json").read_text()) == json.loads(json.dumps(result.to_json()))
    held_out = result.scores.figures.held_out_best
    assert set(held_out.to_json()) == HELD_OUT_KEYS and held_out.against_confidence.outcome in (
        "beats", "not distinguishable", "worse")
    assert held_out.against_confidence.verdict.startswith(
        f"the best head (layer {held_out.layer}, head {held_out.head}, chosen on half the phrases) ")
    pictures = [tmp_path / "grounding.png"] + [tmp_path / "examples" / f"{k:03d}.png" for k in range(2)]
    assert [example["image"] for example in result.examples] == [str(p) for p in pictures[1:]]
    for picture in pictures:
        with Image.open(picture) as image:
            image.load()
            assert image.width > 100 and image.height > 100


def test_the_command_analyses_the_first_items_and_the_baselines_do_not_depend_on_the_model(world, tmp_path):
    args = ["analyze", "grounding", "--model", str(world / "model"), "--store", str(world / "cache"),
            "--annotations", str(world / "world" / "val.jsonl"), "--vocabulary", str(world / "vocab"),
            "--max-items", "5", "--batch-size", "2"]
    first = CliRunner().invoke(main, args + ["--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    assert first.output.startswith("5 phrases: best head layer ")
    torch.manual_seed(1)
    other = VLBertForPreTraining.from_pretrained(world / "model")
    other.init_weights()
    other.save_pretrained(tmp_path / "other")
    args[args.index("--model") + 1] = str(tmp_path / "other")
    second = CliRunner().invoke(main, args + ["--out", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    a, b = (json.loads((tmp_path / name / "grounding.json").read_text()) for name in ("a", "b"))
    assert a["phrases"] == b["phrases"] == 5 and not (tmp_path / "a" / "examples").exists()
    assert (a["random_baseline"], a["confidence_baseline"]) == (b["random_baseline"], b["confidence_baseline"])
    assert first.output.splitlines()[1] == f"Held out: {grounding_verdicts(held_out_of(a))[0]}"


def test_fresh_weights_attend_to_every_roi_alike_so_every_head_scores_the_random_baseline(world, tmp_path):
    """Before training the visual gains are 0, so all RoI embeddings are alike and every head ties."""
    result = CliRunner().invoke(main, ["analyze", "grounding", "--model", str(world / "model"), "--store",
                                       str(world / "cache"), "--annotations", str(world / "world" / "val.jsonl"),
                                       "--vocabulary", str(world / "vocab"), "--max-items", "6", "--fresh-weights",
                                       "--out", str(tmp_path / "fresh")])
    assert result.exit_code == 0, result.output
    table = json.loads((tmp_path / "fresh" / "grounding.json").read_text())
    assert np.allclose(table["accuracy"], table["random_baseline"])


def test_a_folder_without_a_saved_model_or_phrases_off_the_store_are_one_line(world, tmp_path):
    annotations = world / "world" / "val.jsonl"
    args = ["analyze", "grounding", "--store", str(world / "cache"), "--vocabulary", str(world / "vocab"),
            "--out", str(tmp_path / "out"), "--annotations"]
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, args + [str(annotations), "--model", str(tmp_path / "empty")])
    assert result.exit_code == 2 and result.output == f"Error: {tmp_path / 'empty'}: not a saved model (no config.json)\n"
    (tmp_path / "val.txt").write_text("")  # a Flickr30K Entities split: its images are not in this store
    result = CliRunner().invoke(main, args + [str(tmp_path / "val.txt"), "--format", "flickr30k-entities",
                                              "--model", str(world / "model")])
    assert result.exit_code == 2 and result.output == (
        f"Error: {tmp_path / 'val.txt'}: no flickr30k-entities phrases on images of the store {world / 'cache'}\n")


def test_flickr30k_entities_phrases_are_the_boxed_entities_of_each_caption(tmp_path):
    (tmp_path / "Sentences").mkdir()
    (tmp_path / "Annotations").mkdir()
    (tmp_path / "val.txt").write_text("42\n")
    (tmp_path / "Sentences" / "42.txt").write_text(
        "[/EN#1/people A man] holds [/EN#2/other two cups] in [/EN#3/scene a park] .\n"
        "[/EN#0/notvisual Someone] drinks .\n")
    # Entity 2 has two boxes (scored against their union); 3 is a scene, without a box.
    (tmp_path / "Annotations" / "42.xml").write_text(
        "<annotation><size><width>100</width><height>80</height></size>"
        "<object><name>1</name><bndbox><xmin>1</xmin><ymin>2</ymin><xmax>30</xmax><ymax>70</ymax></bndbox></object>"
        "<object><name>2</name><bndbox><xmin>40</xmin><ymin>10</ymin><xmax>50</xmax><ymax>20</ymax></bndbox></object>"
        "<object><name>2</name><bndbox><xmin>60</xmin><ymin>5</ymin><xmax>70</xmax><ymax>15</ymax></bndbox></object>"
        "<object><name>3</name><scene>1</scene></object></annotation>")
    phrases = PHRASE_READERS["flickr30k-entities"](tmp_path / "val.txt")
    assert [(p.item_id, p.phrase, p.box) for p in phrases] == [
        ("42/0/0", "A man", [1.0, 2.0, 30.0, 70.0]), ("42/0/1", "two cups", [40.0, 5.0, 70.0, 20.0])]
    assert phrases[0].text == "A man holds two cups in a park ."
    assert (phrases[1].image_id, phrases[1].file) == ("flickr30k-images/42", "flickr30k-images/42.jpg")


def test_a_phrase_inside_a_caption_attends_from_its_own_pieces_only(world):
    regions = RegionBank(world / "cache")
    annotation = next(a for a in read_annotations(world / "world" / "val.jsonl") if a.refs)
    ref = annotation.refs[0]
    text = f"look at {ref.text} here"
    phrase = Phrase("x", annotation.image_id, annotation.file, text, (8, 8 + len(ref.text)), ref.box)
    tokenizer = load_tokenizer(world / "vocab")
    sample, inside = phrase_sample(phrase, regions, tokenizer, max_length=64)
    pieces = tokenizer(ref.text, add_special_tokens=False)["input_ids"]
    assert [sample.sequence.input_ids[i] for i in np.flatnonzero(inside)] == pieces
    assert np.flatnonzero(inside).tolist() == list(range(3, 3 + len(pieces)))  # after [CLS] look at
    whole = regions[annotation.image_id].truncated(sample.sequence.num_regions).boxes
    best = int(np.argmax(sample.region_targets["iou"][1:])) + 1
    assert sample.region_targets["iou"][best] == pytest.approx(max(
        _iou(box, ref.box) for box in whole[1:]), abs=1e-5)


def _iou(a, b) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _copy_model(world, folder):
    shutil.copytree(world / "model", folder)
    return folder


def _truncated(path, keep: int):
    path.write_bytes(path.read_bytes()[:keep])


def _model_with(folder, world, **changes):
    """The world's model config with `changes`, freshly initialised, saved in `folder`."""
    values = read_config(world / "model").fields
    VLBertForPreTraining(VLBertConfig(**{**values, **changes})).save_pretrained(folder)
    return folder


def _vocabulary(folder, lines):
    folder.mkdir()
    (folder / "vocab.txt").write_text("".join(line + "\n" for line in lines))
    return folder


def _truncated_config(world, tmp_path):
    model = _copy_model(world, tmp_path / "model")
    _truncated(model / "config.json", 50)
    with pytest.raises(json.JSONDecodeError) as cut:  # where the cut falls depends on the config's keys
        json.loads((model / "config.json").read_text())
    where = f"line {cut.value.lineno}, column {cut.value.colno}"
    return {"--model": model}, f"{model / 'config.json'}: invalid JSON at {where}: "


def _truncated_weights(world, tmp_path):
    model = _copy_model(world, tmp_path / "model")
    _truncated(model / "model.safetensors", 1000)
    return {"--model": model}, f"{model / 'model.safetensors'}: not a readable safetensors file ("


def _other_feature_size(world, tmp_path):
    model = _model_with(tmp_path / "model", world, visual_feature_size=128)
    return {"--model": model}, (f"{world / 'cache'}: holds 256-d features, but the model {model} takes "
                                "visual_feature_size 128; analyse it on a store of the detector it was trained with")


def _empty_vocabulary(world, tmp_path):
    vocabulary = _vocabulary(tmp_path / "vocab", [])
    return {"--vocabulary": vocabulary}, (f"{vocabulary / 'vocab.txt'}: 0 word pieces, without [UNK], [SEP], [PAD], "
                                          "[CLS], [MASK]; expected a BERT WordPiece vocabulary, one piece a line, "
                                          "with the special pieces")


def _smaller_vocabulary(world, tmp_path):
    """The model's vocabulary cut short: every id would name another word than the model learnt."""
    vocabulary = _vocabulary(tmp_path / "vocab", (world / "vocab" / "vocab.txt").read_text().splitlines()[:50])
    return {"--vocabulary": vocabulary}, (f"{vocabulary / 'vocab.txt'}: 50 word pieces, but the model's vocab_size is "
                                          f"{len(load_tokenizer(world / 'vocab'))}; use the vocabulary the model was "
                                          "trained with")


def _larger_vocabulary(world, tmp_path):
    model = _model_with(tmp_path / "model", world, vocab_size=60)
    return {"--model": model}, (f"{world / 'vocab' / 'vocab.txt'}: {len(load_tokenizer(world / 'vocab'))} word "
                                "pieces, but the model's vocab_size is 60; use the vocabulary the model was "
                                "trained with")


def _not_a_store(world, tmp_path):
    (tmp_path / "store").mkdir()
    return {"--store": tmp_path / "store"}, f"{tmp_path / 'store'}: not a FeatureStore (no meta.json)"


def _refs_as_a_flickr30k_split(world, tmp_path):
    annotations = world / "world" / "val.jsonl"
    first = annotations.read_text().splitlines()[0]
    return {"--format": "flickr30k-entities"}, (f"{annotations}:1: {shown(first)} is not a Flickr30K image id; the "
                                                "flickr30k-entities format reads a split file (val.txt: one image id "
                                                "a line)\n")


def _flickr30k_box_without_numbers(world, tmp_path):
    for folder in ("Sentences", "Annotations"):
        (tmp_path / folder).mkdir()
    (tmp_path / "val.txt").write_text("42\n")
    (tmp_path / "Sentences" / "42.txt").write_text("[/EN#1/people A man] walks .\n")
    (tmp_path / "Annotations" / "42.xml").write_text(
        "<annotation><object><name>1</name><bndbox><xmin>1</xmin><ymin>two</ymin><xmax>30</xmax></bndbox>"
        "</object></annotation>")
    return {"--annotations": tmp_path / "val.txt", "--format": "flickr30k-entities"}, (
        f"{tmp_path / 'Annotations' / '42.xml'}: a <bndbox> needs the numbers xmin, ymin, xmax, ymax, found "
        "['1', 'two', '30', None]\n")


def _no_box_to_score_against(world, tmp_path):
    records = [{**record, "refs": [{**ref, "box": [5, 5, 1, 9]} for ref in record.get("refs", [])]}
               for record in map(json.loads, (world / "world" / "val.jsonl").read_text().splitlines())]
    annotations = with_records(tmp_path / "val.jsonl", records)
    first = next(record for record in records if record["refs"])
    return {"--annotations": annotations}, (
        f"{annotations}: no phrase has a box to score against (item {Path(first['file']).with_suffix('').as_posix()}"
        "/0: an empty or inverted box (x2 <= x1 or y2 <= y1), [5.0, 5.0, 1.0, 9.0])\n")


def _out_inside_a_file(world, tmp_path):
    (tmp_path / "file").write_text("")
    return {"--out": tmp_path / "file" / "out"}, f"{tmp_path / 'file' / 'out'}: Not a directory\n"


# What a user gives wrong (the options it replaces, made in tmp_path) → the one line it ends with (a
# prefix where the rest is the parser's own words). Each is found before any phrase is analysed.
UNUSABLE_INPUTS = {
    "truncated config.json": _truncated_config,
    "truncated model.safetensors": _truncated_weights,
    "visual feature size unlike the store's": _other_feature_size,
    "empty vocab.txt": _empty_vocabulary,
    "vocabulary smaller than the model's": _smaller_vocabulary,
    "vocabulary larger than the model's": _larger_vocabulary,
    "a folder that is no store": _not_a_store,
    "an annotation file given as a Flickr30K Entities split": _refs_as_a_flickr30k_split,
    "a Flickr30K Entities box without numbers": _flickr30k_box_without_numbers,
    "no phrase with a box to score against": _no_box_to_score_against,
    "an --out that cannot be made": _out_inside_a_file,  # found before the analysis, not after it
}


@pytest.mark.parametrize("case", UNUSABLE_INPUTS)
def test_inputs_that_cannot_be_analysed_are_one_line_and_exit_status_2(world, tmp_path, case):
    changes, line = UNUSABLE_INPUTS[case](world, tmp_path)
    options = {"--model": world / "model", "--store": world / "cache", "--annotations": world / "world" / "val.jsonl",
               "--vocabulary": world / "vocab", "--out": tmp_path / "out", **changes}
    result = CliRunner().invoke(main, ["analyze", "grounding", *(str(v) for kv in options.items() for v in kv)])
    assert result.exit_code == 2 and result.output.startswith(f"Error: {line}")
    assert result.output.count("\n") == 1 and not (tmp_path / "out").exists()


def with_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))  # NaN as JSON's NaN literal
    return path


def test_phrases_whose_box_is_no_box_are_left_out_and_named_not_scored_as_misses(world, tmp_path):
    records = [json.loads(line) for line in (world / "world" / "val.jsonl").read_text().splitlines()]
    with_refs = [record for record in records if record.get("refs")]
    nan_ref, inverted_ref = with_refs[0]["refs"][0], with_refs[1]["refs"][-1]
    nan_ref["box"], inverted_ref["box"] = [float("nan"), 2.0, 9.0, 9.0], [9.0, 2.0, 3.0, 9.0]
    damaged = with_records(tmp_path / "damaged.jsonl", records)
    for record in with_refs[:2]:
        record["refs"] = [ref for ref in record["refs"] if ref not in (nan_ref, inverted_ref)]
    clean = with_records(tmp_path / "clean.jsonl", records)
    ids = [f"{Path(record['file']).with_suffix('').as_posix()}/{position}"
           for record, position in ((with_refs[0], 0), (with_refs[1], len(with_refs[1]["refs"])))]

    result = CliRunner().invoke(main, ["analyze", "grounding", "--model", str(world / "model"), "--store",
                                       str(world / "cache"), "--annotations", str(damaged), "--vocabulary",
                                       str(world / "vocab"), "--out", str(tmp_path / "damaged")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == (f"2 phrases left out, their box no box (NaN, or x2 <= x1 or y2 <= y1): "
                                             f"{ids[0]}, {ids[1]} (all in grounding.json, left_out)")
    left = json.loads((tmp_path / "damaged" / "grounding.json").read_text())
    assert left["left_out"] == [
        {"item_id": ids[0], "phrase": nan_ref["text"], "box": "[nan, 2.0, 9.0, 9.0]",
         "problem": "a coordinate is not a finite number"},
        {"item_id": ids[1], "phrase": inverted_ref["text"], "box": "[9.0, 2.0, 3.0, 9.0]",
         "problem": "an empty or inverted box (x2 <= x1 or y2 <= y1)"}]
    scored = analyze_grounding(world / "model", world / "cache", clean, world / "vocab", tmp_path / "clean").to_json()
    assert scored["left_out"] == [] and left["phrases"] == scored["phrases"]
    for figure in ("accuracy", "random_baseline", "confidence_baseline", "region_attention", "intervals"):
        assert left[figure] == scored[figure]


def test_max_length_at_its_minimum_analyses_and_below_it_is_bad_usage(world, tmp_path):
    args = ["analyze", "grounding", "--model", str(world / "model"), "--store", str(world / "cache"),
            "--annotations", str(world / "world" / "val.jsonl"), "--vocabulary", str(world / "vocab"),
            "--max-items", "3", "--out", str(tmp_path / "out"), "--max-length"]
    result = CliRunner().invoke(main, args + [str(MIN_LENGTH)])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "grounding.json").read_text())["phrases"] == 3
    result = CliRunner().invoke(main, args + [str(MIN_LENGTH - 1)])
    assert result.exit_code == 2 and result.output.endswith(
        f"Error: Invalid value for '--max-length': {MIN_LENGTH - 1} is not in the range x>={MIN_LENGTH}.\n")
