"""One bottom-up-attention selection pass for a batch of images: each image's boxes and confidences
are exactly those it gets alone, and those of one torchvision NMS per class."""

import pytest
import torch

import extract.selection as selection
from extract import select_boxes
from extract.selection import per_class_nms_selection, select_boxes_batch
from tests.helpers.detection import random_detections

THRESHOLDS = ((0.2, 0.3, 10, 100), (0.05, 0.5, 2, 20), (0.0, 0.3, 3, 5))


def images(counts, num_classes, sharpness, quantised):
    return [random_detections(7 * i + n, n, num_classes, sharpness, quantised) for i, n in enumerate(counts)]


def assert_selects_as_alone(detections, thresholds):
    boxes, probs = zip(*detections)
    batched = select_boxes_batch(list(boxes), list(probs), *thresholds)
    assert len(batched) == len(detections)
    for (b, p), (keep, conf) in zip(detections, batched):
        alone_keep, alone_conf = select_boxes(b, p, *thresholds)
        expected_keep, expected_conf = per_class_nms_selection(b, p, *thresholds)
        assert torch.equal(keep, alone_keep) and torch.equal(conf, alone_conf)
        assert torch.equal(keep, expected_keep) and torch.equal(conf, expected_conf)


@pytest.fixture
def paths(monkeypatch):
    """Counts the calls of each NMS strategy, so that the cases below are known to take both."""
    calls = {"_nms_per_column": 0, "_nms_by_rank": 0}
    for name in calls:
        original = getattr(selection, name)

        def counted(*args, _name=name, _original=original):
            calls[_name] += 1
            return _original(*args)
        monkeypatch.setattr(selection, name, counted)
    return calls


@pytest.mark.parametrize("counts, num_classes, path", [
    ([60, 0, 17, 1, 45], 6, "_nms_per_column"),  # few classes, deep prefixes: one NMS per column
    ([120, 37, 0, 90, 5], 400, "_nms_by_rank"),  # many classes: all columns rank by rank
    ([300, 212], 1600, "_nms_by_rank"),  # Visual Genome's classes
])
@pytest.mark.parametrize("sharpness, quantised", [(0.01, False), (3.0, False), (3.0, True)])
def test_a_batch_selects_each_image_as_alone_and_as_per_class_nms(paths, counts, num_classes, path, sharpness,
                                                                   quantised):
    detections = images(counts, num_classes, sharpness, quantised)
    for thresholds in THRESHOLDS:
        assert_selects_as_alone(detections, thresholds)
    assert paths[path] > 0


def test_images_never_suppress_each_other(paths):
    """Two images with the very same boxes (IoU 1 across images) and different scores."""
    boxes, probs = random_detections(3, 40, 6, 3.0, False)
    other = random_detections(4, 40, 6, 3.0, False)[1]
    for thresholds in THRESHOLDS:
        assert_selects_as_alone([(boxes, probs), (boxes.clone(), other), (boxes, probs)], thresholds)


def test_empty_batches_and_images_without_boxes():
    assert select_boxes_batch([], [], 0.2, 0.3, 10, 100) == []
    empty = [(torch.zeros(0, 4), torch.zeros(0, 7))] * 2
    results = select_boxes_batch(*map(list, zip(*empty)), 0.2, 0.3, 10, 100)
    assert [(keep.tolist(), conf.tolist()) for keep, conf in results] == [([], [])] * 2


def test_one_image_with_probabilities_that_are_not_finite_fails_the_batch():
    detections = images([10, 12], 4, 1.0, False)
    detections[1][1][3, 1] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        select_boxes_batch(*map(list, zip(*detections)), 0.2, 0.3, 2, 5)
