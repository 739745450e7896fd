"""The detectron2 backend (`--detector d2:CONFIG.yaml`): numbers against detectron2's own forward
and against our detector with the same weights, the FeatureStore it writes, resume, bad input.

Runs where detectron2 is importable and skips elsewhere, except the test of the error users get
without it, which simulates the missing import.
"""

import json
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from extract import CheckpointError, ConfigError, Detector, load_image, load_weights, mask_pixels
from extract.backends import RegionExtractor, build_extractor
from extract.checkpoint import file_sha256
from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store import FeatureStore, StoreMismatchError
from extract.store.audit import verify_store
from extract.synthetic import synthetic_image
from pipelines.cli import main
from tests.helpers.detection import image_folder, randomized_state
from vlbert.utils.threads import configured_threads

# Our C4 layout at R-50 depth with narrow widths, in the variant detectron2 expresses as it is
# (d2-r101-c4: standard stem, res5 stride 2, ROIAlignV2).
NARROW_C4 = dict(res_blocks=(3, 4, 6, 3), stem_out_channels=8, res2_out_channels=32, bottleneck_channels=8,
                 rpn_hidden_channels=32, anchor_sizes=(16.0, 32.0, 64.0, 128.0), rpn_pre_nms_topk=300,
                 rpn_post_nms_topk=60, num_classes=5, min_size=96, max_size=160)
SELECTION = {"min_boxes": 4, "max_boxes": 12}
HEIGHT, WIDTH = 96, 144  # already at the test size: no side resizes it
BOXES = torch.tensor([[0, 0, 143, 95], [10.5, 20.25, 80, 70], [60, 30, 140, 90], [5, 5, 20, 12.0]])
MASKED = dict(mask_variants=2, mask_prob=0.3, mask_seed=7)


def tiny_fpn_config():
    """A narrow R-50 FPN Faster R-CNN on COCO's 80 classes: 64-d box head features."""
    from detectron2.config import get_cfg

    cfg = get_cfg()
    cfg.MODEL.BACKBONE.NAME = "build_resnet_fpn_backbone"
    cfg.MODEL.RESNETS.OUT_FEATURES = cfg.MODEL.FPN.IN_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.RESNETS.STEM_OUT_CHANNELS, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 8, 32
    cfg.MODEL.RESNETS.WIDTH_PER_GROUP = 8
    cfg.MODEL.FPN.OUT_CHANNELS = 16
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[16], [32], [64], [128], [256]]
    cfg.MODEL.RPN.IN_FEATURES = ["p2", "p3", "p4", "p5", "p6"]
    cfg.MODEL.RPN.PRE_NMS_TOPK_TEST, cfg.MODEL.RPN.POST_NMS_TOPK_TEST = 300, 60
    cfg.MODEL.ROI_HEADS.NAME = "StandardROIHeads"
    cfg.MODEL.ROI_HEADS.IN_FEATURES = ["p2", "p3", "p4", "p5"]
    cfg.MODEL.ROI_BOX_HEAD.NAME = "FastRCNNConvFCHead"
    cfg.MODEL.ROI_BOX_HEAD.NUM_FC, cfg.MODEL.ROI_BOX_HEAD.FC_DIM, cfg.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION = 2, 64, 7
    cfg.DATASETS.TEST = ("coco_2017_val",)
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = 96, 160
    return cfg


@pytest.fixture(scope="module")
def c4(tmp_path_factory):
    """(our detector, config file, checkpoint): a narrow C4 model and one random checkpoint for both."""
    pytest.importorskip("detectron2")
    from extract.detectron2_reference import detectron2_config

    root = tmp_path_factory.mktemp("c4")
    ours = Detector.build("d2-r101-c4", **NARROW_C4, **SELECTION)
    state = {k: torch.from_numpy(v) for k, v in randomized_state(ours, seed=3).items()}
    load_weights(ours, state)
    (root / "c4.yaml").write_text(detectron2_config(ours.cfg).dump())
    torch.save(state, root / "c4.pth")
    return ours, root / "c4.yaml", root / "c4.pth"


@pytest.fixture(scope="module")
def fpn(tmp_path_factory):
    """(config file, checkpoint) of a narrow FPN model with random non-trivial weights."""
    pytest.importorskip("detectron2")
    root = tmp_path_factory.mktemp("fpn")
    (root / "fpn.yaml").write_text(tiny_fpn_config().dump())
    model = build_extractor(f"d2:{root / 'fpn.yaml'}").model
    torch.save({k: torch.from_numpy(v) for k, v in randomized_state(model, seed=4).items()}, root / "fpn.pth")
    return root / "fpn.yaml", root / "fpn.pth"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("images"), 5)


def test_without_detectron2_the_error_says_it_is_optional(monkeypatch, images, tmp_path):
    for name in [n for n in sys.modules if n.startswith(("detectron2.", "extract.backends.detectron2"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "detectron2", None)  # `import detectron2` now fails as if absent
    expected = "d2:model.yaml: detectron2 is not installed; it is an optional backend, see docs/extraction.md"
    with pytest.raises(ConfigError, match=expected):
        build_extractor("d2:model.yaml")
    result = CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(tmp_path / "store"),
                                       "--detector", "d2:model.yaml", "--quiet"])
    assert result.exit_code == 2 and expected in result.output, result.output
    assert not (tmp_path / "store").exists()


def test_both_backends_are_region_extractors(c4):
    ours, config, weights = c4
    theirs = build_extractor(f"d2:{config}", weights=weights)
    assert isinstance(ours, RegionExtractor) and isinstance(theirs, RegionExtractor)
    assert (theirs.cfg.feature_dim, theirs.cfg.num_classes, theirs.cfg.num_attributes) == (256, 5, 0)
    assert theirs.cfg.pixel_mean == ours.cfg.pixel_mean and theirs.cfg.min_size == ours.cfg.min_size


def test_given_boxes_and_masked_variants_match_our_detector(c4):
    """Same weights, same C4 architecture: detectron2's pooling and res5 give our features."""
    ours, config, weights = c4
    theirs = build_extractor(f"d2:{config}", weights=weights)
    rgb = synthetic_image(HEIGHT, WIDTH, seed=1)
    prepared = ours.prepare(rgb)
    assert torch.equal(theirs.prepare(rgb).tensor, prepared.tensor)
    for masks in (None, [np.array([False, True, False, True])]):
        expected = ours.describe([prepared], [BOXES], masks)[0]
        region = theirs.describe([prepared], [BOXES], masks)[0]
        assert region.box_source == "given" and torch.equal(region.boxes, expected.boxes)
        torch.testing.assert_close(region.features, expected.features, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(region.image_feature, expected.image_feature, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(region.class_probs, expected.class_probs, rtol=1e-4, atol=1e-6)
        assert torch.equal(region.objects_id, expected.objects_id)
        assert region.attrs_id is None


def test_detection_matches_our_detector(c4):
    ours, config, weights = c4
    theirs = build_extractor(f"d2:{config}", weights=weights, overrides=SELECTION)
    prepared = ours.prepare(synthetic_image(HEIGHT, WIDTH, seed=2))
    expected, region = ours.detect([prepared])[0], theirs.detect([prepared])[0]
    assert region.box_source == "proposals" and len(region.boxes) == len(expected.boxes) >= SELECTION["min_boxes"]
    torch.testing.assert_close(region.boxes, expected.boxes, rtol=0, atol=1e-2)
    torch.testing.assert_close(region.features, expected.features, rtol=1e-4, atol=1e-2)
    assert torch.equal(region.objects_id, expected.objects_id)


@pytest.mark.parametrize("model", ["c4", "fpn"])
def test_detection_features_are_detectron2s_own(model, request):
    """Each kept box's feature and class probabilities are those detectron2's own forward pass
    gives the same proposal (read by a hook on its box predictor); the boxes are its proposals."""
    config, weights = request.getfixturevalue(model)[-2:]
    extractor = build_extractor(f"d2:{config}", weights=weights, overrides=SELECTION)
    rgb = synthetic_image(HEIGHT, WIDTH, seed=5)
    region = extractor.detect([extractor.prepare(rgb)])[0]

    seen = {}
    network = extractor.model
    hooks = [network.proposal_generator.register_forward_hook(lambda _, args, out: seen.update(proposals=out[0])),
             network.roi_heads.box_predictor.register_forward_hook(
                 lambda _, args, out: seen.update(features=args[0], logits=out[0]))]
    try:
        bgr = torch.from_numpy(np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))).float()
        with torch.no_grad():
            network.inference([{"image": bgr}], do_postprocess=False)
    finally:
        for hook in hooks:
            hook.remove()
    proposal_boxes = seen["proposals"][0].proposal_boxes.tensor
    rows = [int(torch.nonzero((proposal_boxes == box).all(dim=1))[0]) for box in region.boxes]
    assert len(set(rows)) == len(rows) >= SELECTION["min_boxes"]
    assert region.features.shape[1] == {"c4": 256, "fpn": 64}[model]
    torch.testing.assert_close(region.features, seen["features"][rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(region.class_probs, seen["logits"][rows].softmax(dim=1), rtol=1e-4, atol=1e-6)


def test_fpn_given_boxes_keep_order_and_mask_pixels_as_our_detector_does(fpn):
    config, weights = fpn
    extractor = build_extractor(f"d2:{config}", weights=weights)
    rgb = synthetic_image(80, 200, seed=6)  # resized to 64x160: boxes are scaled both ways
    prepared = extractor.prepare(rgb)
    boxes = torch.tensor([[150, 10, 199, 79], [0, 0, 40, 30], [20.5, 5, 300, 60]])  # the last is clamped
    region = extractor.describe([prepared], [boxes])[0]
    assert region.boxes.tolist() == [[150, 10, 199, 79], [0, 0, 40, 30], [20.5, 5, 200, 60]]
    assert region.features.shape == (3, 64) and (region.image_height, region.image_width) == (80, 200)
    reversed_order = extractor.describe([prepared], [boxes.flip(0)])[0]
    torch.testing.assert_close(reversed_order.features, region.features.flip(0))

    mask = np.array([False, True, False])
    masked = extractor.describe([prepared], [boxes], [mask])[0]
    by_hand = prepared.with_tensor(mask_pixels(prepared.tensor, prepared.to_input(region.boxes[1:2])))
    torch.testing.assert_close(masked.features, extractor.describe([by_hand], [boxes])[0].features)
    assert not torch.allclose(masked.features[1], region.features[1])


def test_the_job_writes_a_store_and_resumes_only_the_same_model(fpn, images, tmp_path):
    config, weights = fpn
    out = tmp_path / "store"
    result = CliRunner().invoke(main, ["extract", "--images", str(images), "--out", str(out), "--detector",
                                       f"d2:{config}", "--weights", str(weights), "--mask-variants", "2",
                                       "--mask-prob", "0.3", "--mask-seed", "7", "--quiet"])
    assert result.exit_code == 0, result.output
    assert verify_store(out).problems == []
    extractor = build_extractor(f"d2:{config}", weights=weights)
    with FeatureStore(out) as store:
        assert len(store) == 5 and [f["image"] for f in store.failures()] == ["notes.jpg"]
        meta = store.meta
        record = store["image0001"]
    assert meta["features"]["dim"] == 64 and meta["class_probs"]["num_classes"] == 81
    assert meta["attributes"] is False and "attrs_id" not in record
    assert meta["vocabulary"]["classes"][:2] == ["person", "bicycle"]
    detector = meta["detector"]
    assert detector["config"]["backend"] == "detectron2"
    assert detector["config"]["config_sha256"] == file_sha256(config)
    assert detector["checkpoint_sha256"] == file_sha256(weights)
    assert detector["config"]["detectron2_model"]["ROI_BOX_HEAD"]["FC_DIM"] == 64
    with configured_threads(1):  # as the job computes on the CPU: single-threaded ops
        regions = extractor.detect([extractor.prepare(load_image(images / "image0001.png"))])[0].numpy()
    np.testing.assert_array_equal(record["boxes"], regions["boxes"])
    np.testing.assert_array_equal(record["features"], regions["features"].astype(np.float16))
    assert record["masked_features"].shape == (2, len(regions["boxes"]), 64)

    rerun = run_extraction(ExtractionConfig(images, f"d2:{config}", weights=weights, progress=False, **MASKED), out)
    assert (rerun.skipped, rerun.written) == (5, 0)
    other_model = tmp_path / "other.yaml"
    other_model.write_text(config.read_text().replace("POST_NMS_TOPK_TEST: 60", "POST_NMS_TOPK_TEST: 50"))
    for change, match in [
        (dict(detector=f"d2:{other_model}"), "POST_NMS_TOPK_TEST"),
        (dict(overrides={"MODEL.RPN.POST_NMS_TOPK_TEST": "50"}), "POST_NMS_TOPK_TEST"),
        (dict(overrides={"score_thresh": 0.5}), "score_thresh"),
        (dict(weights=None), "checkpoint_sha256"),
    ]:
        arguments = dict(detector=f"d2:{config}", weights=weights) | change
        with pytest.raises(StoreMismatchError, match=match):
            run_extraction(ExtractionConfig(images, progress=False, **arguments, **MASKED), out)


def test_given_box_job_stores_the_boxes_in_order(fpn, images, tmp_path):
    config, weights = fpn
    boxes = {"image0000.png": [[30, 20, 60, 50], [1, 2, 20, 30]], "nested/image0003.png": [[5, 5, 40, 40]]}
    (tmp_path / "boxes.json").write_text(json.dumps(boxes))
    out = tmp_path / "store"
    summary = run_extraction(ExtractionConfig(images, f"d2:{config}", weights=weights, boxes=tmp_path / "boxes.json",
                                              progress=False), out)
    assert (summary.written, summary.failed) == (2, 0)
    with FeatureStore(out) as store:
        assert store.meta["mode"] == "given"
        for path, given in boxes.items():
            record = store[path.removesuffix(".png")]
            assert record["box_source"] == "given" and record["boxes"].tolist() == given
            assert record["features"].shape == (len(given), 64)


def test_bad_configs_and_weights_are_clear_errors(c4, fpn, tmp_path):
    config, weights = fpn
    unknown_key = tmp_path / "unknown.yaml"
    unknown_key.write_text("MODEL:\n  NOT_A_KEY: 1\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("MODEL: [unclosed\n")
    retinanet = tmp_path / "retinanet.yaml"
    retinanet.write_text("MODEL:\n  META_ARCHITECTURE: RetinaNet\n")  # its heads want p3-p7, a C4 has res4
    proposals_only = tmp_path / "proposals_only.yaml"
    proposals_only.write_text(config.read_text().replace("META_ARCHITECTURE: GeneralizedRCNN",
                                                         "META_ARCHITECTURE: ProposalNetwork"))
    cascade = tmp_path / "cascade.yaml"
    cascade.write_text(config.read_text().replace("NAME: StandardROIHeads", "NAME: CascadeROIHeads")
                       .replace("CLS_AGNOSTIC_BBOX_REG: false", "CLS_AGNOSTIC_BBOX_REG: true"))
    for detector, overrides, match in [
        (f"d2:{tmp_path / 'absent.yaml'}", {}, "absent.yaml: no such file"),
        (f"d2:{unknown_key}", {}, "unknown.yaml: detectron2 cannot load this config .*NOT_A_KEY"),
        (f"d2:{broken}", {}, "broken.yaml: detectron2 cannot load this config"),
        (f"d2:{retinanet}", {}, "retinanet.yaml: detectron2 cannot build its model"),
        (f"d2:{proposals_only}", {}, "ProposalNetwork .*needs a GeneralizedRCNN that makes its own proposals"),
        (f"d2:{cascade}", {}, "RoI heads CascadeROIHeads are not supported .*Res5ROIHeads, StandardROIHeads"),
        (f"d2:{config}", {"MODEL.NOT_A_KEY": "1"}, "override MODEL.NOT_A_KEY='1': neither a box selection field"),
        (f"d2:{config}", {"min_boxes": 0}, "min_boxes=0"),
        (f"d2:{config}", {"box_source": "regressed"}, "stores the pooled proposals"),
        (f"d2:{config}", {"INPUT.FORMAT": "L"}, "INPUT.FORMAT 'L'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            build_extractor(detector, overrides=overrides)
    with pytest.raises(CheckpointError, match="(?s)does not fit the detector.*179 missing key"):
        build_extractor(f"d2:{config}", weights=c4[2])
    shifted = tmp_path / "shifted_mean.pth"
    torch.save(torch.load(weights) | {"pixel_mean": torch.tensor([1.0, 2.0, 3.0])}, shifted)
    with pytest.raises(CheckpointError, match="pixel_mean in the checkpoint"):
        build_extractor(f"d2:{config}", weights=shifted)
    with_recorded_buffers = tmp_path / "with_buffers.pth"
    model = build_extractor(f"d2:{config}").model
    unsaved = {k: v for k, v in model.named_buffers() if k not in model.state_dict()}
    assert "proposal_generator.anchor_generator.cell_anchors.4" in unsaved
    torch.save(torch.load(weights) | unsaved, with_recorded_buffers)
    build_extractor(f"d2:{config}", weights=with_recorded_buffers)  # equal unsaved buffers are dropped
