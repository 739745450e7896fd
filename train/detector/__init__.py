"""Training the extraction detector (`extract.Detector`): losses, the loop and its evaluation."""

from train.detector.data import DetectionExample
from train.detector.evaluate import DetectionQuality, evaluate_detector
from train.detector.losses import LossConfig
from train.detector.loop import TrainConfig, train_detector

__all__ = ["DetectionExample", "DetectionQuality", "LossConfig", "TrainConfig", "evaluate_detector", "train_detector"]
