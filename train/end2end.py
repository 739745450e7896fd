"""The end-to-end stage's visual side: the detector's trunk and res5 on the cached boxes, with gradients.

As the reference code tunes its Fast R-CNN: stem and res2 frozen, batch norm frozen (FrozenBN
everywhere), res3-res5 trained. The pixels of masked RoIs are zeroed on the fly before the CNN,
exactly as the cached masked-pixel variants were made.

Images are decoded where samples are made (`WithImages`: in the DataLoader's worker processes);
the forward pass only resizes and normalises them on the detector's device, as the extraction
job does, so the recomputed features are the extracted ones.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from extract.detector import Detector
from extract.images import ImageError, load_image
from extract.preprocess import PreparedImage, mask_pixels
from train.data.datasets import DamagedSample, Sample, SampleGroup

FROZEN_PREFIXES = ("backbone.stem.", "backbone.res2.", "proposal_generator.", "roi_heads.box_predictor.")


class EndToEndVisual(nn.Module):
    """`batch_images`: run all of a batch's images through the detector in one call (the trunk then
    takes the images of one input size together, res5 every RoI at once); None (the default) does
    so on CUDA only. On the CPU images go one per call: a call over the whole batch computes the
    same features but sums res5's weight gradients in another order (final weights then differ by
    ~2e-7), and the one-image order keeps training bitwise reproducible there."""

    def __init__(self, detector: Detector, images_root: str | Path, batch_images: bool | None = None) -> None:
        super().__init__()
        self.detector = detector
        self.images_root = Path(images_root)
        self.batch_images = batch_images
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
        detector = meta.get("detector") or {}
        if "config" not in detector:
            return "the FeatureStore records no detector config (imported?): end-to-end stages need one"
        if str(detector.get("source", "")).startswith("d2:"):
            return (f"the FeatureStore was extracted by the detectron2 backend ({detector['source']}): end-to-end "
                    "stages tune our own detector; extract with a preset or our YAML config for them")
        if (images_root or meta.get("images_root")) is None:
            return "no images root: give `images` in the run config"
        return None

    def with_images(self, dataset: Dataset) -> "WithImages":
        return WithImages(dataset, self.images_root)

    def forward(self, batch: dict) -> torch.Tensor:
        """(B, N, D) appearance features recomputed for every sample's boxes (whole-image box first).

        `batch["images"]` holds the pixels decoded with the samples; a sample without them (a batch
        collated from a dataset not wrapped by `with_images`, or an image its worker could not
        read) is read here, where an unreadable image raises ImageError as it always has."""
        cached = batch["appearance"]
        appearance = torch.zeros(cached.shape, dtype=torch.float32, device=cached.device)  # the cache may hold float16
        rows, images, boxes, alike = self._detector_inputs(batch)
        if not rows:  # text-only samples
            return appearance
        passes = sorted(set(alike))
        if self.batches_images():
            computed = self.detector.box_features([images[k] for k in passes], [boxes[k] for k in passes])
        else:
            computed = [self.detector.box_features([images[k]], [boxes[k]])[0] for k in passes]
        features = dict(zip(passes, computed))
        for i, source in zip(rows, alike):
            f = features[source]
            appearance[i, : len(f)] = f
        return appearance

    def batches_images(self) -> bool:
        return self.detector.device.type == "cuda" if self.batch_images is None else self.batch_images

    def _detector_inputs(self, batch: dict) -> tuple[list[int], list[PreparedImage], list[torch.Tensor], list[int]]:
        """(the batch rows with boxes, their prepared images with masked RoIs' pixels zeroed, their
        boxes in input pixels, and for each of them the position among them of the one whose detector
        pass it takes: its own, or, without gradients, the first showing the same image file with the
        same boxes and no masked RoI, as a VQA image's questions do. Training keeps a pass per row, so
        its gradients sum as they always have. One host sync for the whole batch: how many boxes each
        row has and whether any is masked (and, to compare them, the boxes when passes are shared)."""
        masked = batch["masked_regions"].bool() & batch["box_mask"].bool()
        counts, any_masked = torch.stack((batch["box_mask"].sum(1), masked.any(1).long())).tolist()
        pixels = batch.get("images") or [None] * len(batch["image_files"])
        host_boxes = None if torch.is_grad_enabled() else batch["boxes"].cpu()
        rows, images, boxes, alike = [], [], [], []
        shown: dict[tuple, int] = {}  # (image file, its boxes) → the position of the first unmasked row of them
        for i, (decoded, image_file, count) in enumerate(zip(pixels, batch["image_files"], counts)):
            if count == 0:
                continue
            key = None if host_boxes is None or any_masked[i] else (image_file, host_boxes[i, :count].numpy().tobytes())
            if key in shown:  # no need to read or prepare its image again
                alike.append(shown[key])
                rows.append(i)
                images.append(images[shown[key]])
                boxes.append(boxes[shown[key]])
                continue
            image = self.detector.prepare(load_image(self.images_root / image_file) if decoded is None else decoded)
            input_boxes = image.to_input(batch["boxes"][i, :count])
            if any_masked[i]:
                image = image.with_tensor(mask_pixels(image.tensor, input_boxes, masked[i, :count]))
            if key is not None:
                shown[key] = len(rows)
            alike.append(len(rows))
            rows.append(i)
            images.append(image)
            boxes.append(input_boxes)
        return rows, images, boxes, alike


def with_appearance(visual: EndToEndVisual | None, inputs: dict, pixels: dict[str, list]) -> dict:
    """`inputs` with the appearance features that the end-to-end `visual` side recomputes from the
    batch's `pixels` entries (train.data.collate.pixel_entries); as they are for cached features."""
    if visual is None or "appearance" not in inputs:
        return inputs
    return {**inputs, "appearance": visual({**inputs, **pixels})}


class WithImages(Dataset):
    """`dataset`, whose samples with regions also carry their image's decoded pixels, read where the
    sample is made: in the DataLoader's worker processes when it has any. Only end-to-end stages
    wrap their datasets, so stages on cached features never read an image.

    An image that cannot be read is left out (`image` None): the forward pass reads it again in the
    training process and raises its ImageError there, as one line rather than a worker's traceback.
    """

    def __init__(self, dataset: Dataset, images_root: Path) -> None:
        self.dataset, self.images_root = dataset, images_root

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __getitem__(self, index: int) -> Sample | SampleGroup | DamagedSample:
        made = self.dataset[index]
        samples = made.samples if isinstance(made, SampleGroup) else [made] if isinstance(made, Sample) else []
        for sample in samples:
            if sample.regions is not None and sample.image_file is not None:
                try:
                    sample.image = load_image(self.images_root / sample.image_file)
                except ImageError:
                    pass  # raised in the training process by the forward pass, which reads it again
        return made
