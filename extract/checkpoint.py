"""Reading detector checkpoints (detectron2 .pkl, PyTorch .pth, .safetensors) and loading them strictly."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn

from vlbert.errors import UserError


class CheckpointError(UserError):
    """A checkpoint that does not fit the detector; the message lists every offending key."""


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights in a checkpoint file, by detectron2 key name, as float32/int tensors on the CPU."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".pkl":
            with path.open("rb") as f:
                # Model-zoo and caffe-converted files are Python 2 pickles of NumPy arrays.
                data = pickle.load(f, encoding="latin1")
        elif suffix in (".pth", ".pt"):
            data = torch.load(path, map_location="cpu", weights_only=True)
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            data = load_file(str(path))
        else:
            raise CheckpointError(f"{path}: unknown checkpoint format (expected .pkl, .pth, .pt or .safetensors)")
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding failure is reported with the file name
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(exc).__name__}: {exc})") from None
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = data["model"]
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a mapping of parameter names to arrays")
    state = {}
    for key, value in data.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: entry {key!r} is a {type(value).__name__}, not an array")
        state[key] = value.float() if value.is_floating_point() else value
    return state


def fill_folded_norms(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Caffe-converted checkpoints may fold batch-norm statistics into the affine weight and bias and
    store no running statistics at all; those are then the identity (mean 0, variance 1), as
    detectron2 assumes. Only a checkpoint missing every one of them is treated so: a partial set
    stays an error."""
    stats = [k for k in expected if k.endswith(("norm.running_mean", "norm.running_var"))]
    if not stats or any(k in state for k in stats):
        return state
    filled = dict(state)
    for key in stats:
        filled[key] = torch.zeros_like(expected[key]) if key.endswith("mean") else torch.ones_like(expected[key])
    return filled


def check_recorded_buffers(state: dict[str, torch.Tensor], recorded: dict[str, torch.Tensor],
                           source: str) -> dict[str, torch.Tensor]:
    """Drops the non-learned buffers some detectron2 versions save (cell anchors, pixel mean/std)
    after checking that they agree with the detector's config: a disagreement means the checkpoint
    was trained with other anchors or normalisation, which would silently corrupt every feature."""
    kept = {}
    for key, value in state.items():
        name = "cell_anchors" if key.startswith("proposal_generator.anchor_generator.cell_anchors.") else key
        if name not in recorded:
            kept[key] = value
            continue
        ours = recorded[name]
        if value.numel() != ours.numel() or not torch.allclose(value.float().reshape(-1), ours.reshape(-1), atol=1e-3):
            raise CheckpointError(
                f"{source}: {key} in the checkpoint is {value.reshape(-1).tolist()[:12]}, but the detector config "
                f"gives {ours.reshape(-1).tolist()[:12]}; set the config to match the checkpoint")
    return kept


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint",
                 optional_prefixes: Iterable[str] = ()) -> None:
    """Copies `state` into `model`, refusing any missing, unexpected or mis-shaped key.

    Keys under `optional_prefixes` may be absent (e.g. the RPN and predictors when only the
    trunk and res5 of a VL-BERT checkpoint are loaded for end-to-end tuning).
    """
    expected = model.state_dict()
    optional = tuple(optional_prefixes)
    missing = sorted(k for k in expected if k not in state and not k.startswith(optional))
    unexpected = sorted(k for k in state if k not in expected)
    mis_shaped = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)}, model {tuple(expected[k].shape)}"
        for k in state if k in expected and state[k].shape != expected[k].shape
    )
    problems = []
    for title, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", mis_shaped)):
        if keys:
            shown = "\n    ".join(keys[:40]) + (f"\n    ... and {len(keys) - 40} more" if len(keys) > 40 else "")
            problems.append(f"  {len(keys)} {title} key(s):\n    {shown}")
    if problems:
        raise CheckpointError(f"{source} does not fit the detector:\n" + "\n".join(problems))
    with torch.no_grad():
        for key, value in state.items():
            expected[key].copy_(value)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
