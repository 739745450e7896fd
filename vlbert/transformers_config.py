"""VL-BERT's config as transformers sees it: the class that `AutoConfig.from_pretrained(folder)` builds from
a model folder's config.json (model_type "vlbert"), and the VLBertConfig fields it holds.

VLBertConfig stays the project's own dataclass, checked as every config is (vlbert.utils.typed_config); this
class is transformers' view of the same config.json, registered with AutoConfig (vlbert.auto), whose
keys it keeps as attributes. One name means two things: transformers' `num_labels` counts id2label's
labels (VQA's answers), VLBertConfig's counts SNLI-VE's classes; they agree where a head reads it (a
folder whose labels are others leaves VLBertConfig's out of config.json: vlbert.model_folder).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import PretrainedConfig

from vlbert.config import VLBertConfig
from vlbert.model_folder import LABELS, MODEL_TYPE, label_names


class VLBertTransformersConfig(PretrainedConfig):
    """A model folder's config.json as transformers reads it (`AutoConfig.from_pretrained`)."""

    model_type = MODEL_TYPE


def vlbert_fields(config: PretrainedConfig) -> dict[str, Any]:
    """The VLBertConfig fields that a transformers config holds (AutoModel's, with the overrides its
    `from_pretrained` took), id2label as `label_names` where it names labels. None is transformers' own
    default of a name both have (pad_token_id), not a value of the folder's."""
    names = {spec.name for spec in dataclasses.fields(VLBertConfig)} - {LABELS}
    fields = {name: getattr(config, name) for name in names if getattr(config, name, None) is not None}
    labels = label_names(config.id2label, config.name_or_path or "the transformers config")
    return {**fields, LABELS: labels} if labels is not None else fields
