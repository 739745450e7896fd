"""Extraction backends: what the batch job needs from a model, and which backend builds it.

`--detector` picks the backend by prefix: `d2:CONFIG.yaml` runs a detectron2 model through
detectron2 itself (optional, imported only when asked for); anything else is our detector
(a preset or one of its YAML files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from extract.config import ConfigError
from extract.detector import Detector, RegionFeatures
from extract.modeling.res5_layouts import DEFAULT_RES5_LAYOUT, Res5LayoutError
from extract.modeling.speed_paths import SpeedPathError
from extract.preprocess import PreparedImage
from vlbert.utils.precision import PrecisionError, precision as find_precision


@runtime_checkable
class ExtractorConfig(Protocol):
    """The config fields the job, the store's meta.json and `prepare_image` read."""

    name: str
    num_classes: int  # foreground classes; class_probs add background as the last column
    num_attributes: int  # 0: no attribute predictions
    class_names: tuple[str, ...]
    attribute_names: tuple[str, ...]
    box_source: str
    # Input preparation (`extract.preprocess.prepare_image(image, cfg, device)`).
    input_format: str
    pixel_mean: tuple[float, float, float]
    pixel_std: tuple[float, float, float]
    min_size: int
    max_size: int

    @property
    def feature_dim(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class RegionExtractor(Protocol):
    """A model the extraction job can run; `extract.Detector` and the detectron2 backend are two.

    `prepare` is `prepare_image(image, cfg, device)`, so images may equally be prepared elsewhere
    (on the CPU, in worker processes): `detect` and `describe` move inputs to the model's device.
    Boxes are xyxy in original-image pixels; `describe` keeps the caller's order and clamps to the
    image; `pixel_masks[i]` (N_i,) bool picks boxes whose pixels are set to the mean colour
    before the CNN runs. Every RegionFeatures holds the whole-image box's feature too.
    """

    cfg: ExtractorConfig

    def prepare(self, image: np.ndarray) -> PreparedImage: ...

    def detect(self, images: Sequence[PreparedImage]) -> list[RegionFeatures]: ...

    def describe(self, images: Sequence[PreparedImage], boxes: Sequence[torch.Tensor | np.ndarray],
                 pixel_masks: Sequence[torch.Tensor | np.ndarray | None] | None = None) -> list[RegionFeatures]: ...


@dataclass(frozen=True)
class Backend:
    prefix: str  # of the --detector value; "" matches anything
    # (the --detector value without the prefix, weights, device, overrides, precision, res5 layout, speed paths)
    # → the model
    build: Callable[[str, str | Path | None, str, Mapping[str, Any], str, str, Collection[str]], RegionExtractor]


def _build_native(spec: str, weights: str | Path | None, device: str, overrides: Mapping[str, Any],
                  precision: str, res5_layout: str, speed_paths: Collection[str]) -> Detector:
    return Detector.build(spec, weights=weights, device=device, precision=precision, res5_layout=res5_layout,
                          speed_paths=speed_paths, **overrides)


def _build_detectron2(spec: str, weights: str | Path | None, device: str, overrides: Mapping[str, Any],
                      precision: str, res5_layout: str, speed_paths: Collection[str]) -> RegionExtractor:
    find_precision(precision)
    if precision != "fp32":
        raise PrecisionError(f"--detector d2:{spec}: the detectron2 backend runs in fp32 only, not {precision}")
    if res5_layout != DEFAULT_RES5_LAYOUT:
        raise Res5LayoutError(f"--detector d2:{spec}: the detectron2 backend runs res5 as built "
                              f"({DEFAULT_RES5_LAYOUT}) only, not {res5_layout}")
    if speed_paths:
        raise SpeedPathError(f"--detector d2:{spec}: the detectron2 backend takes no speed paths, not "
                             f"{', '.join(sorted(speed_paths))}")
    try:
        from extract.backends.detectron2 import Detectron2Extractor
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "detectron2":
            raise ConfigError(f"--detector d2:{spec}: detectron2 is installed but does not import ({exc})") from None
        raise ConfigError(f"--detector d2:{spec}: detectron2 is not installed; it is an optional backend, "
                          "see docs/extraction.md") from None
    return Detectron2Extractor.build(spec, weights=weights, device=device, overrides=overrides)


# Tried in order: the first backend whose prefix starts the --detector value builds the model.
BACKENDS = (
    Backend("d2:", _build_detectron2),  # any detectron2 model, run by detectron2 (optional)
    Backend("", _build_native),  # our detector: a preset or our YAML config
)


def build_extractor(detector: str, weights: str | Path | None = None, device: str = "cpu",
                    overrides: Mapping[str, Any] | None = None, precision: str = "fp32",
                    res5_layout: str = DEFAULT_RES5_LAYOUT, speed_paths: Collection[str] = ()) -> RegionExtractor:
    """The model for a --detector value: `d2:CONFIG.yaml`, a preset name, or our YAML config, whose
    forwards run in `precision` (`vlbert.utils.precision.PRECISIONS`; refused, as PrecisionError,
    where the device or the backend cannot run it) with res5 run in `res5_layout`
    (`extract.modeling.res5_layouts.RES5_LAYOUTS`; refused, as Res5LayoutError, where the detector's res5
    cannot run so), taking `speed_paths` (`extract.modeling.speed_paths.SPEED_PATHS`; refused, as
    SpeedPathError, where one does not apply or the backend has none)."""
    backend = next(b for b in BACKENDS if detector.startswith(b.prefix))
    return backend.build(detector[len(backend.prefix):], weights, device, dict(overrides or {}), precision, res5_layout,
                         speed_paths)
