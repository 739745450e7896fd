"""Batching, the one RoI feature path, precisions and the fast box selection: numbers against references.

Batched and one-at-a-time results are compared bitwise: on the CPU in float32, every convolution
goes through oneDNN (extract/modeling/conv.py), whose per-image numbers do not depend on the batch,
and the box predictor runs each image's rows in calls of their own (`BoxPredictor.per_image`).
Cases marked `kernel_families` run again under each lower CPU kernel family this machine has
(tests/extract/test_kernel_families.py).
"""

import numpy as np
import pytest
import torch

from extract import Detector, select_boxes
from extract.config import ConfigError
from extract.fidelity import compare_to_fp32
from extract.modeling import roi_heads
from extract.modeling.parts import PARTS, Part, register_part
from extract.modeling.resnet import ResNetC4
from extract.selection import per_class_nms_selection
from extract.synthetic import synthetic_image
from tests.helpers.detection import random_detections
from vlbert.utils.precision import PRECISIONS, PrecisionError

SIZES = [(96, 140), (96, 140), (130, 70), (96, 140)]  # three share an input size, one does not

# A detector as narrow as `tiny` and one as wide as ResNet's stages: kernels differ by width.
WIDE = {"stem_out_channels": 64, "res2_out_channels": 256, "bottleneck_channels": 64, "rpn_post_nms_topk": 12,
        "min_boxes": 2, "max_boxes": 4}
# `tiny` with BUTD's classes and attributes (1600 + 1, 400 + 1 outputs) and few proposals: one call over
# a batch's rows gave an image's class head other bits than alone on MKL 2024.2 here (AMD EPYC: 2-3
# rows alone, 4 or more in the batch) before each image's rows ran in calls of their own.
BUTD_CLASSES = {"num_classes": 1600, "num_attributes": 400, "rpn_post_nms_topk": 12, "min_boxes": 2, "max_boxes": 4}


def assert_same_regions(a, b):
    for name in ("boxes", "features", "image_feature", "class_probs", "objects_id", "attrs_id", "attrs_conf"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def images_for(detector):
    return [detector.prepare(synthetic_image(h, w, seed=i)) for i, (h, w) in enumerate(SIZES)]


@pytest.mark.parametrize("overrides", [{}, WIDE, pytest.param(BUTD_CLASSES, marks=pytest.mark.kernel_families)],
                         ids=["tiny", "resnet-widths", "butd-classes"])
def test_batched_detection_and_description_equal_one_image_at_a_time_bitwise(overrides):
    detector = Detector.build("tiny", **overrides)
    images = images_for(detector)
    detected = detector.detect(images)
    boxes = [r.boxes[:count] for r, count in zip(detected, (1, 2, 3, 1))]
    described = detector.describe(images, boxes)
    for i, image in enumerate(images):
        assert_same_regions(detector.detect([image])[0], detected[i])
        assert_same_regions(detector.describe([image], [boxes[i]])[0], described[i])


@pytest.mark.kernel_families
def test_an_images_passes_in_one_call_equal_separate_calls(tiny_detector):
    """The job describes each image's clean pass and its masked variants in one call."""
    images = images_for(tiny_detector)[:2]
    boxes = [torch.tensor([[5, 5, 60, 50.0], [30, 20, 120, 90], [0, 0, 40, 40]])] * 2
    masks = [None, np.array([True, False, False]), np.array([False, True, True])]
    together = tiny_detector.describe([images[0]] * 3 + [images[1]] * 3, boxes[:1] * 6, masks * 2)
    for j, image in enumerate(images):
        for k, mask in enumerate(masks):
            alone = tiny_detector.describe([image], boxes[:1], None if mask is None else [mask])[0]
            assert_same_regions(alone, together[3 * j + k])


@pytest.mark.kernel_families
def test_res5_chunking_never_changes_a_feature(tiny_detector, monkeypatch):
    images = images_for(tiny_detector)
    boxes = [torch.tensor([[5, 5, 60, 50.0], [30, 20, 69, 90], [0, 0, 40, 40]])] * len(images)
    whole = tiny_detector.describe(images, boxes)
    for chunk in (1, 5):
        monkeypatch.setattr(roi_heads, "ROI_CHUNK", chunk)
        for a, b in zip(whole, tiny_detector.describe(images, boxes)):
            assert_same_regions(a, b)


def test_box_features_is_the_path_that_describe_takes(tiny_detector):
    """The end-to-end stage's features (input-pixel boxes, differentiable) are describe's numbers."""
    images = images_for(tiny_detector)[:2]
    boxes = [torch.tensor([[5, 5, 60, 50.0], [30, 20, 69, 90]])] * 2
    features = tiny_detector.box_features(images, [image.to_input(b) for image, b in zip(images, boxes)])
    described = tiny_detector.describe(images, boxes)
    for f, region in zip(features, described):
        assert f.requires_grad
        assert torch.equal(f.detach(), region.features)


def test_the_attribute_head_is_conditioned_on_the_classes_it_is_given(tiny_detector):
    predictor = tiny_detector.roi_heads.box_predictor
    features = torch.randn(5, tiny_detector.cfg.feature_dim)
    predicted = predictor(features)
    argmax = predicted.class_logits.argmax(dim=1)
    assert torch.equal(predicted.attr_logits, predictor.attribute_logits(features, argmax))
    other = (argmax + 1) % (tiny_detector.cfg.num_classes + 1)
    assert not torch.allclose(predicted.attr_logits, predictor.attribute_logits(features, other))


# ---- parts ---------------------------------------------------------------------------------

def test_a_new_backbone_is_one_part_and_one_registration(monkeypatch):
    class HalvedInput(ResNetC4):
        def forward(self, x):
            return super().forward(x * 0.5)

    monkeypatch.setitem(PARTS, "backbone", dict(PARTS["backbone"]))
    register_part("backbone", Part("halved", HalvedInput, "ResNet C4 on inputs scaled by 1/2"))
    plain, halved = Detector.build("tiny"), Detector.build("tiny", backbone="halved")
    assert isinstance(halved.backbone, HalvedInput) and halved.state_dict().keys() == plain.state_dict().keys()
    image = plain.prepare(synthetic_image(96, 140))
    boxes = [torch.tensor([[5, 5, 60, 50.0]])]
    assert not torch.allclose(plain.describe([image], boxes)[0].features, halved.describe([image], boxes)[0].features)
    with pytest.raises(ConfigError, match="backbone='resnet_c5': expected one of resnet_c4, halved"):
        Detector.build("tiny", backbone="resnet_c5")


# ---- precisions ----------------------------------------------------------------------------

def test_bf16_stays_close_to_fp32_and_returns_float32(tiny_detector):
    images = images_for(tiny_detector)[:2]
    agreement = compare_to_fp32(tiny_detector, images, "bf16")
    assert tiny_detector.precision == "fp32"
    assert agreement.cosine_min > 0.999 and agreement.relative_l2_max < 0.05
    assert 0.0 <= agreement.class_agreement <= 1.0 and 0.0 <= agreement.detected_boxes <= 1.0
    bf16 = Detector.build("tiny", precision="bf16")
    region = bf16.detect(images[:1])[0]
    assert bf16.precision == "bf16"
    outputs = (region.boxes, region.features, region.class_probs, region.image_feature)
    assert all(t.dtype == torch.float32 for t in outputs)


def test_fp32_compared_with_itself_agrees_exactly(tiny_detector):
    agreement = compare_to_fp32(tiny_detector, images_for(tiny_detector)[:2], "fp32")
    assert agreement.cosine_min == pytest.approx(1.0) and agreement.relative_l2_max == 0.0
    assert (agreement.class_agreement, agreement.attribute_agreement, agreement.detected_boxes) == (1.0, 1.0, 1.0)


def test_unknown_and_unavailable_precisions_are_refused():
    with pytest.raises(PrecisionError, match="precision 'fp16': expected one of fp32, tf32, bf16"):
        Detector.build("tiny", precision="fp16")
    with pytest.raises(PrecisionError, match="tf32: TensorFloat-32 exists on CUDA devices only"):
        Detector.build("tiny", precision="tf32")


@pytest.mark.parametrize("name, mode", [("fp32", "ieee"), ("tf32", "tf32")])
def test_precision_sets_cuda_math_only_inside_a_forward(name, mode):
    settings = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    before = [s.fp32_precision for s in settings]
    with PRECISIONS[name].applied(torch.device("cuda")):
        assert [s.fp32_precision for s in settings] == [mode, mode]
    assert [s.fp32_precision for s in settings] == before


# ---- box selection against the per-class NMS loop -----------------------------------------

@pytest.mark.parametrize("num_boxes, num_classes", [(60, 6), (300, 1600), (200, 80), (5, 400), (1, 3)])
@pytest.mark.parametrize("sharpness, quantised", [(0.01, False), (3.0, False), (8.0, False), (3.0, True)])
def test_fast_selection_equals_per_class_nms(num_boxes, num_classes, sharpness, quantised):
    boxes, probs = random_detections(num_boxes + num_classes, num_boxes, num_classes, sharpness, quantised)
    for thresholds in ((0.2, 0.3, 10, 100), (0.05, 0.5, 2, 20)):
        keep, conf = select_boxes(boxes, probs, *thresholds)
        expected_keep, expected_conf = per_class_nms_selection(boxes, probs, *thresholds)
        assert torch.equal(keep, expected_keep) and torch.equal(conf, expected_conf)


def test_selection_refuses_probabilities_that_are_not_finite():
    boxes, probs = random_detections(0, 10, 4, 1.0, False)
    probs[3, 1] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        select_boxes(boxes, probs, 0.2, 0.3, 2, 5)


def test_selection_leaves_the_thread_count_as_it_was():
    threads = torch.get_num_threads()
    select_boxes(*random_detections(1, 50, 20, 3.0, False), 0.2, 0.3, 2, 5)
    assert torch.get_num_threads() == threads
