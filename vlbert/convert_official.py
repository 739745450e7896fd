"""Convert the official VL-BERT checkpoints (github jackroos/VL-BERT) into this library's format.

The official files (`vl-bert-base-e2e.model`, `vl-bert_base_res101_pretrain_multitask_cc-0009.model`,
the VQA / RefCOCO+ / VCR fine-tuned ones) hold `{"state_dict": …}` saved from a DataParallel
module, so every key starts with `module.`. Their layout:

    vlbert.*                              VisualLinguisticBert: embeddings, visual LayerNorms, encoder
    vlbert.mlm_head / mvrc_head / relationsip_head   pre-training heads
    object_linguistic_embeddings          the [IMG] token; object_mask_word_embedding its masked form
    object_mask_visual_embedding          appearance of masked RoIs (precomputed-feature models)
    aux_text_visual_embedding             visual feature of text-only samples (multitask pre-training)
    image_feature_extractor.obj_downsample.1   Linear(geometry ⊕ appearance → hidden)
    image_feature_extractor.backbone / roi_head_feature_extractor   the Fast R-CNN trunk and res5
    final_mlp                             the fine-tuning classifier

Output: DIR/model.safetensors + DIR/config.json (VL-BERT), and, when the checkpoint carries the
Fast R-CNN, DIR/detector.safetensors (under the checkpoint's own names, which the extractor's key
map `vlbert-official` reads) + DIR/detector.yaml (`base: vlbert-official`).
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from vlbert.config import VLBertConfig
from vlbert.modeling import (
    DETECTOR_WEIGHTS,
    VLBertForMultipleChoice,
    VLBertForPreTraining,
    VLBertForQuestionAnswering,
    VLBertForReferringExpressions,
    VLBertModel,
    VLBertPreTrainedModel,
)
from vlbert.utils.torch_files import first_line, refusal, refused_global

OFFICIAL_VISUAL_FEATURE_SIZE = 2048
OFFICIAL_GEOMETRY_FREQUENCIES = 256  # fixed in the reference's coordinate embedding

# Keys carried by the official checkpoints that have no counterpart here, with the reason.
DROPPED_KEY_PATTERNS = {
    r"\.num_batches_tracked$": "BatchNorm step counter; the detector's norms are frozen",
    r"^image_feature_extractor\.head\.0\.": "second name of roi_head_feature_extractor (checked equal)",
    r"^vlbert\.mlm_head\.predictions\.decoder\.weight$": "tied to the word embeddings (checked equal)",
    r"^cnn_loss_reg\.": "VCR training-only RoI classification regulariser",
    r"^image_feature_extractor\.regularizing_predictor\.": "VCR training-only RoI classification regulariser",
}

VLBERT_RENAMES = [
    (r"^vlbert\.word_embeddings\.", "vlbert.embeddings.word_embeddings."),
    (r"^vlbert\.position_embeddings\.", "vlbert.embeddings.position_embeddings."),
    (r"^vlbert\.token_type_embeddings\.", "vlbert.embeddings.token_type_embeddings."),
    (r"^vlbert\.embedding_LayerNorm\.", "vlbert.embeddings.layer_norm."),
    (r"^vlbert\.visual_ln_text\.", "vlbert.embeddings.text_visual_norm."),
    (r"^vlbert\.visual_ln_object\.", "vlbert.embeddings.region_visual_norm."),
    (r"^vlbert\.encoder\.", "vlbert.encoder.bert."),
    (r"^vlbert\.pooler\.", "vlbert.pooler."),
    (r"^vlbert\.mlm_head\.predictions\.transform\.dense\.", "mlm_head.transform.dense."),
    (r"^vlbert\.mlm_head\.predictions\.transform\.LayerNorm\.", "mlm_head.transform.layer_norm."),
    (r"^vlbert\.mlm_head\.predictions\.bias$", "mlm_head.bias"),
    (r"^vlbert\.mvrc_head\.transform\.dense\.", "region_head.transform.dense."),
    (r"^vlbert\.mvrc_head\.region_cls_pred\.", "region_head.classifier."),
    (r"^vlbert\.relationsip_head\.caption_image_relationship\.", "relationship_head.classifier."),
]

# (1, hidden) embedding tables of the official model that are single vectors here.
VECTOR_RENAMES = {
    "vlbert.end_embedding.weight": "vlbert.embeddings.end_token",
    "object_linguistic_embeddings.weight": "vlbert.embeddings.image_token",
    "object_mask_word_embedding.weight": "vlbert.embeddings.masked_image_token",
    "object_mask_visual_embedding.weight": "vlbert.embeddings.masked_appearance",
    "aux_text_visual_embedding.weight": "vlbert.embeddings.text_only_visual",
}

HEAD_RENAMES = {
    VLBertForQuestionAnswering: [
        (r"^final_mlp\.0\.dense\.", "answer_head.transform.dense."),
        (r"^final_mlp\.0\.LayerNorm\.", "answer_head.transform.layer_norm."),
        (r"^final_mlp\.2\.", "answer_head.classifier."),
    ],
    VLBertForReferringExpressions: [
        (r"^final_mlp\.0\.dense\.", "region_score_head.transform.dense."),
        (r"^final_mlp\.2\.", "region_score_head.classifier."),
    ],
    VLBertForMultipleChoice: [(r"^final_mlp\.1\.", "choice_head.classifier.")],
}

PROJECTION = "image_feature_extractor.obj_downsample.1."
DETECTOR_PREFIXES = ("image_feature_extractor.backbone.", "image_feature_extractor.roi_head_feature_extractor.")

# The Fast R-CNN of the official checkpoints is the extractor's preset `vlbert-official`
# (extract/presets.py); the converted folder names it.
DETECTOR_YAML = "base: vlbert-official\n"


@dataclass
class ConversionResult:
    architecture: str
    config: VLBertConfig
    initialised: list[str] = field(default_factory=list)  # parameters here that the checkpoint lacks
    dropped: dict[str, str] = field(default_factory=dict)  # official key → why it is not converted
    has_detector: bool = False


def read_official_state_dict(path: str | Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The official checkpoint's tensors, `module.` prefix removed. ValueError, one line naming the
    file, for a file torch.save did not write, a damaged one, or one that is no state dict.

    The official files also pickle the optimizer and validation state, which may hold objects
    that PyTorch's safe loader refuses; `trust_pickle` unpickles everything (trusted files only).
    """
    path = Path(path)
    if not _written_by_torch_save(path):
        raise ValueError(f"{path}: not a PyTorch checkpoint; expected a file written by torch.save (a zip archive, "
                         "or the legacy pickle format of the official vl-bert-*.model files)")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as error:
        if trust_pickle:
            raise ValueError(f"{path}: a damaged PyTorch checkpoint ({first_line(error)})") from None
        refused = refused_global(error)
        if refused is None:
            raise ValueError(f"{path}: {refusal(error)}") from None
        raise ValueError(f"{path} holds objects beyond tensors ({refused}); convert it with --trust-pickle "
                         "(trust_pickle=True) only if you trust the file") from None
    except (EOFError, RuntimeError) as error:  # what torch.load raises for a truncated or damaged file
        raise ValueError(f"{path}: a damaged PyTorch checkpoint ({first_line(error) or 'truncated'})") from None
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: not a VL-BERT checkpoint; expected a state dict of tensors, or a dict with one "
                         f"under 'state_dict', found {type(checkpoint).__name__}")
    return {name.removeprefix("module."): tensor for name, tensor in state.items()}


# torch.save's legacy format (before PyTorch 1.6, as the official files) opens with a pickled magic number.
_LEGACY_HEADER = pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=2)[:-1]  # without STOP
_ZIP_HEADER = b"PK\x03\x04"  # torch.save's zip format (a truncated one still starts so)


def _written_by_torch_save(path: Path) -> bool:
    """Whether `path` is in one of torch.save's formats, checked before anything is unpickled."""
    with path.open("rb") as f:
        head = f.read(len(_LEGACY_HEADER))
    return head.startswith(_ZIP_HEADER) or head == _LEGACY_HEADER


def convert_official_checkpoint(
    source: str | Path,
    out_dir: str | Path,
    num_attention_heads: int | None = None,
    visual_feature_size: int = OFFICIAL_VISUAL_FEATURE_SIZE,
    geometry_frequencies: int = OFFICIAL_GEOMETRY_FREQUENCIES,
    trust_pickle: bool = False,
) -> ConversionResult:
    """Convert `source` into `out_dir` (filled in place: `vlbert convert-official` gives it a staging
    folder that replaces its output whole); unknown keys are an error that lists them, before
    anything is written.

    num_attention_heads: not recorded in the checkpoint; BERT's 64-wide heads by default.
    """
    official = _normalise_vcr_names(read_official_state_dict(source, trust_pickle))
    model_class = _task_of(official)
    config = _config_from(official, model_class, num_attention_heads, visual_feature_size, geometry_frequencies, source)
    model = model_class(config)
    result = ConversionResult(model_class.__name__, config)

    converted: dict[str, torch.Tensor] = {}
    detector: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    renames = VLBERT_RENAMES + HEAD_RENAMES.get(model_class, [])
    for name, tensor in official.items():
        reason = next((why for pattern, why in DROPPED_KEY_PATTERNS.items() if re.search(pattern, name)), None)
        if reason is not None:
            result.dropped[name] = reason
        elif name in VECTOR_RENAMES:
            converted[VECTOR_RENAMES[name]] = _single_row(name, tensor)
        elif name.startswith(PROJECTION):
            converted["vlbert.embeddings.visual_feature_embedding.projection." + name[len(PROJECTION) :]] = (
                _appearance_first(tensor, config.geometry_size)
            )
        elif name.startswith(DETECTOR_PREFIXES):
            detector[name] = tensor  # the extractor maps these names (extract.checkpoint.KEY_MAPS)
        else:
            new_name = _rename(name, renames)
            if new_name is None:
                unknown.append(name)
            else:
                converted[new_name] = tensor
    if unknown:
        raise ValueError(f"{source}: {len(unknown)} keys this converter does not know: {sorted(unknown)}")
    _check_aliases(official)

    own = model.state_dict()
    mismatched = [
        f"{name}: checkpoint {tuple(tensor.shape)}, model {tuple(own[name].shape)}"
        for name, tensor in converted.items()
        if name in own and own[name].shape != tensor.shape
    ]
    extra = sorted(set(converted) - set(own))
    if mismatched or extra:
        raise ValueError(f"{source}: shapes differ {mismatched}; no place for {extra}")
    model.load_state_dict(converted, strict=False)
    result.initialised = sorted(set(own) - set(converted))

    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    if detector:
        save_file({name: t.contiguous() for name, t in detector.items()}, out_dir / DETECTOR_WEIGHTS)
        (out_dir / "detector.yaml").write_text(DETECTOR_YAML)
        result.has_detector = True
    return result


def _normalise_vcr_names(official: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # The VCR model wraps VL-BERT in a TimeDistributed module.
    return {name.replace("vlbert._module.", "vlbert.", 1): tensor for name, tensor in official.items()}


def _task_of(official: dict[str, torch.Tensor]) -> type[VLBertPreTrainedModel]:
    if any(name.startswith(("vlbert.mlm_head.", "vlbert.mvrc_head.")) for name in official):
        return VLBertForPreTraining
    if "final_mlp.0.LayerNorm.weight" in official:
        return VLBertForQuestionAnswering
    if "final_mlp.0.dense.weight" in official:
        return VLBertForReferringExpressions
    if "final_mlp.1.weight" in official and "final_mlp.4.weight" not in official:
        return VLBertForMultipleChoice
    if any(name.startswith("final_mlp.") for name in official):
        heads = sorted(name for name in official if name.startswith("final_mlp."))
        raise ValueError(f"unsupported official classifier layout: {heads}")
    return VLBertModel


def _config_from(
    official: dict[str, torch.Tensor],
    model_class: type[VLBertPreTrainedModel],
    num_attention_heads: int | None,
    visual_feature_size: int,
    geometry_frequencies: int,
    source: str | Path,
) -> VLBertConfig:
    def shape(name: str) -> torch.Size:
        if name not in official:
            raise ValueError(f"{source}: not an official VL-BERT checkpoint, it lacks {name}")
        return official[name].shape

    vocab_size, hidden_size = shape("vlbert.word_embeddings.weight")
    layers = {int(m.group(1)) for name in official if (m := re.match(r"vlbert\.encoder\.layer\.(\d+)\.", name))}
    projection_inputs = shape(PROJECTION + "weight")[1]
    if projection_inputs != visual_feature_size + 8 * geometry_frequencies:
        raise ValueError(
            f"{source}: obj_downsample takes {projection_inputs} inputs, expected appearance {visual_feature_size} "
            f"+ geometry {8 * geometry_frequencies}"
        )
    values = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=len(layers),
        num_attention_heads=num_attention_heads or hidden_size // 64,
        intermediate_size=shape("vlbert.encoder.layer.0.intermediate.dense.weight")[0],
        max_position_embeddings=shape("vlbert.position_embeddings.weight")[0],
        type_vocab_size=shape("vlbert.token_type_embeddings.weight")[0],
        visual_feature_size=visual_feature_size,
        geometry_frequencies=geometry_frequencies,
        with_pooler="vlbert.pooler.dense.weight" in official,
        with_relationship_head="vlbert.relationsip_head.caption_image_relationship.weight" in official,
    )
    if model_class is VLBertForPreTraining:
        values["num_detector_classes"] = shape("vlbert.mvrc_head.region_cls_pred.weight")[0]
    if model_class is VLBertForQuestionAnswering:
        values["num_answers"] = shape("final_mlp.2.weight")[0]
    return VLBertConfig(**values)


def _rename(name: str, renames: list[tuple[str, str]]) -> str | None:
    for pattern, replacement in renames:
        if re.match(pattern, name):
            return re.sub(pattern, replacement, name, count=1)
    return None


def _single_row(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() != 2 or tensor.shape[0] != 1:
        raise ValueError(f"{name}: expected a single embedding row, got shape {tuple(tensor.shape)}")
    return tensor[0]


def _appearance_first(tensor: torch.Tensor, geometry_size: int) -> torch.Tensor:
    """The official projection reads geometry ⊕ appearance; this library appearance ⊕ geometry."""
    if tensor.dim() == 1:
        return tensor
    return torch.cat((tensor[:, geometry_size:], tensor[:, :geometry_size]), 1)


def _check_aliases(official: dict[str, torch.Tensor]) -> None:
    """Dropped duplicates must really be duplicates."""
    aliases = {
        "vlbert.mlm_head.predictions.decoder.weight": "vlbert.word_embeddings.weight",
        **{
            name: name.replace("image_feature_extractor.head.0.", "image_feature_extractor.roi_head_feature_extractor.")
            for name in official
            if name.startswith("image_feature_extractor.head.0.")
        },
    }
    for alias, original in aliases.items():
        if alias in official and (original not in official or not torch.equal(official[alias], official[original])):
            raise ValueError(f"{alias} should equal {original} but does not")
