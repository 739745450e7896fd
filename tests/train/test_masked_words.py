"""`vlbert analyze words`: each caption word masked alone, predicted with its own image and with another."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.world.tiny import TINY_MODEL
from train.analysis.masked_words import WordTally, caption_words, masked_words, next_images, predict_words
from train.data.annotations import read_annotations
from train.data.regions import RegionBank
from vlbert.config import VLBertConfig
from vlbert.losses import IGNORE_INDEX
from vlbert.modeling import VLBertForPreTraining, VLBertForReferringExpressions
from vlbert.tokenization import load_tokenizer


def _config(world) -> VLBertConfig:
    return VLBertConfig(**TINY_MODEL, vocab_size=len(load_tokenizer(world / "vocab")),
                        visual_feature_size=RegionBank(world / "cache").feature_dim)


@pytest.fixture(scope="module")
def model(tiny_world, tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("masked-words") / "model"
    VLBertForPreTraining(_config(tiny_world)).save_pretrained(path)
    return path


def arguments(world, model, out, *extra):
    return ["analyze", "words", "--model", str(model), "--store", str(world / "cache"), "--annotations",
            str(world / "world" / "val.jsonl"), "--vocabulary", str(world / "vocab"), "--out", str(out), *extra]


def test_each_word_is_masked_alone_with_the_same_text_beside_each_image(tiny_world):
    tokenizer, regions = load_tokenizer(tiny_world / "vocab"), RegionBank(str(tiny_world / "cache"))
    first, second = read_annotations(tiny_world / "world" / "val.jsonl")[:2]
    caption = first.captions[0]
    ids = tokenizer(caption, add_special_tokens=False)["input_ids"]
    words = masked_words(caption, "7", regions[first.image_id], regions[second.image_id], tokenizer, 128)
    assert [word.word for word in words] == caption.replace(",", " ,").replace(".", " .").split()
    assert [word.item_id for word in words] == [f"7/{k}" for k in range(len(words))]
    for word in words:
        own, other = word.samples
        assert own.sequence.input_ids == other.sequence.input_ids
        assert own.sequence.labels == other.sequence.labels
        masked = [k - 1 for k, label in enumerate(own.sequence.labels) if label != IGNORE_INDEX]
        assert masked and tokenizer.decode([ids[k] for k in masked]).replace(" ", "") == word.word.replace(" ", "")
        text = own.sequence.input_ids[1:-1]
        kept = [k for k in range(len(ids)) if k not in masked]
        assert [text[k] for k in kept] == [ids[k] for k in kept]
        assert all(text[k] == tokenizer.mask_token_id for k in masked)
        np.testing.assert_array_equal(own.regions.appearance, regions[first.image_id].appearance)
        np.testing.assert_array_equal(other.regions.appearance, regions[second.image_id].appearance)


def test_under_a_tight_cap_both_images_keep_the_same_pieces_and_cut_words_are_not_masked(tiny_world):
    tokenizer, regions = load_tokenizer(tiny_world / "vocab"), RegionBank(str(tiny_world / "cache"))
    first, second = read_annotations(tiny_world / "world" / "val.jsonl")[:2]
    caption = max(first.captions, key=len)
    few, many = regions[first.image_id].truncated(3), regions[second.image_id]
    pieces = len(tokenizer(caption, add_special_tokens=False)["input_ids"])
    assert len(many) > 3
    # Every piece kept; then 5 cut (the text is the longer side).
    for cap, kept in ((pieces + 3 + 3, pieces), (pieces + 3 + 3 - 5, pieces - 5)):
        words = masked_words(caption, "0", few, many, tokenizer, cap)
        for word in words:
            own, other = word.samples
            assert own.sequence.input_ids == other.sequence.input_ids and len(own.sequence.input_ids) == kept + 2
            assert len(own.sequence.input_ids) + len(other.regions) + 1 <= cap
        encoding = tokenizer(caption, add_special_tokens=False, return_offsets_mapping=True)
        assert len(words) == len(caption_words(encoding, caption, kept))
    assert len(masked_words(caption, "0", few, many, tokenizer, pieces + 3 + 3)[0].samples[1].regions) == 3


def test_another_image_is_the_next_different_one_and_the_last_wraps():
    assert next_images(["a", "a", "b", "c", "c", "a"]) == {"a": "b", "b": "c", "c": "a"}


class Predicts:
    """A stand-in model that, at every [MASK], predicts `token` (elsewhere the input)."""

    def __init__(self, token: int, mask: int, vocab_size: int) -> None:
        self.token, self.mask, self.vocab_size = token, mask, vocab_size

    def forward(self, *, input_ids, **inputs):
        predicted = torch.where(input_ids == self.mask, self.token, input_ids)
        return SimpleNamespace(mlm_logits=torch.nn.functional.one_hot(predicted, self.vocab_size).float())

    __call__ = forward


def test_a_word_is_right_when_each_of_its_pieces_is(tiny_world):
    tokenizer, regions = load_tokenizer(tiny_world / "vocab"), RegionBank(str(tiny_world / "cache"))
    first, second = read_annotations(tiny_world / "world" / "val.jsonl")[:2]
    caption = "a red circle."
    words = masked_words(caption, "0", regions[first.image_id], regions[second.image_id], tokenizer, 128)
    token = tokenizer.convert_tokens_to_ids("red")
    stub = Predicts(token, tokenizer.mask_token_id, len(tokenizer))
    right = predict_words(stub, words, 2, tokenizer.pad_token_id, torch.device("cpu"))
    assert right == {"own image": [0.0, 1.0, 0.0, 0.0], "another image": [0.0, 1.0, 0.0, 0.0]}
    # "red" as if it were two pieces, "red" and another: right only where the model predicts both.
    for second_label, expected in ((tokenizer.convert_tokens_to_ids("circle"), 0.0), (token, 1.0)):
        for sample in words[1].samples:
            sample.sequence.input_ids[3], sample.sequence.labels[3] = tokenizer.mask_token_id, second_label
        right = predict_words(stub, words[1:2], 2, tokenizer.pad_token_id, torch.device("cpu"))
        assert right == {"own image": [expected], "another image": [expected]}


def test_the_tally_pairs_each_masked_word_across_the_two_images():
    tally = WordTally(["red", "a", "red", "red"], {"own image": [1.0, 1.0, 1.0, 0.0],
                                                    "another image": [0.0, 1.0, 0.0, 0.0]}, ["0", "1", "2", "3"])
    everything = tally.summary()
    assert everything.masked_words == 4 and everything.own_image == 0.75 and everything.another_image == 0.25
    assert everything.difference == 0.5 and everything.interval[0] <= 0.5 <= everything.interval[1]
    red = tally.summary(np.array(["red", "a", "red", "red"]) == "red")
    assert (red.masked_words, red.own_image, red.another_image) == (3, round(2 / 3, 4), 0.0)
    assert tally.summary(np.zeros(4, bool)).to_json() == {"masked_words": 0}


def test_the_command_reports_all_groups_and_words(tiny_world, model, tmp_path):
    result = CliRunner().invoke(main, arguments(tiny_world, model, tmp_path / "out", "--group", "colour=Red,blue",
                                                "--group", "none=zebra", "--max-items", "5"))
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "out" / "words.json").read_text())
    annotations = read_annotations(tiny_world / "world" / "val.jsonl")
    captions = [caption for annotation in annotations for caption in annotation.captions][:5]
    words = [word for caption in captions for word in caption.replace(",", " ,").replace(".", " .").split()]
    assert written["captions"] == 5 and written["masked_words"] == len(words)
    assert {row["word"]: row["masked_words"] for row in written["by_word"]} == {w: words.count(w) for w in set(words)}
    colour = written["groups"]["colour"]
    assert colour["words"] == ["red", "blue"] and colour["masked_words"] == words.count("red") + words.count("blue")
    assert written["groups"]["none"] == {"words": ["zebra"], "masked_words": 0}
    assert result.output.splitlines()[0] == f"{len(words)} masked words in 5 captions; {tmp_path / 'out' / 'words.md'}"
    assert "  none: no masked word" in result.output
    table = (tmp_path / "out" / "words.md").read_text()
    assert "| colour |" in table and "| none | 0 | | | |" in table


@pytest.mark.parametrize("extra, message", [
    (["--group", "colour"], "Invalid value for '--group': 'colour': expected NAME=word,word,... with a NAME not "
                            "given before"),
    (["--group", "colour=light blue"], "group 'colour': 'light blue' is not one word"),
    (["--group", "colour="], "group 'colour': names no words"),
    (["--max-items", "1"], "{annotations}: 1 captions on images of the store {store}, from 1 image(s): the analysis "
                           "needs captions of at least two stored images (each word is also predicted with another "
                           "image)"),
])
def test_bad_inputs_stop_in_one_line_before_the_model_runs(tiny_world, model, tmp_path, extra, message):
    result = CliRunner().invoke(main, arguments(tiny_world, model, tmp_path / "out", *extra))
    assert result.exit_code == 2
    expected = message.format(annotations=tiny_world / "world" / "val.jsonl", store=tiny_world / "cache")
    assert result.output.splitlines()[-1] == "Error: " + expected
    assert not (tmp_path / "out").exists()


def test_a_fine_tuned_model_without_the_masked_word_head_is_refused(tiny_world, tmp_path):
    torch.manual_seed(0)
    VLBertForReferringExpressions(_config(tiny_world)).save_pretrained(tmp_path / "refexp")
    result = CliRunner().invoke(main, arguments(tiny_world, tmp_path / "refexp", tmp_path / "out"))
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {tmp_path / 'refexp'}: the saved model has no masked-word head (mlm_head.")
    assert result.output.endswith("is not in it): analyse a pre-training stage's model\n")
    assert not (tmp_path / "out").exists()
