"""`vlbert analyze attention`: one sample's word → region attention, every layer and head, drawn."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from pipelines.cli import main
from tests.helpers.models import saved_world_model
from train.analysis.attention import analyze_attention, word_pieces
from train.analysis.common import caption_sample, text_region_attention
from train.data.annotations import read_annotations
from train.data.collate import collate, model_inputs
from train.data.regions import RegionBank
from vlbert.modeling import VLBertEncoder, VLBertModel
from vlbert.tokenization import load_tokenizer


@pytest.fixture(scope="module")
def model(tiny_world, tmp_path_factory):
    return saved_world_model(tiny_world, tmp_path_factory.mktemp("attention") / "model")


def arguments(world, model, out, *extra):
    return ["analyze", "attention", str(model), str(world / "cache"), "--annotations",
            str(world / "world" / "val.jsonl"), "--vocabulary", str(world / "vocab"), "--out", str(out), *extra]


def test_the_heat_maps_hold_every_layer_and_heads_word_to_region_attention(tiny_world, model, tmp_path):
    """Each word's row is the mean of its pieces' rows of the model's own attention, computed apart."""
    annotations = read_annotations(tiny_world / "world" / "val.jsonl")
    refs = [(annotation, ref) for annotation in annotations for ref in annotation.refs]
    annotation, ref = refs[1]
    noun = ref.text.split()[-1]
    result = analyze_attention(model, tiny_world / "cache", tiny_world / "world" / "val.jsonl", tiny_world / "vocab",
                               tmp_path, item=1, kind="refs", word=noun.upper())
    assert result["text"] == ref.text and result["image_id"] == annotation.image_id
    assert result["words"] == ref.text.split()
    tokenizer, regions = load_tokenizer(tiny_world / "vocab"), RegionBank(str(tiny_world / "cache"))
    sample, offsets = caption_sample(ref.text, annotation.image_id, annotation.file, "x", regions, tokenizer, 128)
    batch = collate([sample], tokenizer.pad_token_id)
    encoder = VLBertModel.from_pretrained(model).eval()
    with torch.no_grad():
        output = encoder(**model_inputs(encoder, batch, training=False), output_attentions=True)
    pieces = text_region_attention(output.attentions, batch["text_mask"].shape[1], output.num_regions)[0]
    _, weights = word_pieces(tokenizer, ref.text, len(offsets))
    expected = np.einsum("wp,lhpn->lhwn", weights, pieces[:, :, 1:1 + len(offsets)].numpy())
    attention = np.asarray(result["attention"])
    assert attention.shape == (2, 4, len(result["words"]), len(sample.regions))
    np.testing.assert_allclose(attention, expected, atol=1e-4)
    assert result["regions"][0]["label"] == "whole image"
    assert result["regions"][0]["box"] == [0.0, 0.0, float(sample.regions.image_size[0]),
                                           float(sample.regions.image_size[1])]
    assert json.loads((tmp_path / "attention.json").read_text())["words"] == result["words"]
    for name in ("attention.png", f"word-{result['words'].index(noun):02d}.png"):
        with Image.open(tmp_path / name) as picture:
            assert picture.format == "PNG" and min(picture.size) > 200


def test_word_pieces_of_one_word_are_averaged():
    class Pieces:
        """"unbelievable cat" as three pieces of one word and one of another."""

        def __call__(self, text, add_special_tokens, return_offsets_mapping):
            encoding = {"offset_mapping": [(0, 2), (2, 8), (8, 12), (13, 16)]}
            return type("Encoding", (dict,), {"word_ids": lambda self: [0, 0, 0, 1]})(encoding)

    words, weights = word_pieces(Pieces(), "unbelievable cat", 4)
    assert words == ["unbelievable", "cat"]
    np.testing.assert_allclose(weights, [[1 / 3, 1 / 3, 1 / 3, 0], [0, 0, 0, 1]])
    words, weights = word_pieces(Pieces(), "unbelievable cat", 2)  # the length cap kept two pieces
    assert words == ["unbeliev"] and weights.tolist() == [[0.5, 0.5]]


@pytest.mark.parametrize("extra, message", [
    (["--item", "999"], "{annotations}: --item 999: the file has {captions} captions (items 0 to {last})"),
    (["--word", "zebra"], "--word 'zebra': not a word of the sample; its words are {words}"),
])
def test_bad_inputs_stop_in_one_line_before_the_model_runs(tiny_world, model, tmp_path, extra, message):
    annotations = tiny_world / "world" / "val.jsonl"
    captions = sum(len(annotation.captions) for annotation in read_annotations(annotations))
    first = read_annotations(annotations)[0].captions[0]
    result = CliRunner().invoke(main, arguments(tiny_world, model, tmp_path / "out", *extra))
    assert result.exit_code == 2
    words = " ".join(first.replace(",", " ,").replace(".", " .").split())
    assert result.output == "Error: " + message.format(annotations=annotations, captions=captions, last=captions - 1,
                                                       words=words) + "\n"
    assert not (tmp_path / "out").exists()


def test_a_model_without_attention_probabilities_is_named_in_one_line(tiny_world, model, tmp_path, monkeypatch):
    original = VLBertEncoder.forward

    def without_attention(self, embeddings, attention_mask, output_attentions=False):
        return original(self, embeddings, attention_mask, False)

    monkeypatch.setattr(VLBertEncoder, "forward", without_attention)
    result = CliRunner().invoke(main, arguments(tiny_world, model, tmp_path / "out"))
    assert result.exit_code == 2
    assert result.output.startswith("Error: ") and result.output.endswith(
        ": the model gives no attention probabilities (its encoder returned none): there is no attention to analyse\n")


def test_a_missing_image_is_said_and_the_regions_drawn_on_grey(tiny_world, model, tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, arguments(tiny_world, model, tmp_path / "out", "--word", "a", "--images",
                                                str(tmp_path / "empty")))
    assert result.exit_code == 0, result.output
    image_id = read_annotations(tiny_world / "world" / "val.jsonl")[0].image_id
    assert f"{image_id}: no image {image_id}.* under {tmp_path / 'empty'}; the regions are drawn on a grey canvas" \
        in result.output
    assert (tmp_path / "out" / "word-00.png").is_file()
