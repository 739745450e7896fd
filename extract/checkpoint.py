"""Reading detector checkpoints (detectron2 .pkl, PyTorch .pth, .safetensors) and loading them strictly."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn


class CheckpointError(ValueError):
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
