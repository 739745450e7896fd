"""Visual inputs of one image from the FeatureStore: the whole-image box first, then its RoIs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from extract.store.reader import FeatureStore
from extract.store.schema import CLASS_FIELDS, REQUIRED_FIELDS, VARIANT_FIELDS, Encoded, dense_class_probs, joined

MAX_REGIONS = 100  # RoIs per image, the whole-image box not counted


@dataclass
class Regions:
    """Arrays for N = 1 + RoIs elements; element 0 is the whole image."""

    # (N, D) as stored: float16 or float32, widened on the device; a q8 store's as float32, or as its
    # `Encoded` parts (8-bit codes and two float32 a row) where the bank reads `encoded`: decoded on the device
    appearance: np.ndarray | Encoded
    boxes: np.ndarray  # (N, 4) float32, original pixels
    image_size: tuple[int, int]  # (width, height)
    class_probs: np.ndarray | None  # (N, C) detector class distributions (row 0 all zero: never a target)
    variant_masks: np.ndarray | None  # (K, N) bool: RoIs whose pixels each cached variant masked
    variant_appearance: np.ndarray | Encoded | None  # (K, N, D), as `appearance`

    def __len__(self) -> int:
        return len(self.boxes)

    def truncated(self, count: int) -> "Regions":
        """The first `count` elements (boxes are stored best first)."""
        return Regions(
            self.appearance[:count], self.boxes[:count], self.image_size,
            None if self.class_probs is None else self.class_probs[:count],
            None if self.variant_masks is None else self.variant_masks[:, :count],
            None if self.variant_appearance is None else self.variant_appearance[:, :count],
        )


class RegionBank:
    """Reads records lazily, so a Dataset holding it can be forked into DataLoader workers.
    `encoded`: features stored in an encoding (q8) come as their parts, which training carries to its
    device and decodes there (`train.data.collate.to_device`): a quarter of float32's bytes to copy."""

    def __init__(self, root: str, max_regions: int = MAX_REGIONS, encoded: bool = False) -> None:
        self.root = str(root)
        self.max_regions = max_regions
        self.encoded = encoded
        self._store: FeatureStore | None = None

    @property
    def store(self) -> FeatureStore:
        if self._store is None:
            self._store = FeatureStore(self.root, encoded=self.encoded)
        return self._store

    @property
    def feature_dim(self) -> int:
        return int(self.store.meta["features"]["dim"])

    @property
    def num_classes(self) -> int | None:
        class_probs = self.store.meta.get("class_probs")
        return None if not class_probs else int(class_probs["num_classes"])

    @property
    def num_variants(self) -> int:
        return int(self.store.meta["mask_variants"]["count"])

    def count(self, image_id: str) -> int:
        """The elements `get` gives for the image (the whole image and its RoIs), without reading them."""
        return min(self.store.box_count(image_id), self.max_regions) + 1

    def __contains__(self, image_id: str) -> bool:
        return image_id in self.store

    def __getitem__(self, image_id: str) -> Regions:
        return self.get(image_id)

    def get(self, image_id: str, class_probs: bool = False, variants: bool = False) -> Regions:
        """The image's regions; pre-training asks for the class distributions (masked-RoI targets)
        and, when pixel-masked, the variants: only the fields asked for are decoded (the boxes and
        features, which every record holds, and those), so fine-tuning never decodes the variants."""
        record = self.store.decoded(image_id, fields=REQUIRED_FIELDS + (CLASS_FIELDS if class_probs else ())
                                    + (VARIANT_FIELDS if variants else ()))
        n = min(len(record["boxes"]), self.max_regions)
        height, width = int(record["image_h"]), int(record["image_w"])
        whole_box = np.array([[0, 0, width, height]], dtype=np.float32)
        targets = None
        if class_probs and self.num_classes is not None:
            dense = dense_class_probs(record, self.num_classes)[:n]
            targets = np.concatenate([np.zeros((1, dense.shape[1]), np.float32), dense])
        masks = appearance = None
        if variants and "mask_boxes" in record:
            masks = np.concatenate([np.zeros((len(record["mask_boxes"]), 1), bool), record["mask_boxes"][:, :n]], 1)
            appearance = joined([record["masked_image_feature"][:, None], record["masked_features"][:, :n]], 1)
        return Regions(
            appearance=joined([record["image_feature"][None], record["features"][:n]]),
            boxes=np.concatenate([whole_box, record["boxes"][:n]]).astype(np.float32, copy=False),
            image_size=(width, height),
            class_probs=targets,
            variant_masks=masks,
            variant_appearance=appearance,
        )

    def __getstate__(self) -> dict:
        return {"root": self.root, "max_regions": self.max_regions, "encoded": self.encoded, "_store": None}
