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
