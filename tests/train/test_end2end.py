"""The end-to-end stage's visual side: one detector call per batch (the CUDA default) against one per
image (the CPU's), masked RoIs' pixels, and rows without regions."""

import pytest
import torch

from extract import Detector
from extract.preprocess import mask_pixels
from tests.helpers.end2end import assert_batched_matches_per_image, make_batch
from train.end2end import EndToEndVisual

@pytest.fixture
def detector():
    torch.manual_seed(0)
    return Detector.build("tiny")


def test_one_call_per_batch_gives_the_features_and_gradients_of_one_call_per_image(detector):
    batched_visual = EndToEndVisual(detector, ".", batch_images=True)
    assert_batched_matches_per_image(detector, batched_visual, make_batch(detector.cfg.feature_dim), 1e-5)


def test_images_go_one_per_call_on_the_cpu_unless_asked(detector):
    assert not EndToEndVisual(detector, ".").batches_images()
    assert EndToEndVisual(detector, ".", batch_images=True).batches_images()


@pytest.mark.parametrize("batch_images", [False, True])
def test_masked_rois_pixels_are_zeroed_before_the_cnn(detector, batch_images):
    batch = make_batch(detector.cfg.feature_dim)
    with torch.no_grad():
        features = EndToEndVisual(detector, ".", batch_images=batch_images)(batch)
        for i, decoded in enumerate(batch["images"][:-1]):
            image = detector.prepare(decoded)
            boxes = image.to_input(batch["boxes"][i])
            masked = image.with_tensor(mask_pixels(image.tensor, boxes[batch["masked_regions"][i]]))
            expected = detector.box_features([masked], [boxes])[0]
            torch.testing.assert_close(features[i], expected, rtol=1e-5, atol=1e-6)
            if batch["masked_regions"][i].any():
                assert not torch.allclose(expected, detector.box_features([image], [boxes])[0])


def test_rows_without_regions_get_zeros_and_features_stay_float32_over_a_float16_cache(detector):
    batch = make_batch(detector.cfg.feature_dim)
    batch["appearance"] = batch["appearance"].half()
    with torch.no_grad():
        features = EndToEndVisual(detector, ".")(batch)
    assert features.dtype == torch.float32 and features[:-1].abs().sum() > 0 and (features[-1] == 0).all()
    text_only = {**batch, "box_mask": torch.zeros_like(batch["box_mask"])}
    with torch.no_grad():
        assert (EndToEndVisual(detector, ".")(text_only) == 0).all()


def _questions_of_one_image(feature_dim: int) -> dict:
    """make_batch's rows with the first image shown three times: twice unmasked with its own boxes (two
    questions about it), once with a RoI masked; then the others."""
    batch = make_batch(feature_dim)
    unmasked = torch.zeros(4, dtype=torch.bool)
    repeat = [0, 0, 0, 1, 2, 3]
    shared = {key: batch[key][repeat] for key in ("appearance", "boxes", "box_mask", "masked_regions")}
    shared["masked_regions"][0] = unmasked
    shared["masked_regions"][1] = unmasked
    shared["masked_regions"][2, 2] = True
    return {**shared, "images": [batch["images"][i] for i in repeat],
            "image_files": [batch["image_files"][i] for i in repeat]}


@pytest.mark.parametrize("batch_images", [False, True])
def test_without_gradients_the_questions_of_one_image_share_a_detector_pass(detector, batch_images, monkeypatch):
    batch = _questions_of_one_image(detector.cfg.feature_dim)
    visual = EndToEndVisual(detector, ".", batch_images=batch_images)
    passes = []
    box_features = detector.box_features
    monkeypatch.setattr(detector, "box_features",
                        lambda images, boxes: passes.extend(boxes) or box_features(images, boxes))
    with torch.no_grad():
        shared = visual(batch)
    assert len(passes) == 4  # the first image unmasked, masked, and the two others
    expected = []
    for i in range(5):
        image = detector.prepare(batch["images"][i])
        boxes = image.to_input(batch["boxes"][i])
        if batch["masked_regions"][i].any():
            image = image.with_tensor(mask_pixels(image.tensor, boxes, batch["masked_regions"][i]))
        with torch.no_grad():
            expected.append(box_features([image], [boxes])[0])
    if batch_images:
        torch.testing.assert_close(shared[:5], torch.stack(expected), rtol=1e-5, atol=1e-6)
    else:  # one image per call on the CPU: the very features of a pass per row
        assert torch.equal(shared[:5], torch.stack(expected))
    assert torch.equal(shared[0], shared[1]) and not torch.equal(shared[0], shared[2]) and (shared[5] == 0).all()
    passes.clear()
    visual(batch).sum().backward()  # training: a pass per row, as always
    assert len(passes) == 5
