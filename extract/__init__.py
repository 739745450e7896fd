"""Extraction stage: the bottom-up-attention Faster R-CNN C4 detector and the jobs that run it.

The names below load their module on first use, so that importing a light part (`extract.images`)
does not import torch and the detector."""

import importlib

_EXPORTS = {
    "CheckpointError": "extract.checkpoint", "load_weights": "extract.checkpoint", "read_state_dict": "extract.checkpoint",
    "ConfigError": "extract.config", "DetectorConfig": "extract.config",
    "PRESETS": "extract.presets", "load_config": "extract.presets",
    "BoxError": "extract.detector", "Detector": "extract.detector", "RegionFeatures": "extract.detector",
    "DeviceError": "vlbert.utils.device", "check_device": "vlbert.utils.device",
    "ImageError": "extract.images", "load_image": "extract.images",
    "PreparedImage": "extract.preprocess", "mask_pixels": "extract.preprocess", "prepare_image": "extract.preprocess",
    "select_boxes": "extract.selection",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'extract' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
