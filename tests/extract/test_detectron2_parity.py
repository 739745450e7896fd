"""Parity with detectron2 for the same weights: features of given boxes and their argmax class.

Runs where detectron2 is importable and skips elsewhere. For `butd-vg`, the reference is upstream
detectron2 with the caffe stem and the dilated res5 patched in (extract/detectron2_reference.py).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from extract import Detector, load_weights
from extract.synthetic import synthetic_image
from tests.helpers.detection import randomized_state

pytest.importorskip("detectron2")
from detectron2.structures import Boxes  # noqa: E402
from extract.detectron2_reference import detectron2_model  # noqa: E402

HEIGHT, WIDTH = 320, 480  # already at the test size: neither side resizes it


def same_weights(preset: str, seed: int):
    """Our detector and detectron2's, both holding one random checkpoint (every detectron2 key in it)."""
    ours = Detector.build(preset, min_size=HEIGHT, max_size=1000)
    theirs = detectron2_model(ours.cfg)
    state = {k: torch.from_numpy(v) for k, v in randomized_state(ours, seed=seed).items()}
    load_weights(ours, state)
    theirs_keys = set(theirs.state_dict())
    assert theirs_keys <= set(state), sorted(theirs_keys - set(state))[:10]
    theirs.load_state_dict({k: v for k, v in state.items() if k in theirs_keys}, strict=True)
    return ours, theirs


def detectron2_input(rgb: np.ndarray) -> list[dict]:
    return [{"image": torch.from_numpy(np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))).float()}]


@pytest.mark.parametrize("preset", ["d2-r101-c4", "butd-vg", "vinvl-x152c4"])  # the last: ResNeXt C4
def test_given_box_features_match_detectron2(preset):
    ours, theirs = same_weights(preset, seed=7)
    rgb = synthetic_image(HEIGHT, WIDTH, seed=11)
    boxes = torch.tensor([[0, 0, 479, 319], [20.5, 30.25, 200, 180], [300, 100, 470, 310], [64, 64, 96, 80.0]])
    region = ours.describe([ours.prepare(rgb)], [boxes])[0]

    with torch.no_grad():
        images = theirs.preprocess_image(detectron2_input(rgb))
        assert tuple(images.tensor.shape[-2:]) == (HEIGHT, WIDTH)
        res4 = theirs.backbone(images.tensor)["res4"]
        expected = theirs.roi_heads._shared_roi_transform([res4], [Boxes(boxes)]).mean(dim=(2, 3))
        expected_classes = theirs.roi_heads.box_predictor(expected)[0][:, :-1].argmax(dim=1)

    stored = region.features.half().float()  # what the FeatureStore keeps by default
    cosine = F.cosine_similarity(stored, expected, dim=1)
    relative_l2 = (stored - expected).norm(dim=1) / expected.norm(dim=1)
    assert cosine.min() >= 0.9999, cosine
    assert relative_l2.max() <= 2e-3, relative_l2
    assert torch.equal(region.objects_id, expected_classes)


@pytest.mark.parametrize("preset", ["d2-r101-c4", "butd-vg"])
def test_proposals_match_detectron2(preset):
    ours, theirs = same_weights(preset, seed=8)
    rgb = synthetic_image(HEIGHT, WIDTH, seed=12)
    with torch.no_grad():
        image = ours.prepare(rgb)
        res4 = ours.backbone(image.tensor[None])
        boxes, logits = ours.proposal_generator(res4, (HEIGHT, WIDTH))
        images = theirs.preprocess_image(detectron2_input(rgb))
        expected = theirs.proposal_generator(images, {"res4": res4}, None)[0][0]
    assert len(boxes) == len(expected) > 50
    assert torch.allclose(boxes, expected.proposal_boxes.tensor, atol=1e-3)
    assert torch.allclose(logits, expected.objectness_logits, atol=1e-4)
