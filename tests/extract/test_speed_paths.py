"""Speed paths (extract/modeling/speed_paths.py): each one's numbers against the detector without it, on
the tiny detector; unknown or unfit paths refused in one line."""

import pytest
import torch

from extract import Detector
from extract.backends import build_extractor
from extract.modeling import roi_heads
from extract.modeling.speed_paths import SpeedPathError
from extract.synthetic import synthetic_image
from tests.extract.test_res5_layouts import FEW, SIZES, boxes_for
from tests.helpers.detection import random_norm_state

# Measured on an AVX2 CPU: folded res5 features within 3e-7 of the max feature (fp32)
FOLDED_TOLERANCE = 1e-5


def images_for(detector, sizes=SIZES):
    return [detector.prepare(synthetic_image(h, w, seed=i)) for i, (h, w) in enumerate(sizes)]


def pair(*paths, **settings):
    """The tiny detector without and with `paths`, the same random norms in both."""
    settings = {**FEW, **settings}
    detectors = Detector.build("tiny", **settings), Detector.build("tiny", speed_paths=paths, **settings)
    for detector in detectors:
        detector.load_state_dict(random_norm_state(detector, seed=1), strict=False)
    return detectors


def max_relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_folded_res5_norms_keep_boxes_and_proposals_and_features_within_rounding(monkeypatch):
    monkeypatch.setattr(roi_heads, "ROI_CHUNK", 4)  # several chunks, one of them short
    plain, folded = pair("folded-res5-norms")
    images = images_for(plain)
    with torch.no_grad():
        res4 = plain.feature_maps(images)
        assert all(torch.equal(a, b) for a, b in zip(res4, folded.feature_maps(images)))  # the trunk as today
        for (p, l), (q, m) in zip(plain.proposal_generator.propose(res4[0], [SIZES[0]]),
                                  folded.proposal_generator.propose(res4[0], [SIZES[0]])):
            assert torch.equal(p, q) and torch.equal(l, m)
    for mode in ("detect", "describe"):
        run = (lambda d: d.detect(images)) if mode == "detect" else (lambda d: d.describe(images, boxes_for(images)))
        for a, b in zip(run(plain), run(folded)):
            assert torch.equal(a.boxes, b.boxes), mode
            assert not torch.equal(a.features, b.features)  # the folded conv ran: it rounds otherwise
            assert max_relative(b.features, a.features) <= FOLDED_TOLERANCE, mode
            assert max_relative(b.image_feature, a.image_feature) <= FOLDED_TOLERANCE, mode


def test_folded_res5_norms_leave_the_path_with_gradients_as_it_is():
    """The end-to-end stage tunes res5 through `Detector.box_features`: the same features and gradients, bitwise."""
    results = []
    for detector in pair("folded-res5-norms"):
        images = images_for(detector)
        features = torch.cat(detector.box_features(images, boxes_for(images)))
        features.sum().backward()
        grads = {name: p.grad for name, p in detector.named_parameters() if name.startswith("roi_heads.res5")}
        results.append((features, grads))
    (features, grads), (other_features, other_grads) = results
    assert torch.equal(features, other_features) and grads.keys() == other_grads.keys()
    assert all(torch.equal(grads[name], other_grads[name]) for name in grads)


@pytest.mark.parametrize("change", ["load_state_dict", "assign", "double"])
def test_folded_weights_are_folded_again_when_the_weights_or_norms_change(change):
    plain, folded = pair("folded-res5-norms")
    heads = [d.roi_heads for d in (plain, folded)]
    pooled = torch.rand(3, plain.backbone.output_shape.channels, 14, 14, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = heads[1].res5_features(pooled)
        if change == "double":
            for head in heads:
                head.double()
            pooled = pooled.double()
        else:
            state = {**random_norm_state(heads[0], seed=2),
                     "res5.0.conv1.weight": torch.randn(heads[0].res5[0].conv1.weight.shape)}
            for head in heads:
                head.load_state_dict(state, strict=False, assign=change == "assign")
        after, reference = heads[1].res5_features(pooled), heads[0].res5_features(pooled)
    assert not torch.equal(after.float(), before) and after.dtype == reference.dtype
    assert max_relative(after, reference) <= FOLDED_TOLERANCE


def test_cudnn_benchmark_is_on_around_res5_only_and_restored_after_an_exception(monkeypatch):
    detector = Detector.build("tiny", speed_paths=("cudnn-benchmark",), **FEW)
    layout, seen = detector.roi_heads._res5_layout, []
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)

    def recording(*args):
        seen.append(torch.backends.cudnn.benchmark)
        return layout.mean(*args)

    detector.roi_heads._res5_layout = type(layout)(layout.name, layout.summary, recording)
    pooled = torch.rand(2, detector.backbone.output_shape.channels, 14, 14)
    with torch.no_grad():
        detector.roi_heads.res5_features(pooled)
    assert seen == [True] and torch.backends.cudnn.benchmark is False

    def failing(*args):
        raise RuntimeError("out of memory")

    detector.roi_heads._res5_layout = type(layout)(layout.name, layout.summary, failing)
    with pytest.raises(RuntimeError, match="out of memory"), torch.no_grad():
        detector.roi_heads.res5_features(pooled)
    assert torch.backends.cudnn.benchmark is False


def test_bf16_roi_pooling_is_bitwise_the_autocast_s_cast():
    plain, cast_early = pair("bf16-roi-pooling", precision="bf16")
    images = images_for(plain)
    for a, b in zip(plain.detect(images), cast_early.detect(images)):
        for name in ("boxes", "features", "image_feature", "class_probs", "attrs_conf"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    with pytest.raises(SpeedPathError, match="speed path bf16-roi-pooling applies under precision bf16 only, not fp32"):
        Detector.build("tiny", speed_paths=("bf16-roi-pooling",))


def degenerate_head(head):
    """The RPN head's outputs with non-finite logits and deltas, and deltas that make boxes empty once clipped."""
    forward = head.forward

    def degenerate(x):
        logits, deltas = forward(x)
        logits, deltas = logits.clone(), deltas.clone()
        logits[:, 0, 0, :3] = float("nan")
        logits[:, 1, 1, 1] = float("inf")
        deltas[:, 0, 1, :] = float("inf")
        deltas[:, 5, 2, :] = float("nan")
        deltas[:, 2::4, 1:3, :] = -40.0  # widths exp(-40): empty
        deltas[:, 0::4, 3, :] = 1e4  # moved out of the image, clipped to a line
        logits[:, 2] = logits[:, 2].round(decimals=1)  # ties
        return logits, deltas

    head.forward = degenerate


@pytest.mark.parametrize("degenerate", [False, True])
def test_batched_rpn_proposes_today_s_proposals(degenerate):
    plain, batched = pair("batched-rpn", rpn_pre_nms_topk=150, rpn_post_nms_topk=40)
    if degenerate:
        for detector in (plain, batched):
            degenerate_head(detector.proposal_generator.rpn_head)
    sizes = [(96, 140), (130, 70), (96, 140), (96, 140)]
    images = images_for(plain, sizes)
    res4 = torch.cat([plain.feature_maps([image])[0] for image in images[::2]])  # two of one size
    input_hws = [(images[0].input_height, images[0].input_width), (images[0].input_height - 20, 50)]
    runs = [d.proposal_generator.propose(res4, input_hws) for d in (plain, batched)]
    runs += [d.proposal_generator.propose(res4[:1], input_hws[:1]) for d in (plain, batched)]
    for a, b in zip(runs[0] + runs[2], runs[1] + runs[3]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and len(a[0]) > 0
    for a, b in zip(plain.detect(images), batched.detect(images)):
        assert torch.equal(a.boxes, b.boxes) and torch.equal(a.features, b.features)


def test_unknown_speed_paths_and_the_detectron2_backend_refuse_in_one_line():
    with pytest.raises(SpeedPathError, match="speed path 'fast': expected one of folded-res5-norms, cudnn-benchmark, "
                                             "bf16-roi-pooling, batched-rpn"):
        Detector.build("tiny", speed_paths=("fast",))
    with pytest.raises(SpeedPathError, match="--detector d2:model.yaml: the detectron2 backend takes no speed paths, "
                                             "not batched-rpn"):
        build_extractor("d2:model.yaml", speed_paths=("batched-rpn",))
    detector = Detector.build("tiny", speed_paths=("batched-rpn", "folded-res5-norms", "batched-rpn"))
    assert detector.speed_paths == ("batched-rpn", "folded-res5-norms")
    assert Detector.build("tiny").speed_paths == ()
