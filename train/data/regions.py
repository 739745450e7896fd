"""Visual inputs of one image from the FeatureStore: the whole-image box first, then its RoIs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from extract.store.reader import FeatureStore
from extract.store.schema import (
    CLASS_FIELDS, REQUIRED_FIELDS, VARIANT_FIELDS, DamagedRecordError, Encoded, dense_class_probs, joined,
    sparse_class_probs,
)

MAX_REGIONS = 100  # RoIs per image, the whole-image box not counted


@dataclass
class Regions:
    """Arrays for N = 1 + RoIs elements; element 0 is the whole image."""

    # (N, D) as stored: float16 or float32, widened on the device; a q8 store's as float32, or as its
    # `Encoded` parts (8-bit codes and two float32 a row) where the bank reads `encoded`: decoded on the device
    appearance: np.ndarray | Encoded
    boxes: np.ndarray  # (N, 4) float32, original pixels
    image_size: tuple[int, int]  # (width, height)
    # (N, C) detector class distributions (row 0 all zero: never a target), float32; a top-k store's as
    # its `Encoded` parts (class ids and probabilities, N × k) where the bank reads `encoded`
    class_probs: np.ndarray | Encoded | None
    variant_masks: np.ndarray | None  # (K, N) bool: RoIs whose pixels each cached variant masked (K = 1: one read)
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


def predicted_rows(class_probs: np.ndarray | Encoded, predicted: np.ndarray) -> np.ndarray | Encoded:
    """The class distributions times `predicted` (N,), row by row: zero rows for the RoIs not predicted.
    Sparse ones (`Encoded`) multiply their probabilities alone, which gives the dense product's bits."""
    if isinstance(class_probs, Encoded):
        return class_probs.with_parts({**class_probs.parts, "probs": class_probs.parts["probs"] * predicted[:, None]})
    return class_probs * predicted[:, None]


class RegionBank:
    """Reads records lazily, so a Dataset holding it can be forked into DataLoader workers.
    `encoded`: features stored in an encoding (q8) come as their parts, and a top-k store's class
    distributions as its ids and probabilities, which training carries to its device and decodes there
    (`train.data.collate.to_device`): a quarter of float32's bytes to copy; k of C classes' (10 of 1601)."""

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

    def get(self, image_id: str, class_probs: bool = False, variants: bool = False,
            variant: int | None = None) -> Regions:
        """The image's regions; pre-training asks for the class distributions (masked-RoI targets)
        and, when pixel-masked, the variants (`variant`: that one alone, `variant_masks` then one row):
        only the fields asked for are decoded (the boxes and features, which every record holds, and
        those), so fine-tuning never decodes the variants."""
        variants = variants or variant is not None
        record = self.store.decoded(image_id, fields=REQUIRED_FIELDS + (CLASS_FIELDS if class_probs else ())
                                    + (VARIANT_FIELDS if variants else ()), variant=variant)
        n = min(len(record["boxes"]), self.max_regions)
        height, width = int(record["image_h"]), int(record["image_w"])
        whole_box = np.array([[0, 0, width, height]], dtype=np.float32)
        targets = None
        if class_probs and self.num_classes is not None:
            targets = self._class_targets(image_id, record, n)
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

    def _class_targets(self, image_id: str, record: dict, n: int) -> np.ndarray | Encoded:
        """The first `n` RoIs' class distributions after a zero row for the whole image."""
        if not (self.encoded and "class_topk_id" in record):
            dense = dense_class_probs(record, self.num_classes)[:n]
            return np.concatenate([np.zeros((1, dense.shape[1]), np.float32), dense])
        try:
            sparse = sparse_class_probs(record, self.num_classes)[:n]
        except ValueError as exc:
            raise DamagedRecordError(f"{self.root}: record {image_id!r} is damaged: {exc}", image_id) from None
        return joined([sparse.with_parts({k: np.zeros((1, *v.shape[1:]), v.dtype) for k, v in sparse.parts.items()}),
                       sparse])

    def __getstate__(self) -> dict:
        return {"root": self.root, "max_regions": self.max_regions, "encoded": self.encoded, "_store": None}
