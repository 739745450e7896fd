"""Reading detector checkpoints (detectron2 .pkl, PyTorch .pth, .safetensors) and loading them strictly.

The detector's modules carry detectron2's key names. A checkpoint written under another naming
scheme goes through its key map, a record in `KEY_MAPS` recognised from the checkpoint's keys:
a new scheme is one record. maskrcnn-benchmark's (VinVL's detector, scene_graph_benchmark) renames
the modules, puts background first where detectron2 puts it last (and "no attribute" first),
regresses a box for background too, and orders its RPN anchors ratio-major.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn

from vlbert.utils.errors import UserError
from vlbert.utils.pickles import ARRAYS, load_pickle
from vlbert.utils.torch_files import first_line, load_weights_only


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
            # Model-zoo and caffe-converted files are Python 2 pickles of NumPy arrays; nothing else loads.
            data = load_pickle(path, CheckpointError, ARRAYS, encoding="latin1")
        elif suffix in (".pth", ".pt"):
            data = load_weights_only(path, CheckpointError)
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            data = load_file(str(path))
        else:
            raise CheckpointError(f"{path}: unknown checkpoint format (expected .pkl, .pth, .pt or .safetensors)")
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decoding failure is reported with the file name
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(exc).__name__}: {first_line(exc)})") from None
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = data["model"]
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a mapping of parameter names to arrays")
    state = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise CheckpointError(f"{path}: a parameter name is {type(key).__name__} {key!r}, not text")
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: entry {key!r} is a {type(value).__name__}, not an array")
        state[key] = value.float() if value.is_floating_point() else value
    return state


@dataclass(frozen=True)
class KeyMap:
    name: str
    recognises: Callable[[Iterable[str]], bool]
    # (state, detector config, source) → the state under detectron2's names and layouts
    convert: Callable[[dict[str, torch.Tensor], Any, str], dict[str, torch.Tensor]]


def detectron2_names(state: dict[str, torch.Tensor], cfg, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """`state` under detectron2's key names, through the first key map that recognises its keys."""
    key_map = next((m for m in KEY_MAPS.values() if m.recognises(state)), None)
    return state if key_map is None else key_map.convert(state, cfg, source)


# A ResNet block's parameters as torchvision-style code names them (maskrcnn-benchmark, the official
# VL-BERT): `<block>.conv1.weight`, `<block>.bn1.running_var`, `<block>.downsample.0.weight`, ...
_BLOCK = re.compile(r"(?P<block>\d+)\.(?P<part>conv[123]|bn[123]|downsample\.[01])\.(?P<param>\w+)")
_NORM = ("weight", "bias", "running_mean", "running_var")


def _stem(conv: str, norm: str) -> dict[str, str]:
    return {f"{conv}.weight": "backbone.stem.conv1.weight", **{f"{norm}.{p}": f"backbone.stem.conv1.norm.{p}" for p in _NORM}}


def _resnet_name(key: str, renames: dict[str, str], stages: tuple[tuple[str, str], ...]) -> str | None:
    """`key` under detectron2's name: from `renames`, or a block of one of `stages` (their prefix →
    ours); None when it is neither."""
    if key in renames:
        return renames[key]
    for theirs, ours in stages:
        if key.startswith(theirs) and (block := _BLOCK.fullmatch(key[len(theirs):])):
            part, param = block["part"], block["param"]
            layer = "shortcut" if part.startswith("downsample") else "conv" + part[-1]
            norm = part.startswith("bn") or part == "downsample.1"
            return f"{ours}{block['block']}.{layer}" + (f".norm.{param}" if norm else f".{param}")
    return None


def _renamed(state: dict[str, torch.Tensor], name: Callable[[str], str | None], scheme: str,
             source: str) -> dict[str, torch.Tensor]:
    names = {key: name(key) for key in state}
    unknown = sorted(key for key, new in names.items() if new is None)
    if unknown:
        raise CheckpointError(f"{source}: {len(unknown)} {scheme} key(s) with no place in the detector: "
                              + ", ".join(unknown[:20]))
    return {names[key]: value for key, value in state.items()}


_MB_STAGES = (  # maskrcnn-benchmark prefix → ours, for the ResNet stages
    *((f"backbone.body.layer{i}.", f"backbone.res{i + 1}.") for i in (1, 2, 3)),
    ("roi_heads.box.feature_extractor.head.layer4.", "roi_heads.res5."),
)
_MB_RENAMES = {
    **_stem("backbone.body.stem.conv1", "backbone.body.stem.bn1"),
    **{f"rpn.head.{a}.{p}": f"proposal_generator.rpn_head.{b}.{p}" for a, b in
       (("conv", "conv"), ("cls_logits", "objectness_logits"), ("bbox_pred", "anchor_deltas")) for p in ("weight", "bias")},
    **{f"roi_heads.box.predictor.{n}.{p}": f"roi_heads.box_predictor.{n}.{p}" for n in ("cls_score", "bbox_pred")
       for p in ("weight", "bias")},
    "roi_heads.attribute.predictor.cls_embedding.weight": "roi_heads.box_predictor.cls_embedding.weight",
    **{f"roi_heads.attribute.predictor.{n}.{p}": f"roi_heads.box_predictor.{n}.{p}" for n in ("fc_attr", "attr_score")
       for p in ("weight", "bias")},
}
# Entries that hold nothing the detector learns: anchors (recomputed from the config), and the
# attribute head's feature extractor when it is the box head's (checked equal).
_MB_IGNORED = re.compile(r"rpn\.anchor_generator\..*")
_MB_SHARED = ("roi_heads.attribute.feature_extractor.", "roi_heads.box.feature_extractor.")


def _background_last(tensor: torch.Tensor, rows_per_class: int = 1) -> torch.Tensor:
    """Class rows with background (or "no attribute") moved from first to last."""
    return torch.cat((tensor[rows_per_class:], tensor[:rows_per_class]))


def _size_major(tensor: torch.Tensor, sizes: int, ratios: int) -> torch.Tensor:
    """RPN outputs per anchor (A, or 4A rows) from ratio-major to size-major order."""
    per_anchor = tensor.shape[0] // (sizes * ratios)
    return tensor.reshape(ratios, sizes, per_anchor, *tensor.shape[1:]).transpose(0, 1).reshape(tensor.shape)


def _from_maskrcnn_benchmark(state: dict[str, torch.Tensor], cfg, source: str) -> dict[str, torch.Tensor]:
    state = {key.removeprefix("module."): value for key, value in state.items()}
    kept = {}
    for key, value in state.items():
        if _MB_IGNORED.fullmatch(key):
            continue
        if key.startswith(_MB_SHARED[0]):
            twin = _MB_SHARED[1] + key[len(_MB_SHARED[0]):]
            if twin not in state or not torch.equal(state[twin], value):
                raise CheckpointError(f"{source}: {key} differs from {twin}: an attribute head with its own "
                                      "feature extractor is not supported")
            continue
        kept[key] = value
    converted = _renamed(kept, lambda key: _resnet_name(key, _MB_RENAMES, _MB_STAGES), "maskrcnn-benchmark", source)
    sizes, ratios = len(cfg.anchor_sizes), len(cfg.anchor_ratios)
    for name in list(converted):
        if name.startswith(("proposal_generator.rpn_head.objectness_logits.", "proposal_generator.rpn_head.anchor_deltas.")):
            converted[name] = _size_major(converted[name], sizes, ratios)
        elif name.startswith(("roi_heads.box_predictor.cls_score.", "roi_heads.box_predictor.cls_embedding.",
                              "roi_heads.box_predictor.attr_score.")):
            converted[name] = _background_last(converted[name])
        elif name.startswith("roi_heads.box_predictor.bbox_pred."):
            converted[name] = converted[name][4:]  # background's box regression: detectron2 has none
    return converted


# The Fast R-CNN inside the official VL-BERT checkpoints, as `vlbert convert-official` writes it out
# (the preset `vlbert-official`): torchvision's ResNet names, res5 as `roi_head_feature_extractor`.
_OFFICIAL_PREFIX = "image_feature_extractor."
_OFFICIAL_STAGES = (
    *((f"{_OFFICIAL_PREFIX}backbone.layer{i}.", f"backbone.res{i + 1}.") for i in (1, 2, 3)),
    (f"{_OFFICIAL_PREFIX}roi_head_feature_extractor.", "roi_heads.res5."),
)
_OFFICIAL_RENAMES = _stem(f"{_OFFICIAL_PREFIX}backbone.conv1", f"{_OFFICIAL_PREFIX}backbone.bn1")


def _from_vlbert_official(state: dict[str, torch.Tensor], cfg, source: str) -> dict[str, torch.Tensor]:
    return _renamed(state, lambda key: _resnet_name(key, _OFFICIAL_RENAMES, _OFFICIAL_STAGES), "VL-BERT", source)


KEY_MAPS: dict[str, KeyMap] = {
    "vlbert-official": KeyMap("vlbert-official", lambda keys: any(k.startswith(_OFFICIAL_PREFIX) for k in keys),
                              _from_vlbert_official),
    "maskrcnn-benchmark": KeyMap("maskrcnn-benchmark",
                                 lambda keys: any(k.removeprefix("module.").startswith("backbone.body.") for k in keys),
                                 _from_maskrcnn_benchmark),
}


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
