"""The detector training run's settings: the loop's schedule and the losses' sampling."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LossConfig:
    rpn_negative_below: float = 0.3
    rpn_positive_from: float = 0.7
    rpn_samples_per_image: int = 256
    rpn_positive_fraction: float = 0.5
    roi_foreground_from: float = 0.5
    # detectron2 samples 512; small images with a few objects need far fewer, and res5 per RoI is the cost.
    roi_samples_per_image: int = 32
    roi_positive_fraction: float = 0.25


@dataclass(frozen=True)
class TrainConfig:
    # The demo detector's run: about 10 minutes on one CPU thread. Shapes of small objects are learnt
    # last: val class accuracy was 0.54 after 6000 steps, 0.74 after 12000.
    steps: int = 12000
    images_per_step: int = 2
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 100
    max_grad_norm: float = 10.0
    flip: bool = True
    seed: int = 0
    log_every: int = 100
    losses: LossConfig = field(default_factory=LossConfig)
