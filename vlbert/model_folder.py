"""A model folder, as `save_pretrained` writes it and Hugging Face's conventions read it:

    config.json             VLBertConfig's fields, and transformers' keys: `model_type` ("vlbert"),
                            `architectures` (the model's class), `id2label` and `label2id` (the head's
                            `label_names`: VQA's answers), and `versions` (vlbert.utils.versions) of what wrote it
    model.safetensors       the weights
    detector.safetensors    an end-to-end stage's tuned detector, an official checkpoint's Fast R-CNN
    vocab.txt, ...          the tokenizer the model reads its text with (vlbert.tokenization.TOKENIZER_FILES)

A key of a saved config.json that is none of these (one a newer version wrote) is warned about and
kept, written back when the model is saved again, so that an older version reads a newer folder.
A model is named by a folder, or by a Hugging Face Hub id (`org/name`), whose files huggingface_hub
finds in its cache or downloads (not with HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from vlbert.config import VLBertConfig, VLBertConfigError
from vlbert.utils.errors import UserError
from vlbert.utils.records import read_record
from vlbert.utils.versions import VERSIONS, environment_versions

MODEL_TYPE = "vlbert"  # config.json's `model_type`, under which transformers' AutoConfig knows VL-BERT
CONFIG_NAME = "config.json"
LABELS = "label_names"  # VLBertConfig's field that config.json holds as id2label and label2id
# config.json's keys besides VLBertConfig's fields, read here (`architecture`: before `architectures`).
FOLDER_KEYS = ("model_type", "architectures", "architecture", "id2label", "label2id", VERSIONS,
               "transformers_version")
# A Hub id: a name, or an owner and a name (huggingface_hub checks the rest when it looks it up).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# from_pretrained's options that say where a Hub id's files are (transformers' AutoModel passes them on).
HUB_OPTIONS = ("revision", "cache_dir", "token", "local_files_only", "force_download", "subfolder")


class ModelFolderError(UserError):
    """A model folder (or Hub id) that cannot be read; the message names it and what is wrong."""


@dataclass(frozen=True)
class SavedConfig:
    """What a saved config.json holds: VLBertConfig's fields, the model's class (None: not recorded),
    and the keys this version does not know, kept to be written back."""

    fields: dict[str, Any]
    architecture: str | None
    kept: dict[str, Any]


def config_record(config: VLBertConfig, architecture: str, kept: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """config.json of a model of class `architecture` with `config`: its fields, transformers' keys and the
    versions writing it, over the `kept` keys of the folder it was loaded from."""
    fields = config.to_dict()
    labels = fields.pop(LABELS)
    record = {**(kept or {}), "model_type": MODEL_TYPE, "architectures": [architecture], **fields,
              VERSIONS: environment_versions()}
    if labels is not None:
        record.update(id2label={str(index): name for index, name in enumerate(labels)},
                      label2id={name: index for index, name in enumerate(labels)})
        if len(labels) != record["num_labels"]:
            # transformers reads num_labels as id2label's count, and puts placeholders in place of labels
            # that are not as many; VLBertConfig's counts SNLI-VE's classes, which a head with other labels
            # (VQA's answers) does not read: it is left to its default.
            del record["num_labels"]
    return record


def write_config(directory: Path, config: VLBertConfig, architecture: str, kept: Mapping[str, Any] | None = None
                 ) -> None:
    (directory / CONFIG_NAME).write_text(json.dumps(config_record(config, architecture, kept), indent=2,
                                                    sort_keys=True) + "\n")


def read_config(directory: str | Path) -> SavedConfig:
    """The saved config.json of a model folder; ModelFolderError for a folder without one or one that
    cannot be read."""
    path = Path(directory) / CONFIG_NAME
    values = read_record(path, "a VL-BERT model's config", ModelFolderError)
    if values is None:
        raise ModelFolderError(f"{directory}: not a model folder (no {CONFIG_NAME})")
    return saved_config(values, str(path))


def saved_config(values: Mapping[str, Any], source: str) -> SavedConfig:
    """A saved config.json's mapping read: the fields, id2label as `label_names`, the class; an unknown key is
    warned about (naming `source`) and kept."""
    names = {spec.name for spec in dataclasses.fields(VLBertConfig)} - {LABELS}
    unknown = [key for key in values if key not in names and key not in FOLDER_KEYS]
    if unknown:
        keys = f"{', '.join(map(repr, unknown))} {'is not a key' if len(unknown) == 1 else 'are not keys'}"
        # Here, not the caller's line: a folder read twice (checked, then loaded) is warned about once.
        warnings.warn(f"{source}: {keys} of this version's VL-BERT config (a newer version's?); kept as written, "
                      "not used")
    fields = {key: value for key, value in values.items() if key in names}
    labels = label_names(values.get("id2label"), source)
    if labels is not None:
        fields[LABELS] = labels
    return SavedConfig(fields, architecture_of(values), {key: values[key] for key in unknown})


def architecture_of(values: Mapping[str, Any]) -> str | None:
    """The model class a saved config names: transformers' `architectures` (its first), or `architecture`
    as this project wrote it before."""
    architectures = values.get("architectures")
    if isinstance(architectures, list) and architectures:
        return architectures[0]
    return values.get("architecture")


def label_names(id2label: Any, source: str) -> list[str] | None:
    """The names of id2label's ids 0, 1, ...; None for none, or for transformers' placeholders (LABEL_0, ...),
    which a config made without labels holds."""
    if id2label is None:
        return None
    by_id = {str(key): name for key, name in id2label.items()} if isinstance(id2label, Mapping) else {}
    if not by_id or set(by_id) != {str(index) for index in range(len(by_id))} or not all(
            isinstance(name, str) for name in by_id.values()):
        raise VLBertConfigError(f"{source}: id2label: expected ids 0, 1, ... each mapped to a label's name")
    names = [by_id[str(index)] for index in range(len(by_id))]
    return None if names == [f"LABEL_{index}" for index in range(len(names))] else names


def model_folder(name: str | Path, subfolder: str | None = None, **hub_options: Any) -> Path:
    """The folder of a model named by its path or by its Hub id (`org/name`: in huggingface_hub's cache, or
    downloaded), and in it `subfolder`; `hub_options` (HUB_OPTIONS) for the Hub. ModelFolderError in one
    line for neither."""
    path, subfolder = Path(name), subfolder or ""
    if path.is_dir():
        return path / subfolder
    if path.exists():
        raise ModelFolderError(f"{name}: a file, expected a model folder (or a Hugging Face Hub id, org/name)")
    if not HUB_ID.fullmatch(str(name)):
        raise ModelFolderError(f"{name}: no such model folder")
    return _hub_snapshot(str(name), hub_options) / subfolder


def _hub_snapshot(repo_id: str, options: dict[str, Any]) -> Path:
    """The folder of a Hub model's snapshot in huggingface_hub's cache (HF_HUB_CACHE), downloaded unless
    it is there and offline (HF_HUB_OFFLINE=1, or local_files_only)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return Path(snapshot_download(repo_id, **options))
    except (HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelFolderError(f"{repo_id}: no such model folder, nor a Hugging Face Hub model that huggingface_hub "
                               f"finds ({reason})") from None
