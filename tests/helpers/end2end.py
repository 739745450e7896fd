"""Batches and checks for the end-to-end stage's visual side (train/end2end.py)."""

import numpy as np
import torch

from extract import Detector
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
