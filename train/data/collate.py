"""Samples → padded model inputs, and those on the device. Text-only samples sit in the same batch
with no RoIs. `model_inputs` is the one place that decides which batch entries reach a model."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from extract.store.schema import Encoded
from train.data.datasets import Sample, SampleGroup
from vlbert.losses import IGNORE_INDEX
from vlbert.modeling import VLBertModel
from vlbert.tokenization import pad_text

# Batch entries that are targets (and the positions of the masked words): evaluation predicts without them.
TARGETS = frozenset({"labels", "mlm_labels", "mlm_positions", "region_labels", "relationship_labels"})
# Training-time corruptions: evaluation shows the model every RoI as itself.
CORRUPTIONS = frozenset({"masked_regions"})
PIXELS = ("image_files", "images")  # the batch entries (lists, not tensors) that end-to-end stages read


def pixel_entries(batch: dict[str, Any]) -> dict[str, list]:
    """A collated batch's PIXELS entries, which stay on the host."""
    return {k: batch[k] for k in PIXELS}


def collate(samples: list[Sample] | list[SampleGroup], pad_token_id: int = 0,
            length_multiple: int = 1) -> dict[str, torch.Tensor]:
    """Model inputs and targets; `image_files` and `images` (lists, not tensors) are there for
    end-to-end stages. B groups of G samples give B × G inputs in group order and (B, G, ...) targets.
    Text and RoIs are padded to the longest sample's, rounded up to a `length_multiple` (a compiled
    stage's: few shapes)."""
    if isinstance(samples[0], SampleGroup):
        size = len(samples[0].samples)
        batch = collate([s for group in samples for s in group.samples], pad_token_id, length_multiple)
        for name in samples[0].samples[0].targets:
            batch[name] = batch[name].view(len(samples), size, *batch[name].shape[1:])
        return batch
    if samples[0].choices is not None:
        # (B, C, T): every candidate of every sample padded to one length.
        choices = len(samples[0].choices)
        batch = pad_text([c for s in samples for c in s.choices], pad_token_id, length_multiple)
        batch = {k: v.view(len(samples), choices, -1) for k, v in batch.items()}
    else:
        batch = pad_text([s.sequence for s in samples], pad_token_id, length_multiple)
    batch["image_files"] = [s.image_file for s in samples]
    batch["images"] = [s.image for s in samples]
    visual = [s for s in samples if s.regions is not None]
    if visual:
        n = max(len(s.regions) for s in visual)
        n += -n % length_multiple
        size = len(samples)
        boxes = np.zeros((size, n, 4), np.float32)
        box_mask, masked = np.zeros((size, n), bool), np.zeros((size, n), bool)
        image_size = np.ones((size, 2), np.float32)
        for i, s in enumerate(samples):
            if s.regions is None:
                continue
            k = len(s.regions)
            boxes[i, :k], box_mask[i, :k] = s.regions.boxes, True
            image_size[i] = s.regions.image_size
            if s.masked_regions is not None:
                masked[i, :k] = s.masked_regions
        # Features keep the store's dtype (float16: half the bytes through worker pipes and to the GPU)
        # or its encoding's parts (q8: 8-bit codes), padded with zeros, which decode to zeros.
        appearance = padded_rows([None if s.regions is None else s.regions.appearance for s in samples], n)
        batch.update(appearance=appearance, boxes=torch.from_numpy(boxes),
                     box_mask=torch.from_numpy(box_mask), image_size=torch.from_numpy(image_size),
                     masked_regions=torch.from_numpy(masked))
    # Text-only samples mixed into a pre-training batch have no targets of their own: ignored
    # (-100) per sample, zero rows (never predicted) per RoI.
    for name in {n for s in samples for n in s.targets}:
        batch[name] = torch.tensor(np.stack([np.asarray(s.targets.get(name, IGNORE_INDEX)) for s in samples]))
    if "mlm_labels" in batch:
        # The masked words' positions in the flattened text, found here on the host: found on the
        # device, their count would make the host wait for it (VLBertForPreTraining.forward). Their
        # count too is padded to the `length_multiple`, with position 0: the first sample's [CLS],
        # never a masked word, whose ignored label leaves the loss as it is.
        positions = np.flatnonzero(batch["mlm_labels"].numpy() != IGNORE_INDEX)
        padding = np.zeros(-len(positions) % length_multiple, positions.dtype)  # np.pad costs 10x on every batch
        batch["mlm_positions"] = torch.from_numpy(np.concatenate((positions, padding)))
    # Per-RoI targets as the samples carry them (float32, or a top-k store's sparse class distributions,
    # densified on the device), zero rows for padding and for samples without them.
    for name in {n for s in samples for n in s.region_targets}:
        batch[name] = padded_rows([s.region_targets.get(name) for s in samples], batch["box_mask"].shape[1])
    if samples[0].sequence.answer_position is not None:
        batch["answer_positions"] = torch.tensor([s.sequence.answer_position for s in samples])
    return batch


def padded_rows(values: list[np.ndarray | Encoded | None], rows: int) -> torch.Tensor | Encoded:
    """(B, rows, ...): each sample's rows, then zeros (None: a sample without any); encoded values
    part by part, as `Encoded` tensors."""
    first = next(value for value in values if value is not None)
    if isinstance(first, Encoded):
        return first.with_parts({name: padded_rows([None if v is None else v.parts[name] for v in values], rows)
                                 for name in first.parts})
    out = np.zeros((len(values), rows, *first.shape[1:]), first.dtype)
    for i, value in enumerate(values):
        if value is not None:
            out[i, : len(value)] = value
    return torch.from_numpy(out)


def decoded_on_host(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with its encoded entries decoded where it is (the DataLoader's workers)."""
    return {name: value.decoded() if isinstance(value, Encoded) else value for name, value in batch.items()}


def pinned(value: Any) -> Any:
    """A tensor (or an `Encoded`'s tensors) in page-locked memory, so that its copy to a GPU is
    asynchronous; anything else as it is."""
    if isinstance(value, Encoded):
        return value.with_parts({name: part.pin_memory() for name, part in value.parts.items()})
    return value.pin_memory() if torch.is_tensor(value) else value


def transfer_bytes(batch: dict[str, Any]) -> int:
    """The bytes of the batch's tensors (and encoded parts): what goes from the host to the device."""
    parts = [p for v in batch.values() for p in (v.parts.values() if isinstance(v, Encoded) else [v])]
    return sum(p.nbytes for p in parts if torch.is_tensor(p))


def to_device(batch: dict, device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's tensors on `device` (asynchronously from pinned memory), float16 features
    widened to float32 there, exact and half the bytes to copy; encoded values (a q8 store's
    codes, top-k class distributions) decoded there, by the store's own decoding
    (`extract.store.schema.ENCODED_VALUES`): the host's values, bitwise, at a fraction of their bytes."""
    moved = {}
    for name, value in batch.items():
        if isinstance(value, Encoded):
            moved[name] = value.with_parts({k: v.to(device, non_blocking=True)
                                            for k, v in value.parts.items()}).decoded()
        elif torch.is_tensor(value):
            value = value.to(device, non_blocking=True)
            moved[name] = value.float() if value.dtype == torch.float16 else value
    return moved


def model_inputs(model: torch.nn.Module, batch: dict[str, Any], training: bool = True) -> dict[str, Any]:
    """The entries of `batch` that `model.forward` takes (with its `**inputs`: VLBertModel's); in
    evaluation (`training` False) without the targets and the training-time corruptions."""
    names = _forward_inputs(type(getattr(model, "module", model)))
    left_out = frozenset() if training else TARGETS | CORRUPTIONS
    return {k: v for k, v in batch.items() if k in names and k not in left_out}


# Looked up once per model class: model_inputs runs every training step. A dict, not functools.cache,
# which torch.compile does not trace through (a compiled stage's step calls model_inputs).
_FORWARD_INPUTS: dict[type, frozenset[str]] = {}


def _forward_inputs(cls: type) -> frozenset[str]:
    if cls not in _FORWARD_INPUTS:
        parameters = inspect.signature(cls.forward).parameters
        names = set(parameters)
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            names |= set(inspect.signature(VLBertModel.forward).parameters)
        _FORWARD_INPUTS[cls] = frozenset(names)
    return _FORWARD_INPUTS[cls]
