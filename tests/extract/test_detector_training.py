"""Detector training: targets, losses, a few steps that lower them, and reproducibility."""

import numpy as np
import pytest
import torch

from extract import Detector
from extract.modeling.boxes import BoxCoder
from extract.training.config import LossConfig, TrainConfig
from extract.training.loop import train_detector
from extract.training.loop import training_step
from extract.training.losses import attribute_loss
from extract.training.targets import IGNORED, NEGATIVE, POSITIVE, match, sample
from pipelines.world import generate_world
from pipelines.world.detector import DEMO_OVERRIDES, detection_examples


def test_box_encoding_inverts_decoding():
    boxes = torch.tensor([[10.0, 20.0, 50.0, 40.0], [0.0, 0.0, 16.0, 16.0]])
    targets = torch.tensor([[12.0, 18.0, 60.0, 44.0], [3.0, 1.0, 11.0, 30.0]])
    coder = BoxCoder((10.0, 10.0, 5.0, 5.0))
    torch.testing.assert_close(coder.decode(coder.encode(boxes, targets), boxes), targets)


def test_match_labels_by_iou_and_keeps_each_objects_best_box():
    gt = torch.tensor([[0.0, 0.0, 10.0, 10.0], [100.0, 100.0, 110.0, 110.0]])
    boxes = torch.tensor([
        [0.0, 0.0, 10.0, 9.0],  # IoU 0.9 with gt 0
        [0.0, 0.0, 10.0, 5.0],  # IoU 0.5: between the thresholds
        [50.0, 50.0, 60.0, 60.0],  # no overlap
        [100.0, 100.0, 130.0, 130.0],  # IoU 0.11 with gt 1, but its best box
    ])
    matched, labels = match(boxes, gt, 0.3, 0.7, low_quality_positives=False)
    assert labels.tolist() == [POSITIVE, IGNORED, NEGATIVE, NEGATIVE] and matched[0] == 0
    matched, labels = match(boxes, gt, 0.3, 0.7, low_quality_positives=True)
    assert labels.tolist() == [POSITIVE, IGNORED, NEGATIVE, POSITIVE] and matched[3] == 1


def test_sample_caps_positives_and_fills_with_negatives():
    labels = torch.tensor([POSITIVE] * 30 + [NEGATIVE] * 100 + [IGNORED] * 5)
    positive, negative = sample(labels, 64, 0.25, torch.Generator().manual_seed(0))
    assert (len(positive), len(negative)) == (16, 48)
    assert (labels[positive] == POSITIVE).all() and (labels[negative] == NEGATIVE).all()
    assert len(set(positive.tolist()) | set(negative.tolist())) == 64


def test_attribute_loss_weighs_each_object_once_and_targets_no_attribute_when_none():
    logits = torch.randn(2, 5)
    loss = attribute_loss(logits, [[0, 3], []], num_attributes=4)
    log_probs = logits.log_softmax(dim=1)
    expected = -(0.5 * (log_probs[0, 0] + log_probs[0, 3]) + log_probs[1, 4]) / 2
    torch.testing.assert_close(loss, expected)


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    world = tmp_path_factory.mktemp("world")
    generate_world(world, 5, seed=1)
    return detection_examples(world, "train")


def _detector(seed: int = 0) -> Detector:
    return Detector.build("tiny", init_seed=seed, **DEMO_OVERRIDES)


def test_flipping_mirrors_boxes_with_the_pixels(examples):
    example = examples[0]
    flipped = example.flipped()
    width = example.image.shape[1]
    x1, y1, x2, y2 = example.boxes[0].astype(int)
    fx1, _, fx2, _ = flipped.boxes[0].astype(int)
    assert (fx1, fx2) == (width - x2, width - x1)
    np.testing.assert_array_equal(flipped.image[y1:y2, fx1:fx2], example.image[y1:y2, x1:x2][:, ::-1])


def _losses(det, batch):
    with torch.no_grad():
        return {k: float(v) for k, v in training_step(det, batch, LossConfig(), torch.Generator().manual_seed(0)).items()}


def test_a_few_steps_lower_every_loss_on_the_training_images(examples):
    det = _detector()
    batch = examples[:1]
    before = _losses(det, batch)
    assert set(before) == {"rpn_objectness", "rpn_boxes", "roi_classes", "roi_boxes", "roi_attributes"}
    config = TrainConfig(steps=20, images_per_step=1, warmup_steps=1, learning_rate=3e-3, flip=False)
    train_detector(det, batch, config, log=lambda _: None)
    after = _losses(det, batch)
    # An object with two attributes keeps a floor of ln 2 in the attribute loss, so it falls slowest.
    for name, factor in (("rpn_objectness", 0.7), ("roi_classes", 0.7), ("roi_attributes", 0.9)):
        assert after[name] < factor * before[name], (name, before[name], after[name])
    assert after["rpn_boxes"] + after["roi_boxes"] < before["rpn_boxes"] + before["roi_boxes"]
    assert not det.training


def test_training_is_reproducible_for_a_seed(examples):
    config = TrainConfig(steps=3, warmup_steps=1, log_every=1)
    first, second, other = _detector(), _detector(), _detector()
    train_detector(first, examples, config, log=lambda _: None)
    train_detector(second, examples, config, log=lambda _: None)
    train_detector(other, examples, TrainConfig(steps=3, warmup_steps=1, seed=1), log=lambda _: None)
    for (name, a), b, c in zip(first.state_dict().items(), second.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b), name
    assert any(not torch.equal(a, c) for a, c in zip(first.state_dict().values(), other.state_dict().values()))
