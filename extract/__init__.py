"""Extraction stage: the bottom-up-attention Faster R-CNN C4 detector and the jobs that run it."""

from extract.checkpoint import CheckpointError, load_weights, read_state_dict
from extract.config import PRESETS, ConfigError, DetectorConfig, load_config
from extract.detector import BoxError, Detector, RegionFeatures
from extract.device import DeviceError, check_device
from extract.images import ImageError, load_image
from extract.preprocess import PreparedImage, mask_pixels, prepare_image
from extract.selection import select_boxes

__all__ = [
    "PRESETS", "BoxError", "CheckpointError", "ConfigError", "Detector", "DetectorConfig", "DeviceError", "ImageError",
    "PreparedImage", "RegionFeatures", "check_device", "load_config", "load_image", "load_weights", "mask_pixels",
    "prepare_image", "read_state_dict", "select_boxes",
]
