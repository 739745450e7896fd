"""Values that made tracebacks or took gigabytes: a step record's times that are no times, a caption
with no word, a model folder whose config is not its weights', class names of a million characters,
a score of nan, and an image of more pixels than extraction reads. Each is one line, or drawn
within bounds."""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from extract.images import DEFAULT_MAX_PIXELS
from extract.store.labels import NAME_CHARACTERS, Naming
from extract.store.reader import FeatureStore
from pipelines.cli import main
from pipelines.runner import run_pipeline
from tests.helpers.models import saved_world_model
from tests.helpers.pipelines import write_pipeline
from train.data.annotations import read_annotations
from train.data.image_lookup import load_images

LIGHT_STEPS = [{"name": "world", "kind": "world", "images": 3, "seed": 1},
               {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}]


def big_png(path: Path, width: int, height: int) -> Path:
    """A black 1-bit PNG of `width` x `height` pixels, a few hundred KB whatever its size."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = bytes(1 + (width + 7) // 8)
    packer = zlib.compressobj(9)
    pixels = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


# ---- the page of a run whose step record holds times that are no times ----------------------------

@pytest.mark.parametrize("key, value, said", [
    ("seconds", "abc", "step.json: seconds 'abc' is no time it took"),
    ("seconds", -3.0, "step.json: seconds -3.0 is no time it took"),
    ("seconds", float("nan"), "step.json: seconds nan is no time it took"),
    ("seconds", 1e300, "step.json: seconds 1e+300 is no time it took"),
    ("started_at", 1e300, "step.json: started_at 1e+300 is no time"),
    ("started_at", "yesterday", "step.json: started_at 'yesterday' is no time"),
])
def test_a_step_record_time_that_is_no_time_is_named_on_its_row(tmp_path, key, value, said):
    path = write_pipeline(tmp_path, LIGHT_STEPS)
    out = run_pipeline(path, log=lambda _: None)
    record = out / "vocabulary" / "step.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), key: value}))
    result = CliRunner().invoke(main, ["pipeline", "report", str(path)])
    assert (result.exit_code, result.output) == (0, f"report: {out / 'report.html'}\n")
    (row,) = re.findall(r"<tr><td>vocabulary</td>.*?</tr>", html.unescape((out / "report.html").read_text()))
    assert 'class="state-done">done<' in row and f"<td>{said}</td>" in row


# ---- analyze attention -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tiny_world, tmp_path_factory):
    return saved_world_model(tiny_world, tmp_path_factory.mktemp("hostile") / "model")


def attention(world: Path, model: Path, annotations: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, ["analyze", "attention", str(model), str(world / "cache"), "--annotations",
                                     str(annotations), "--vocabulary", str(world / "vocab"), "--out", str(out), *extra])


@pytest.mark.parametrize("caption", ["", "   \t "])
def test_a_caption_with_no_word_is_one_line_before_the_model_runs(tiny_world, model, tmp_path, caption):
    lines = (tiny_world / "world" / "val.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    annotations = tmp_path / "val.jsonl"
    annotations.write_text("\n".join([json.dumps({**first, "captions": [caption]}), *lines[1:]]) + "\n")
    result = attention(tiny_world, model, annotations, tmp_path / "out")
    assert (result.exit_code, result.output) == (2, f"Error: {annotations}: --item 0: its text has no word to analyse "
                                                    "(it is empty, or only spaces and characters the tokenizer "
                                                    "drops)\n")
    assert not (tmp_path / "out").exists()


def test_a_model_whose_config_is_not_its_weights_is_one_line(tiny_world, model, tmp_path):
    edited = shutil.copytree(model, tmp_path / "model")
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "hidden_size": 64, "intermediate_size": 128}))
    result = attention(tiny_world, edited, tiny_world / "world" / "val.jsonl", tmp_path / "out")
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert result.output.startswith(f"Error: {edited}: its config.json does not match its model.safetensors: ")
    assert result.output.endswith(" is (32,) there, (64,) for the config\n")


def test_an_image_of_more_pixels_than_extraction_reads_is_refused_before_decoding(tiny_world, model, tmp_path):
    (annotation,) = read_annotations(tiny_world / "world" / "val.jsonl")[:1]
    big_png(tmp_path / "images" / annotation.file, 6400, 6400)  # 40.96 MP, of 1 bit: 123 MB decoded in RGB
    found = load_images(tmp_path / "images", [annotation.image_id], print)
    reason = found.missing[annotation.image_id]
    assert annotation.image_id not in found.pixels
    assert reason.endswith(f"6400x6400 is 40960000 pixels, more than the limit of {DEFAULT_MAX_PIXELS} (vlbert extract "
                           "--max-pixels); refused before decoding")
    result = attention(tiny_world, model, tiny_world / "world" / "val.jsonl", tmp_path / "out", "--word", "a",
                       "--images", str(tmp_path / "images"))
    assert result.exit_code == 0, result.output
    assert f"{annotation.image_id}: {reason}; the regions are drawn on a grey canvas" in result.output


# ---- cache show, and scores that are no numbers --------------------------------------------------------

def test_class_names_of_a_million_characters_are_drawn_cut(tiny_world, tmp_path):
    store = shutil.copytree(tiny_world / "cache", tmp_path / "cache")
    meta = json.loads((store / "meta.json").read_text())
    classes = meta["class_probs"]["num_classes"]
    meta["vocabulary"]["classes"] = ["q" * 1_000_000] * classes
    (store / "meta.json").write_text(json.dumps(meta))
    image_id = read_annotations(tiny_world / "world" / "train.jsonl")[0].image_id
    result = CliRunner().invoke(main, ["cache", "show", str(store), image_id, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "out" / f"{image_id}.png") as picture:
        assert picture.width < 2000  # the labels are a few dozen characters, and the picture the image's width
    with FeatureStore(store) as reader:
        label = Naming.of(reader.meta).label(reader[image_id], 0)
    assert "q" * (NAME_CHARACTERS - 1) + "…" in label and "q" * NAME_CHARACTERS not in label


@pytest.mark.parametrize("command", [["cache", "show", "STORE", "an-id", "--out", "OUT", "--min-score"],
                                     ["analyze", "syntax", "--min-region-attention"],
                                     ["extract", "--images", "STORE", "--out", "OUT", "--mask-prob"],
                                     ["data", "prepare", "vqa2", "--out", "OUT", "--max-missing"],
                                     ["world", "generate", "--out", "OUT", "--annotated-fraction"]])
@pytest.mark.parametrize("value", ["nan", "-nan", "NaN"])
def test_a_score_that_is_no_number_is_refused(tiny_world, tmp_path, command, value):
    arguments = [str(tiny_world / "cache") if part == "STORE" else str(tmp_path / "out") if part == "OUT" else part
                 for part in command]
    result = CliRunner().invoke(main, [*arguments, value])
    assert result.exit_code == 2
    assert f"Error: Invalid value for '{command[-1]}': '{value}' is not a finite number." in result.output
    assert not (tmp_path / "out").exists()
