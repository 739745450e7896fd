"""The detector training loop: joint RPN and box-head training (detectron2's end-to-end recipe)."""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import torch

from extract import Detector
from extract.training.config import LossConfig, TrainConfig
from extract.training.data import DetectionExample
from extract.training.losses import ImageTargets, box_head_losses, rpn_losses, sample_rois



def _schedule(config: TrainConfig) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to zero."""
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return factor


def _batches(examples: Sequence[DetectionExample], config: TrainConfig, generator: torch.Generator):
    """Endless batches: epochs in a seeded order, each image mirrored with probability 1/2."""
    if len(examples) < config.images_per_step:
        raise ValueError(f"{len(examples)} training images, fewer than images_per_step={config.images_per_step}")
    while True:
        order = torch.randperm(len(examples), generator=generator).tolist()
        for start in range(0, len(order) - config.images_per_step + 1, config.images_per_step):
            batch = []
            for i in order[start:start + config.images_per_step]:
                mirror = config.flip and torch.rand((), generator=generator).item() < 0.5
                batch.append(examples[i].flipped() if mirror else examples[i])
            yield batch


def training_step(det: Detector, batch: Sequence[DetectionExample], config: LossConfig,
                  generator: torch.Generator) -> dict[str, torch.Tensor]:
    """All losses of one batch, each averaged over its images (RPN) or RoIs (box head)."""
    images = [det.prepare(example.image) for example in batch]
    targets = [ImageTargets.of(example, image) for example, image in zip(batch, images)]
    res4 = det.feature_maps(images)
    losses: dict[str, torch.Tensor] = {}
    for features, target in zip(res4, targets):
        for name, value in rpn_losses(det, features, target, config, generator).items():
            losses[name] = losses.get(name, 0.0) + value / len(batch)
    rois = [sample_rois(det, f, image, target, config, generator) for f, image, target in zip(res4, images, targets)]
    losses.update(box_head_losses(det, res4, rois))
    return losses


def train_detector(det: Detector, examples: Sequence[DetectionExample], config: TrainConfig = TrainConfig(),
                   log: Callable[[str], None] = print) -> list[dict[str, float]]:
    """Trains `det` in place; returns the mean losses of each logging interval (and leaves it in eval mode)."""
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    det.train()
    parameters = [p for p in det.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
    history: list[dict[str, float]] = []
    sums: dict[str, float] = {}
    started = time.monotonic()
    batches = _batches(examples, config, generator)
    for step in range(config.steps):
        losses = training_step(det, next(batches), config.losses, generator)
        total = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(parameters, config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        for name, value in losses.items():
            sums[name] = sums.get(name, 0.0) + float(value.detach())
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            count = (step % config.log_every) + 1
            means = {name: value / count for name, value in sums.items()}
            history.append({"step": step + 1, **means})
            log(f"step {step + 1}/{config.steps} {time.monotonic() - started:.0f}s "
                + " ".join(f"{name} {value:.3f}" for name, value in means.items()))
            sums = {}
    det.eval()
    return history
