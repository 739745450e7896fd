"""res5 layouts (extract/modeling/res5_layouts.py): polyphase gives dilated's features and gradients
within float32 rounding, is refused where it does not apply, and the default changes no bit."""

import pytest
import torch

from extract import Detector
from extract.modeling import roi_heads
from extract.modeling.res5_layouts import Res5LayoutError
from extract.synthetic import synthetic_image

SIZES = [(96, 140), (130, 70)]
# tiny has BUTD's res5 (stride 1, dilation 2) and pooler (14x14); dilation 3 on a 12x12 grid: 9 sub-grids.
# Few proposals, so that the case takes seconds.
FEW = {"rpn_post_nms_topk": 16, "min_boxes": 2, "max_boxes": 6}
LAYOUT_CONFIGS = {"butd": FEW, "dilation-3": {**FEW, "res5_dilation": 3, "pooler_resolution": 12}}
RTOL, ATOL = 1e-5, 1e-5


def images_for(detector):
    return [detector.prepare(synthetic_image(h, w, seed=i)) for i, (h, w) in enumerate(SIZES)]


def boxes_for(images):
    gen = torch.Generator().manual_seed(3)
    boxes = []
    for image in images:
        corners = torch.rand(5, 2, 2, generator=gen) * torch.tensor([image.width, image.height])
        boxes.append(torch.cat((corners.min(dim=1).values, corners.max(dim=1).values + 4), dim=1))
    return boxes


def both_layouts(**overrides):
    return Detector.build("tiny", **overrides), Detector.build("tiny", res5_layout="polyphase", **overrides)


@pytest.mark.parametrize("overrides", LAYOUT_CONFIGS.values(), ids=LAYOUT_CONFIGS)
def test_polyphase_features_equal_dilated_ones_in_both_modes(overrides, monkeypatch):
    monkeypatch.setattr(roi_heads, "ROI_CHUNK", 4)  # several chunks, one of them short
    dilated, polyphase = both_layouts(**overrides)
    images = images_for(dilated)
    boxes = boxes_for(images)
    rounded_otherwise = False
    for mode in ("detect", "describe"):
        run = (lambda d: d.detect(images)) if mode == "detect" else (lambda d: d.describe(images, boxes))
        for a, b in zip(run(dilated), run(polyphase)):
            assert torch.equal(a.boxes, b.boxes), mode
            for name in ("features", "image_feature", "class_probs"):
                torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=RTOL, atol=ATOL,
                                           msg=lambda text: f"{mode} {name}: {text}")
            rounded_otherwise |= not torch.equal(a.features, b.features)
    assert rounded_otherwise  # the other path ran: its sums add in another order


def test_polyphase_gradients_through_box_features_equal_dilated_ones():
    """The end-to-end stage tunes res3-res5 through `Detector.box_features`."""
    grads = []
    for detector in both_layouts():
        images = images_for(detector)
        features = torch.cat(detector.box_features(images, boxes_for(images)))
        weights = torch.randn(features.shape, generator=torch.Generator().manual_seed(0))
        (features * weights).sum().backward()
        grads.append({name: p.grad for name, p in detector.named_parameters()
                      if name.startswith(("backbone.res3", "backbone.res4", "roi_heads.res5"))})
    assert len(grads[0]) > 10 and grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6 * grad.abs().max().item(), msg=name)


@pytest.mark.parametrize("overrides, why", [
    ({"res5_stride": 2, "res5_dilation": 1}, "res5 has stride 2 and dilation 1"),  # detectron2's
    ({"res5_dilation": 1}, "res5 has stride 1 and dilation 1"),
    ({"pooler_resolution": 7}, "pooler_resolution 7 is not a multiple of res5's dilation 2"),
])
def test_polyphase_is_refused_in_one_line_where_it_does_not_apply(overrides, why):
    with pytest.raises(Res5LayoutError, match=why) as refused:
        Detector.build("tiny", res5_layout="polyphase", **overrides)
    assert "\n" not in str(refused.value)


def test_unknown_layouts_are_refused_and_a_refused_switch_keeps_the_layout():
    detector = Detector.build("tiny", pooler_resolution=7)
    with pytest.raises(Res5LayoutError, match="res5 layout 'strided': expected one of dilated, polyphase"):
        detector.res5_layout = "strided"
    with pytest.raises(Res5LayoutError, match="does not apply"):
        detector.res5_layout = "polyphase"
    assert detector.res5_layout == "dilated"


def test_the_default_is_dilated_and_a_layout_is_no_weight_nor_config_field(tiny_detector):
    """The default runs res5 as built (bitwise: pool, res5, float32 mean), and switching to polyphase
    and back changes no bit; layouts share weights, checkpoint keys and the config."""
    detector = Detector.build("tiny")
    assert detector.res5_layout == "dilated"
    images = images_for(detector)
    boxes = boxes_for(images)
    res4 = detector.feature_maps(images)
    heads = detector.roi_heads
    with torch.no_grad():
        pooled = torch.cat([heads.pool(f, torch.cat((b.new_zeros(len(b), 1), b), dim=1)) for f, b in zip(res4, boxes)])
        as_built = torch.cat([heads.res5(rois).mean(dim=(2, 3), dtype=torch.float32)
                              for rois in pooled.split(roi_heads.ROI_CHUNK)])
        assert torch.equal(heads.box_features(res4, boxes), as_built)
        before = detector.describe(images, boxes)
        detector.res5_layout = "polyphase"
        assert not torch.equal(heads.box_features(res4, boxes), as_built)
        detector.res5_layout = "dilated"
        for a, b in zip(before, detector.describe(images, boxes)):
            assert torch.equal(a.features, b.features)
    polyphase = Detector.build("tiny", res5_layout="polyphase")
    assert polyphase.cfg == tiny_detector.cfg
    state, reference = polyphase.state_dict(), tiny_detector.state_dict()
    assert state.keys() == reference.keys() and all(torch.equal(state[k], reference[k]) for k in state)
