"""The end-to-end stage's visual side: one detector call per batch (the CUDA default) against one per
image (the CPU's), masked RoIs' pixels, and rows without regions."""

import numpy as np
import pytest
import torch

from extract import Detector
from extract.preprocess import mask_pixels
from train.end2end import EndToEndVisual

SIZES = ((96, 128), (128, 96), (96, 128))  # (height, width): two input sizes, one of them twice


def make_batch(feature_dim: int, seed: int = 0) -> dict:
    """Three images with 4 boxes each (whole image first), some masked, and a text-only row last."""
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]
    boxes = torch.zeros(len(SIZES) + 1, 4, 4)
    for i, (h, w) in enumerate(SIZES):
        corners = np.sort(rng.uniform(0, 1, (3, 2, 2)), axis=1) * [w, h]
        boxes[i, 0] = torch.tensor([0.0, 0.0, w, h])
        boxes[i, 1:] = torch.from_numpy(corners.reshape(3, 4)).float()  # x1, y1, x2, y2
    box_mask = torch.ones(len(SIZES) + 1, 4, dtype=torch.bool)
    box_mask[-1] = False
    masked = torch.tensor([[False, True, False, False], [False, False, False, False],
                           [False, False, True, True], [False, False, False, False]])
    return dict(appearance=torch.zeros(len(SIZES) + 1, 4, feature_dim), boxes=boxes, box_mask=box_mask,
                masked_regions=masked, images=images + [None], image_files=["a.jpg", "b.jpg", "c.jpg", None])


@pytest.fixture
def detector():
    torch.manual_seed(0)
    return Detector.build("tiny")


def features_and_gradients(visual: EndToEndVisual, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    visual.zero_grad(set_to_none=True)
    features = visual(batch)
    features.pow(2).sum().backward()
    return features.detach(), {name: p.grad for name, p in visual.named_parameters() if p.grad is not None}


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, relative: float, name: str = "",
                          absolute: float = 0.0) -> None:
    """Differences small against the tensor's largest value (summing in another order moves
    near-zero entries by as much as large ones), or within `absolute` (for what should be 0)."""
    difference, scale = (actual - expected).abs().max().item(), expected.abs().max().item()
    assert difference <= relative * scale + absolute, f"{name}: differs by {difference:.3g}, largest value {scale:.3g}"


def assert_batched_matches_per_image(detector: Detector, batched_visual: EndToEndVisual, batch: dict,
                                     relative: float) -> None:
    per_image_visual = EndToEndVisual(detector, ".", batch_images=False)
    batched, batched_gradients = features_and_gradients(batched_visual, batch)
    per_image, per_image_gradients = features_and_gradients(per_image_visual, batch)
    assert_close_to_scale(batched, per_image, relative, "features")
    assert batched_gradients.keys() == per_image_gradients.keys() and batched_gradients
    for name, gradient in per_image_gradients.items():
        assert_close_to_scale(batched_gradients[name], gradient, relative, name)


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
