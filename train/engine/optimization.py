"""The optimiser and learning-rate schedule of a stage, as the reference code sets them up."""

from __future__ import annotations

from typing import Callable

import torch


def parameter_groups(model, visual, weight_decay: float) -> list[dict]:
    """No weight decay on biases and LayerNorm gains, as BERT trains."""
    decay, no_decay = [], []
    for module in (model, visual):
        if module is None:
            continue
        for name, parameter in module.named_parameters():
            if parameter.requires_grad:
                (no_decay if name.endswith("bias") or "norm" in name.lower() else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def learning_rate_factor(stage) -> Callable[[int], float]:
    """Linear warm-up, then a linear decay to 0 at the stage's end (the reference's "triangle"),
    or, with `lr_milestones`, a tenfold drop at each milestone step (its step schedule)."""
    def factor(step: int) -> float:
        if step < stage.warmup_steps:
            return (step + 1) / stage.warmup_steps
        if stage.lr_milestones:
            return 0.1 ** sum(step >= milestone for milestone in stage.lr_milestones)
        return max(0.0, (stage.steps - step) / max(1, stage.steps - stage.warmup_steps))
    return factor


# How an optimiser updates its parameters: all in one fused kernel per step (CUDA), a few multi-tensor
# (foreach) kernels, or one parameter after another. Each gives the others' numbers to float rounding.
KERNELS: dict[str, dict[str, bool]] = {"fused": {"fused": True}, "foreach": {"foreach": True},
                                       "for-loop": {"foreach": False}}


def optimizer_kernel(fused: bool, device: torch.device) -> str:
    """A stage's `fused_optimizer` on `device`: fused on CUDA, foreach elsewhere; for-loop when off."""
    if not fused:
        return "for-loop"
    return "fused" if device.type == "cuda" else "foreach"


# The reference code's optimisers: AdamW, and SGD with momentum 0.9 (its VCR fine-tuning); each takes
# the parameter groups, the learning rate and a kernel of KERNELS.
OPTIMIZERS: dict[str, Callable[[list[dict], float, str], torch.optim.Optimizer]] = {
    "adamw": lambda groups, lr, kernel: torch.optim.AdamW(groups, lr=lr, **KERNELS[kernel]),
    "sgd": lambda groups, lr, kernel: torch.optim.SGD(groups, lr=lr, momentum=0.9, **KERNELS[kernel]),
}
