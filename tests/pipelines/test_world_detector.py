"""The shipped demo detector: loadable as documented, and it finds the world's objects on unseen images."""

from pathlib import Path

import pytest
import torch

from extract import Detector
from extract.training.config import TrainConfig
from extract.training.evaluate import evaluate_detector
from pipelines.world import ATTRIBUTE_NAMES, CLASS_NAMES, generate_world
from pipelines.world.detector import detection_examples

DATA = Path(__file__).resolve().parents[2] / "pipelines" / "data"


@pytest.fixture(scope="module")
def demo_detector():
    return Detector.build(str(DATA / "demo_detector.yaml"), weights=DATA / "demo_detector.safetensors")


def test_demo_detector_config_names_the_world_vocabulary(demo_detector):
    cfg = demo_detector.cfg
    assert cfg.class_names == CLASS_NAMES and cfg.attribute_names == ATTRIBUTE_NAMES
    assert (cfg.num_classes, cfg.num_attributes, cfg.min_size, cfg.max_size) == (6, 8, 128, 192)


def test_demo_detector_finds_classifies_and_describes_objects_in_unseen_scenes(demo_detector, tmp_path):
    # A seed the shipped weights were not trained on (they were trained on seed 0).
    generate_world(tmp_path, 20, seed=12345)
    with torch.no_grad():
        quality = evaluate_detector(demo_detector, detection_examples(tmp_path, "train"))
    # Measured for these 50 objects: recall 0.86, class accuracy 0.67, attribute accuracy 1.0 (chance: 1/6, 1/8).
    assert quality.objects == 50
    assert quality.recall > 0.75 and quality.class_accuracy > 0.55 and quality.attribute_accuracy > 0.9


def test_cli_generates_a_world_and_trains_a_loadable_detector(tmp_path):
    from click.testing import CliRunner

    from pipelines.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["world", "generate", "--out", str(tmp_path / "world"), "--images", "5", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "world" / "corpus.txt").is_file() and (tmp_path / "world" / "images" / "val" / "000004.png").is_file()
    weights = tmp_path / "det" / "demo.safetensors"
    result = runner.invoke(main, ["world", "train-detector", "--world", str(tmp_path / "world"), "--out", str(weights),
                                  "--steps", "2", "--threads", str(torch.get_num_threads())])
    assert result.exit_code == 0, result.output
    assert "val recall@0.5" in result.output and weights.with_suffix(".metrics.json").is_file()
    detector = Detector.build(str(weights.with_suffix(".yaml")), weights=weights)
    assert detector.cfg.class_names == CLASS_NAMES and detector.cfg.pooler_resolution == 7


def test_a_detector_can_be_left_untaught_some_attributes(tmp_path):
    from pipelines.world.detector import train_world_detector

    generate_world(tmp_path / "world", 5, seed=3)
    taught = detection_examples(tmp_path / "world", "train", ("small", "large"))
    every = detection_examples(tmp_path / "world", "train")
    # Each object keeps only its size (index in the detector's two), and loses its colour.
    sizes = [[ATTRIBUTE_NAMES[a] for a in attrs if ATTRIBUTE_NAMES[a] in ("small", "large")]
             for e in every for attrs in e.attributes]
    assert sizes == [[("small", "large")[a] for a in attrs] for e in taught for attrs in e.attributes]
    assert all(attrs and attrs[0] < 6 for e in every for attrs in e.attributes)  # each had a colour
    metrics = train_world_detector(tmp_path / "world", tmp_path / "det.safetensors",
                                   TrainConfig(steps=2), log=lambda line: None, attribute_names=("small", "large"))
    assert metrics["attributes"] == ["small", "large"]
    detector = Detector.build(str(tmp_path / "det.yaml"), weights=tmp_path / "det.safetensors")
    assert detector.cfg.attribute_names == ("small", "large") and detector.cfg.num_attributes == 2


@pytest.mark.parametrize("attributes, problem", [("small,pink", "pink is not one"), ("small,small", "distinct"),
                                                  ("", "one or more")])
def test_cli_refuses_attributes_the_world_does_not_have(tmp_path, attributes, problem):
    from click.testing import CliRunner

    from pipelines.cli import main

    generate_world(tmp_path / "world", 5, seed=3)
    weights = tmp_path / "det.safetensors"
    result = CliRunner().invoke(main, ["world", "train-detector", "--world", str(tmp_path / "world"), "--out",
                                       str(weights), "--steps", "2", "--attributes", attributes])
    assert result.exit_code == 2 and "--attributes" in result.output and problem in result.output
    assert not weights.exists() and not weights.with_suffix(".yaml").exists()
