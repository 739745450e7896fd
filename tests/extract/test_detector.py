"""The extraction detector: outputs, selection, batching, masking, configs and bad input."""

import math

import numpy as np
import pytest
import torch

from extract import BoxError, ConfigError, Detector, load_config, mask_pixels, select_boxes
from extract.config import parse_override
from extract.modeling.boxes import BoxCoder
from extract.modeling.parts import ShapeSpec, part_shape
from extract.modeling.rpn import cell_anchors
from extract.preprocess import MIN_INPUT_SIDE, resized_size
from extract.presets import PRESETS
from extract.synthetic import synthetic_image


# ---- presets and configs -------------------------------------------------------------------

def test_butd_preset_matches_the_bottom_up_attention_layout():
    cfg = PRESETS["butd-vg"]
    assert cfg.res_blocks == (3, 4, 23, 3) and cfg.stride_in_1x1 and cfg.stem_pool == "caffe"
    assert (cfg.res5_stride, cfg.res5_dilation, cfg.pooler, cfg.pooler_resolution) == (1, 2, "roipool", 14)
    assert (cfg.rpn_hidden_channels, cfg.num_anchors, cfg.rpn_pre_nms_topk, cfg.rpn_post_nms_topk) == (512, 12, 6000, 300)
    assert (cfg.num_classes, cfg.num_attributes, cfg.feature_dim, part_shape("backbone", cfg)) == (
        1600, 400, 2048, ShapeSpec(1024, 16))
    assert cfg.pixel_mean == (102.9801, 115.9465, 122.7717) and (cfg.min_size, cfg.max_size) == (600, 1000)
    assert (cfg.score_thresh, cfg.nms_thresh, cfg.min_boxes, cfg.max_boxes) == (0.2, 0.3, 10, 100)


def test_d2_preset_differs_where_detectron2_differs():
    cfg = PRESETS["d2-r101-c4"]
    assert (cfg.stem_pool, cfg.res5_stride, cfg.res5_dilation, cfg.pooler) == ("standard", 2, 1, "roialign")
    assert (cfg.num_classes, cfg.num_attributes, cfg.rpn_hidden_channels, cfg.num_anchors) == (80, 0, 1024, 15)
    assert (cfg.min_size, cfg.max_size, cfg.rpn_post_nms_topk) == (800, 1333, 1000)


def test_overrides_and_yaml_files(tmp_path):
    cfg = load_config("tiny", dict([parse_override("score_thresh=0.5"), parse_override("anchor_sizes=[8, 16]")]))
    assert cfg.score_thresh == 0.5 and cfg.anchor_sizes == (8.0, 16.0) and cfg.num_anchors == 6
    path = tmp_path / "mine.yaml"
    path.write_text("base: tiny\nmax_boxes: 7\nbox_source: regressed\n")
    cfg = load_config(str(path))
    assert (cfg.name, cfg.max_boxes, cfg.box_source, cfg.num_classes) == ("mine", 7, "regressed", 6)


@pytest.mark.parametrize("preset, overrides, message", [
    ("nope", {}, "not a preset"),
    ("tiny", {"colour": 1}, "unknown field 'colour'"),
    ("tiny", {"pooler": "roialign_v3"}, "expected one of"),
    ("tiny", {"min_boxes": 50}, "min_boxes <= max_boxes"),
    ("tiny", {"stride_in_1x1": "maybe"}, "expected true or false"),
    ("tiny", {"class_names": ["a", "b"]}, "class_names has 2 entries"),
])
def test_bad_configs_are_named(preset, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(preset, overrides)


# ---- building blocks against hand-computed references --------------------------------------

def test_anchor_order_and_shapes_follow_detectron2():
    anchors = cell_anchors((64.0, 128.0), (0.5, 1.0, 2.0))
    # size-major: (64, 0.5), (64, 1), (64, 2), (128, 0.5), ...; ratio = h / w, area = size^2
    w, h = math.sqrt(64 * 64 / 0.5), math.sqrt(64 * 64 / 0.5) * 0.5
    assert torch.allclose(anchors[0], torch.tensor([-w / 2, -h / 2, w / 2, h / 2]))
    assert torch.allclose(anchors[4], torch.tensor([-64.0, -64.0, 64.0, 64.0]))
    widths, heights = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    assert torch.allclose(widths * heights, torch.tensor([64.0**2] * 3 + [128.0**2] * 3))


def test_box_decoding_matches_the_box_transform():
    boxes = torch.tensor([[10.0, 20.0, 50.0, 100.0]])
    coder = BoxCoder((10, 10, 5, 5))
    assert torch.allclose(coder.decode(torch.zeros(1, 8), boxes), boxes.repeat(1, 2))
    # dx = 0.1 * 10 shifts the centre by 0.1 * width; dw = log(2) * 5 doubles the width
    out = coder.decode(torch.tensor([[1.0, 0.0, math.log(2) * 5, 0.0]]), boxes)
    assert torch.allclose(out, torch.tensor([[-6.0, 20.0, 74.0, 100.0]]))


def test_resized_size_rounds_like_detectron2():
    assert resized_size(480, 640, 600, 1000) == (600, 800)
    assert resized_size(100, 2000, 600, 1000) == (50, 1000)
    assert resized_size(333, 500, 600, 1000) == (600, 901)


def reference_selection(boxes, probs, score_thresh, nms_thresh, min_boxes, max_boxes):
    """Bottom-up-attention selection written out with NumPy loops."""
    def iou(a, b):
        ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = ix * iy
        return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)

    n, num_fg = probs.shape[0], probs.shape[1] - 1
    max_conf = np.zeros(n)
    for c in range(num_fg):
        order = sorted(range(n), key=lambda i: -probs[i, c])
        kept = []
        for i in order:
            if all(iou(boxes[i], boxes[j]) <= nms_thresh for j in kept):
                kept.append(i)
        for i in kept:
            max_conf[i] = max(max_conf[i], probs[i, c])
    order = sorted(range(n), key=lambda i: -max_conf[i])
    count = min(max((max_conf >= score_thresh).sum(), min_boxes), max_boxes, n)
    return order[:count], max_conf


@pytest.mark.parametrize("score_thresh, min_boxes, max_boxes", [(0.2, 3, 30), (0.05, 2, 5), (0.9, 6, 10)])
def test_select_boxes_matches_the_reference_procedure(score_thresh, min_boxes, max_boxes):
    rng = np.random.default_rng(1)
    xy = rng.uniform(0, 80, size=(40, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 40, size=(40, 2))], axis=1).astype(np.float32)
    probs = rng.dirichlet(np.full(6, 0.3), size=40).astype(np.float32)
    keep, conf = select_boxes(torch.from_numpy(boxes), torch.from_numpy(probs), score_thresh, 0.3,
                              min_boxes, max_boxes)
    expected, max_conf = reference_selection(boxes, probs, score_thresh, 0.3, min_boxes, max_boxes)
    assert keep.tolist() == expected
    assert np.allclose(conf.numpy(), max_conf[expected])
    assert (np.diff(conf.numpy()) <= 0).all()


# ---- detection and given-box modes ---------------------------------------------------------

def test_detect_returns_every_field(tiny_detector):
    image = tiny_detector.prepare(synthetic_image(96, 140))
    region = tiny_detector.detect([image])[0]
    cfg = tiny_detector.cfg
    n = len(region.boxes)
    assert cfg.min_boxes <= n <= cfg.max_boxes
    assert region.features.shape == (n, cfg.feature_dim) and region.image_feature.shape == (cfg.feature_dim,)
    assert region.class_probs.shape == (n, cfg.num_classes + 1)
    assert torch.allclose(region.class_probs.sum(dim=1), torch.ones(n))
    assert torch.equal(region.objects_id, region.class_probs[:, :-1].argmax(dim=1))
    assert torch.allclose(region.objects_conf, region.class_probs[:, :-1].max(dim=1).values)
    assert region.attrs_id.shape == (n,) and int(region.attrs_id.max()) < cfg.num_attributes
    assert (region.boxes[:, 0] >= 0).all() and (region.boxes[:, 2] <= 140).all() and (region.boxes[:, 3] <= 96).all()
    assert (region.image_height, region.image_width, region.box_source) == (96, 140, "proposals")


def test_detected_boxes_are_the_pooled_proposals(tiny_detector):
    """Saved boxes are the proposals whose features were pooled: describing them gives the same numbers."""
    image = tiny_detector.prepare(synthetic_image(96, 140, seed=3))
    detected = tiny_detector.detect([image])[0]
    described = tiny_detector.describe([image], [detected.boxes])[0]
    assert torch.allclose(described.features, detected.features, atol=1e-4, rtol=1e-4)
    assert torch.equal(described.objects_id, detected.objects_id)
    assert torch.allclose(described.image_feature, detected.image_feature, atol=1e-5)


def test_regressed_boxes_are_recorded_as_such():
    detector = Detector.build("tiny", box_source="regressed")
    image = detector.prepare(synthetic_image(96, 140, seed=3))
    region = detector.detect([image])[0]
    proposals = Detector.build("tiny").detect([image])[0]
    assert region.box_source == "regressed"
    assert torch.allclose(region.features, proposals.features)
    assert not torch.allclose(region.boxes, proposals.boxes)
    assert (region.boxes[:, 2] <= 140 + 1e-3).all() and (region.boxes[:, 3] <= 96 + 1e-3).all()


def test_given_boxes_keep_their_order(tiny_detector):
    image = tiny_detector.prepare(synthetic_image(80, 120))
    boxes = torch.tensor([[0, 0, 60, 40], [50, 30, 119, 79], [10, 10, 30, 70.0]])
    forward = tiny_detector.describe([image], [boxes])[0]
    backward = tiny_detector.describe([image], [boxes.flip(0)])[0]
    assert forward.box_source == "given" and torch.equal(forward.boxes, boxes)
    assert torch.allclose(forward.features, backward.features.flip(0), atol=1e-5)
    assert torch.allclose(forward.image_feature, backward.image_feature, atol=1e-5)


# ---- pixel masking -------------------------------------------------------------------------

def test_mask_pixels_zeroes_inclusive_integer_rows_and_columns():
    image = torch.ones(3, 10, 12)
    out = mask_pixels(image, torch.tensor([[2.7, 1.2, 5.9, 3.99]]))
    expected = torch.ones(3, 10, 12)
    expected[:, 1:4, 2:6] = 0  # rows int(1.2)..int(3.99), columns int(2.7)..int(5.9), ends included
    assert torch.equal(out, expected) and torch.equal(image, torch.ones(3, 10, 12))
    clipped = mask_pixels(image, torch.tensor([[-5.0, 8.0, 30.0, 40.0]]))
    assert clipped[:, 8:].abs().sum() == 0 and clipped[:, :8].min() == 1


def test_masked_box_content_does_not_reach_any_feature(tiny_detector):
    """Two images that differ only inside a masked box give identical features once it is masked.

    The mask applies to the resized input, so bilinear resizing blends a one-pixel ring at the box
    edge with the outside (as in the reference code); the difference stays two pixels inside it.
    """
    first = synthetic_image(96, 128, seed=5)
    second = first.copy()
    second[22:58, 32:88] = 255 - second[22:58, 32:88]
    boxes = torch.tensor([[30.0, 20.0, 89.0, 59.0], [0.0, 0.0, 40.0, 40.0]])
    images = [tiny_detector.prepare(a) for a in (first, second)]
    mask = np.array([True, False])
    masked = tiny_detector.describe(images, [boxes, boxes], pixel_masks=[mask, mask])
    assert torch.allclose(masked[0].features, masked[1].features, atol=1e-5)
    assert torch.allclose(masked[0].image_feature, masked[1].image_feature, atol=1e-5)
    plain = tiny_detector.describe(images, [boxes, boxes])
    assert not torch.allclose(plain[0].features[0], plain[1].features[0], atol=1e-3)
    assert not torch.allclose(plain[0].features[0], masked[0].features[0], atol=1e-3)


# ---- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("box, message", [
    ([10, 10, float("nan"), 20], "not finite"),
    ([30, 10, 20, 20], "inverted"),
    ([200, 200, 300, 300], "empty inside the 120x80 image"),
    ([10, 10, 10, 30], "empty"),
])
def test_unusable_boxes_are_named(tiny_detector, box, message):
    image = tiny_detector.prepare(synthetic_image(80, 120))
    with pytest.raises(BoxError, match=r"box 1 .*" + message):
        tiny_detector.describe([image], [[[0, 0, 10, 10], box]])


def test_boxes_outside_the_image_are_clamped(tiny_detector):
    image = tiny_detector.prepare(synthetic_image(80, 120))
    region = tiny_detector.describe([image], [[[-10, -5, 50, 200]]])[0]
    assert region.boxes.tolist() == [[0.0, 0.0, 50.0, 80.0]]


@pytest.mark.parametrize("height, width", [(2000, 12), (5, 900), (1, 1)])
def test_extreme_aspect_ratios_are_padded_not_rejected(tiny_detector, height, width):
    image = tiny_detector.prepare(synthetic_image(height, width))
    assert min(image.tensor.shape[1:]) >= MIN_INPUT_SIDE
    region = tiny_detector.detect([image])[0]
    assert len(region.boxes) >= 1 and torch.isfinite(region.features).all()
    assert (region.boxes[:, 2] <= width + 1e-3).all() and (region.boxes[:, 3] <= height + 1e-3).all()
