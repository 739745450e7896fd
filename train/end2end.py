"""The end-to-end stage's visual side: the detector's trunk and res5 on the cached boxes, with gradients.

As the reference code tunes its Fast R-CNN: stem and res2 frozen, batch norm frozen (FrozenBN
everywhere), res3-res5 trained. The pixels of masked RoIs are zeroed on the fly before the CNN,
exactly as the cached masked-pixel variants were made.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from extract.detector import Detector
from extract.images import load_image
from extract.preprocess import mask_pixels

FROZEN_PREFIXES = ("backbone.stem.", "backbone.res2.", "proposal_generator.", "roi_heads.box_predictor.")


class EndToEndVisual(nn.Module):
    def __init__(self, detector: Detector, images_root: str | Path) -> None:
        super().__init__()
        self.detector = detector
        self.images_root = Path(images_root)
        for name, parameter in detector.named_parameters():
            parameter.requires_grad_(not name.startswith(FROZEN_PREFIXES))

    @classmethod
    def from_store_meta(cls, meta: dict, images_root: str | None, weights: str | None) -> "EndToEndVisual":
        """The detector that filled the FeatureStore: its recorded config, and its checkpoint unless
        `weights` names another (e.g. the Fast R-CNN of a converted official VL-BERT checkpoint:
        trunk and res5 only, which is all this stage uses)."""
        from extract.config import config_from_dict

        problem = cls.store_problem(meta, images_root)
        if problem is not None:
            raise ValueError(problem)
        detector_meta = meta["detector"]
        detector = Detector.build(config_from_dict(detector_meta["config"]))
        if weights or detector_meta.get("checkpoint"):
            detector.load_checkpoint(weights or detector_meta["checkpoint"], trunk_only=True)
        return cls(detector, images_root or meta["images_root"])

    @staticmethod
    def store_problem(meta: dict, images_root: str | None) -> str | None:
        """Why a FeatureStore with this meta.json cannot feed an end-to-end stage, or None."""
        if "config" not in (meta.get("detector") or {}):
            return "the FeatureStore records no detector config (imported?): end-to-end stages need one"
        if (images_root or meta.get("images_root")) is None:
            return "no images root: give `images` in the run config"
        return None

    def forward(self, batch: dict) -> torch.Tensor:
        """(B, N, D) appearance features recomputed for every sample's boxes (whole-image box first)."""
        appearance = torch.zeros_like(batch["appearance"])
        for i, image_file in enumerate(batch["image_files"]):
            count = int(batch["box_mask"][i].sum())
            if count == 0:
                continue
            image = self.detector.prepare(load_image(self.images_root / image_file))
            boxes = batch["boxes"][i, :count].to(image.tensor.device)
            masked = batch["masked_regions"][i, :count].to(boxes.device)
            if masked.any():
                image = image.with_tensor(mask_pixels(image.tensor, image.to_input(boxes[masked])))
            appearance[i, :count] = self.detector.box_features([image], [image.to_input(boxes)])[0]
        return appearance
