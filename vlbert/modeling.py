"""VL-BERT (Su et al., ICLR 2020): embeddings → BERT encoder → task heads.

Input layout of one sample, in sequence order:

    text    [CLS] A [SEP] (B [SEP])   padded to T, `text_mask` marks the real tokens (a prefix)
    visual  [IMG] × N                 one per RoI, box 0 is the whole image, `box_mask` marks real ones
    [END]

Every element embeds token + visual feature + segment + position. Text elements take the whole
image's visual feature (or, when `text_box_index` is given, their tagged object's); RoIs take
their own. Segments: A = 0, B = 1, visual and [END] = 2. Text positions count from 0, every RoI
shares the position after the text and [END] takes the next one, so the RoIs form an unordered
set: permuting them permutes their outputs and leaves every other output unchanged.

The reference implementation packs each sample without padding between text and RoIs; padded
elements here are masked out of attention and positions are explicit, so real elements see the
same inputs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import BertConfig
from transformers.activations import ACT2FN
from transformers.models.bert.modeling_bert import BertEncoder
from transformers.utils import ModelOutput

from vlbert import losses
from vlbert.auto import register_config, register_models
from vlbert.config import VLBertConfig, VLBertConfigError
from vlbert.model_folder import (CONFIG_NAME, HUB_OPTIONS, ModelFolderError, SavedConfig, model_folder, read_config,
                                 write_config)
from vlbert.tokenization import copy_tokenizer, vocabulary_file
from vlbert.transformers_config import vlbert_fields
from vlbert.utils.torch_files import load_weights_only

VISUAL_SEGMENT = 2
WEIGHTS_NAME = "model.safetensors"  # a model folder's weights (transformers' BERT folders name theirs the same)
# transformers' AutoModel passes these to the from_pretrained of the class it loads: its own business.
AUTO_MODEL_ARGUMENTS = ("_from_auto", "_commit_hash", "trust_remote_code", "adapter_kwargs", "code_revision")
# Beside them, a detector's weights: an end-to-end stage's tuned detector, an official checkpoint's Fast R-CNN.
DETECTOR_WEIGHTS = "detector.safetensors"
# What a BERT checkpoint's config.json gives a model built on it (`from_bert`): its sizes, which its
# weights fix, and its activation, dropouts and LayerNorm epsilon, which a caller may override.
BERT_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings")
BERT_DEFAULTS = ("hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps")


# ----------------------------------------------------------------------------------------------
# Embeddings
# ----------------------------------------------------------------------------------------------


def box_geometry_embedding(
    boxes: torch.Tensor,
    image_size: torch.Tensor,
    frequencies: int = 256,
    wavelength: float = 1000.0,
    form: str = "center",
) -> torch.Tensor:
    """Sinusoidal embedding of boxes (…, 4) = (x1, y1, x2, y2) in pixels of an image (…, 2) = (w, h).

    Each coordinate, as a percentage of the image size, gives sin then cos at `frequencies`
    wavelengths growing geometrically up to `wavelength`; coordinates follow each other:
    [x sin, x cos, y sin, y cos, …] → (…, 8 × frequencies).
    """
    width, height = image_size.float().unbind(-1)
    x1, y1, x2, y2 = boxes.float().unbind(-1)
    if form == "center":
        coordinates = ((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1)
    elif form == "corner":
        coordinates = (x1, y1, x2, y2)
    else:
        raise ValueError(f"unknown geometry form {form!r}")
    percent = torch.stack(coordinates, -1) / torch.stack((width, height, width, height), -1) * 100.0
    exponents = torch.arange(frequencies, dtype=torch.float32, device=boxes.device) / frequencies
    angles = percent.unsqueeze(-1) / wavelength**exponents
    return torch.cat((angles.sin(), angles.cos()), -1).flatten(-2)


class VisualFeatureEmbedding(nn.Module):
    """RoI appearance ⊕ geometry → Dropout → Linear → ReLU, one hidden-size vector per box."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.config = config
        self.dropout = nn.Dropout(config.visual_dropout_prob)
        self.projection = nn.Linear(config.visual_feature_size + config.geometry_size, config.hidden_size)

    def forward(self, appearance: torch.Tensor, boxes: torch.Tensor, image_size: torch.Tensor) -> torch.Tensor:
        geometry = box_geometry_embedding(
            boxes,
            image_size.unsqueeze(1),
            self.config.geometry_frequencies,
            self.config.geometry_wavelength,
            self.config.geometry_form,
        )
        features = torch.cat((appearance, geometry.to(appearance.dtype)), -1)
        return F.relu(self.projection(self.dropout(features)))


class VLBertEmbeddings(nn.Module):
    def __init__(self, config: VLBertConfig):
        super().__init__()
        hidden = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, hidden)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, hidden)
        self.visual_feature_embedding = VisualFeatureEmbedding(config)
        # Separate norms for the visual feature added to words and to RoIs; gains start at 0.
        self.text_visual_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.region_visual_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.image_token = nn.Parameter(torch.zeros(hidden))  # [IMG]
        self.masked_image_token = nn.Parameter(torch.zeros(hidden))  # [IMG] of a masked RoI
        self.end_token = nn.Parameter(torch.zeros(hidden))  # [END]
        self.text_only_visual = nn.Parameter(torch.zeros(hidden))  # every word of a text-only sample
        # Appearance of a masked RoI when the cache has no pixel-masked features; starts at 0.
        self.masked_appearance = nn.Parameter(torch.zeros(config.visual_feature_size))
        self.layer_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        text_mask: torch.Tensor,
        appearance: torch.Tensor | None = None,
        boxes: torch.Tensor | None = None,
        box_mask: torch.Tensor | None = None,
        image_size: torch.Tensor | None = None,
        text_box_index: torch.Tensor | None = None,
        masked_regions: torch.Tensor | None = None,
        feature_masking: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, text_length = input_ids.shape
        hidden = self.word_embeddings.embedding_dim
        text_mask = text_mask.bool()
        text_lengths = text_mask.sum(1)

        if appearance is None or appearance.shape[1] == 0:
            visual_of_text = self.text_only_visual.expand(batch, text_length, hidden)
            region_tokens = self.image_token.new_zeros(batch, 0, hidden)
            box_mask = text_mask.new_zeros(batch, 0)
        else:
            appearance = appearance.to(self.masked_appearance.dtype)  # caches may store float16
            box_mask = box_mask.bool()
            if feature_masking:
                masked = box_mask.new_zeros(box_mask.shape) if masked_regions is None else masked_regions.bool()
                appearance = self._mask_features(appearance, box_mask, masked)
            visual = self.visual_feature_embedding(appearance, boxes, image_size)
            index = input_ids.new_zeros(batch, text_length) if text_box_index is None else text_box_index.long()
            visual_of_text = torch.gather(visual, 1, index.unsqueeze(-1).expand(-1, -1, hidden))
            has_image = box_mask.any(1).view(batch, 1, 1)
            visual_of_text = torch.where(has_image, visual_of_text, self.text_only_visual.to(visual.dtype))
            image_token = self.image_token
            if masked_regions is not None:
                image_token = torch.where(masked_regions.bool().unsqueeze(-1), self.masked_image_token, image_token)
            region_tokens = image_token + self.region_visual_norm(visual)

        text_tokens = self.word_embeddings(input_ids) + self.text_visual_norm(visual_of_text)
        end_token = self.end_token.expand(batch, 1, hidden)
        tokens = torch.cat((text_tokens, region_tokens.to(text_tokens.dtype), end_token.to(text_tokens.dtype)), 1)

        num_regions = region_tokens.shape[1]
        visual_segment = token_type_ids.new_full((batch, num_regions + 1), VISUAL_SEGMENT)
        segments = torch.cat((token_type_ids, visual_segment), 1)
        text_positions = torch.arange(text_length, device=input_ids.device).expand(batch, -1)
        region_positions = text_lengths.unsqueeze(1).expand(-1, num_regions)
        end_position = (text_lengths + 1).unsqueeze(1)
        positions = torch.cat((text_positions, region_positions, end_position), 1)

        embeddings = tokens + self.position_embeddings(positions) + self.token_type_embeddings(segments)
        embeddings = self.dropout(self.layer_norm(embeddings))
        attention_mask = torch.cat((text_mask, box_mask, text_mask.new_ones(batch, 1)), 1)
        return embeddings, attention_mask

    def _mask_features(
        self, appearance: torch.Tensor, box_mask: torch.Tensor, masked_regions: torch.Tensor
    ) -> torch.Tensor:
        """Replace masked RoIs' features by the learned vector; whole image := mean of visible boxes.

        Cached features have no pixel-masked variants, so the whole-image box (0), which would
        otherwise show the masked RoIs' content, is rebuilt from the boxes that stay visible; in
        every sample, so that samples with and without masked RoIs (and evaluation) agree.
        """
        objects = box_mask.clone()
        objects[:, 0] = False
        masked = masked_regions & objects
        visible = (objects & ~masked).unsqueeze(-1).to(appearance.dtype)
        whole_image = (appearance * visible).sum(1) / visible.sum(1).clamp(min=1.0)
        replaced = torch.where(masked.unsqueeze(-1), self.masked_appearance.to(appearance.dtype), appearance)
        return torch.cat((whole_image.unsqueeze(1), replaced[:, 1:]), 1)


# ----------------------------------------------------------------------------------------------
# Encoder
# ----------------------------------------------------------------------------------------------


def bert_config(config: VLBertConfig) -> BertConfig:
    """The `transformers` config of the encoder, with SDPA attention."""
    return BertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_eps,
        initializer_range=config.initializer_range,
        pad_token_id=config.pad_token_id,
        attn_implementation="sdpa",
    )


class TransformersBertLayers(BertEncoder):
    """`transformers`' BERT layers (SDPA attention); eager attention only when probabilities are asked for."""

    def __init__(self, config: VLBertConfig):
        super().__init__(bert_config(config))

    def encode(self, hidden: torch.Tensor, additive_mask: torch.Tensor,
               output_attentions: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        if not output_attentions:
            return self(hidden, attention_mask=additive_mask).last_hidden_state, None
        with self._recording_attention() as attentions:
            # output_attentions: transformers 4.x's SDPA attention then runs eagerly and returns its
            # probabilities; 5.x's reads the config's implementation and takes the argument as a no-op
            hidden = self(hidden, attention_mask=additive_mask, output_attentions=True).last_hidden_state
        return hidden, tuple(attentions)

    @contextlib.contextmanager
    def _recording_attention(self):
        previous = self.config._attn_implementation
        self.config._attn_implementation = "eager"  # SDPA does not expose its probabilities (transformers 5.x)
        attentions: list[torch.Tensor] = []
        hooks = [
            layer.attention.self.register_forward_hook(lambda _module, _inputs, output: attentions.append(output[1]))
            for layer in self.layer
        ]
        try:
            yield attentions
        finally:
            for hook in hooks:
                hook.remove()
            self.config._attn_implementation = previous


# The three projections of BERT's attention, in the order of the fused layer's rows.
PROJECTIONS = ("query", "key", "value")


class FusedSelfAttention(nn.Module):
    """BERT's self-attention with its query, key and value projections as one linear layer: one GEMM
    instead of three. Its state dict holds them apart, under BERT's names (`query.weight`, ...), so that
    every checkpoint loads into it and it saves what `transformers`' layers save."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.scale = (config.hidden_size // config.num_attention_heads) ** -0.5  # as transformers' BERT computes it
        self.dropout = config.attention_probs_dropout_prob
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.register_state_dict_post_hook(_split_projections)
        self.register_load_state_dict_pre_hook(_join_projections)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor,
                attentions: list[torch.Tensor] | None) -> torch.Tensor:
        """`attentions`: a list the attention probabilities (B, heads, L, L) are appended to; None: SDPA."""
        batch, length, width = hidden.shape
        query, key, value = self.qkv(hidden).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        if attentions is None:
            context = F.scaled_dot_product_attention(query, key, value, attn_mask=additive_mask, dropout_p=dropout,
                                                     scale=self.scale)
        else:
            probabilities = F.dropout((query @ key.transpose(2, 3) * self.scale + additive_mask).softmax(-1), dropout)
            attentions.append(probabilities)
            context = probabilities @ value
        return context.transpose(1, 2).reshape(batch, length, width)


def _split_projections(_module: FusedSelfAttention, state: dict, prefix: str, _metadata) -> None:
    fused = {kind: state.pop(f"{prefix}qkv.{kind}").chunk(3) for kind in ("weight", "bias")}
    for index, name in enumerate(PROJECTIONS):  # in transformers' order
        for kind, parts in fused.items():
            state[f"{prefix}{name}.{kind}"] = parts[index].clone()  # apart: safetensors refuses shared storage


def _join_projections(_module: FusedSelfAttention, state: dict, prefix: str, *_) -> None:
    for kind in ("weight", "bias"):
        names = [f"{prefix}{name}.{kind}" for name in PROJECTIONS]
        if all(name in state for name in names):
            state[f"{prefix}qkv.{kind}"] = torch.cat([state.pop(name) for name in names])


class ResidualNorm(nn.Module):
    """Dense, dropout, then LayerNorm of the sum with the block's input: the end of each BERT sub-layer."""

    def __init__(self, config: VLBertConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # BERT's checkpoint name
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, block_input: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + block_input)


class FusedAttention(nn.Module):
    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.self = FusedSelfAttention(config)
        self.output = ResidualNorm(config, config.hidden_size)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor,
                attentions: list[torch.Tensor] | None) -> torch.Tensor:
        return self.output(self.self(hidden, additive_mask, attentions), hidden)


class Intermediate(nn.Module):
    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACT2FN[config.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden))


class FusedLayer(nn.Module):
    """One post-LayerNorm BERT layer, its modules named as BERT's checkpoints name them."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.attention = FusedAttention(config)
        self.intermediate = Intermediate(config)
        self.output = ResidualNorm(config, config.intermediate_size)

    def forward(self, hidden: torch.Tensor, additive_mask: torch.Tensor,
                attentions: list[torch.Tensor] | None) -> torch.Tensor:
        attended = self.attention(hidden, additive_mask, attentions)
        return self.output(self.intermediate(attended), attended)


class FusedBertLayers(nn.Module):
    """BERT's layers as this library writes them: the query, key and value projections one GEMM
    (`FusedSelfAttention`), SDPA attention, the same state dict as `TransformersBertLayers`."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.layer = nn.ModuleList(FusedLayer(config) for _ in range(config.num_hidden_layers))

    def encode(self, hidden: torch.Tensor, additive_mask: torch.Tensor,
               output_attentions: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        attentions: list[torch.Tensor] | None = [] if output_attentions else None
        for layer in self.layer:
            hidden = layer(hidden, additive_mask, attentions)
        return hidden, None if attentions is None else tuple(attentions)


# The implementations of the encoder's layers, by name: each takes a VLBertConfig, encodes with
# `encode(hidden, additive_mask, output_attentions)`, and holds the same state dict.
ENCODER_LAYERS: dict[str, type[nn.Module]] = {"transformers": TransformersBertLayers, "fused": FusedBertLayers}
DEFAULT_ENCODER_LAYERS = "transformers"


class VLBertEncoder(nn.Module):
    """BERT's layers over the embedded sequence, in one of ENCODER_LAYERS' implementations (`use_layers`)."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.config = config
        self.bert = ENCODER_LAYERS[DEFAULT_ENCODER_LAYERS](config)
        self.length_multiple = 1  # `pad_sequences_to`

    @property
    def layers(self) -> str:
        """The name of the implementation its layers run in (ENCODER_LAYERS)."""
        return next(name for name, kind in ENCODER_LAYERS.items() if type(self.bert) is kind)

    def use_layers(self, name: str) -> None:
        """Runs the layers in implementation `name` (ENCODER_LAYERS), with the same weights (the fused
        projections a copy of the three, the rest the same tensors) and the same training mode; draws
        no random numbers. Call it before an optimiser is given the model's parameters."""
        if name not in ENCODER_LAYERS:
            raise ValueError(f"encoder layers {name!r}: expected one of {', '.join(ENCODER_LAYERS)}")
        if name == self.layers:
            return
        with torch.device("meta"):
            layers = ENCODER_LAYERS[name](self.config)
        layers.load_state_dict(self.bert.state_dict(), assign=True)
        self.bert = layers.train(self.training)

    def pad_sequences_to(self, multiple: int) -> None:
        """Pads every sequence to a multiple of `multiple` elements, so that a few shapes cover every batch
        (each shape costs a compiled graph, or a cuDNN attention plan). The padding is masked out of
        attention and cut off the output: real elements see the same."""
        self.length_multiple = multiple

    def forward(
        self, embeddings: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        length = embeddings.shape[1]
        if not output_attentions and self.length_multiple > 1:
            # Padded elements are masked out of attention and cut off the output: real ones see the same.
            padding = -length % self.length_multiple
            embeddings = F.pad(embeddings, (0, 0, 0, padding))
            attention_mask = F.pad(attention_mask, (0, padding), value=False)
        additive_mask = torch.zeros(attention_mask.shape, dtype=embeddings.dtype, device=embeddings.device)
        additive_mask = additive_mask.masked_fill(~attention_mask, torch.finfo(embeddings.dtype).min)
        hidden, attentions = self.bert.encode(embeddings, additive_mask[:, None, None, :], output_attentions)
        return hidden[:, :length], attentions


# ----------------------------------------------------------------------------------------------
# Base model, weights, save and load
# ----------------------------------------------------------------------------------------------


# The outputs are transformers' ModelOutputs: read by name (`output.logits`), by key (`output["logits"]`) or
# by index (`output[0]`: the loss where one was computed, as transformers' models do), the fields left
# None counting as absent.
@dataclass
class VLBertOutput(ModelOutput):
    last_hidden_state: torch.Tensor | None = None  # (B, T + N + 1, H): text, RoIs, [END]
    attention_mask: torch.Tensor | None = None  # (B, T + N + 1) bool
    text_length: int | None = None  # T
    num_regions: int | None = None  # N
    pooled_output: torch.Tensor | None = None  # (B, H) dense + tanh on [CLS]
    attentions: tuple[torch.Tensor, ...] | None = None  # per layer (B, heads, L, L)

    @property
    def text_hidden_state(self) -> torch.Tensor:
        return self.last_hidden_state[:, : self.text_length]

    @property
    def region_hidden_state(self) -> torch.Tensor:
        return self.last_hidden_state[:, self.text_length : self.text_length + self.num_regions]


class Pooler(nn.Module):
    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0]))


# Every VL-BERT model class by name, as config.json records it: `load_pretrained` finds a saved
# model's class here. A class registers itself by subclassing VLBertPreTrainedModel.
TASK_MODELS: dict[str, type[VLBertPreTrainedModel]] = {}


class VLBertPreTrainedModel(nn.Module):
    """Weight initialisation and `save_pretrained` / `from_pretrained` for every VL-BERT model."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        TASK_MODELS[cls.__name__] = cls

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.config = config
        # The folder of the tokenizer the model reads its text with, whose files `save_pretrained` copies
        # beside the weights (the folder it was loaded from, where that holds them; a trainer's vocabulary).
        self.tokenizer_source: Path | None = None
        # The keys of the config.json it was loaded from that this version does not know, written back.
        self.kept_config: dict[str, Any] = {}

    def pad_sequences_to(self, multiple: int) -> None:
        """Every encoder of the model pads its sequences to a multiple of `multiple` (`VLBertEncoder`)."""
        for encoder in (module for module in self.modules() if isinstance(module, VLBertEncoder)):
            encoder.pad_sequences_to(multiple)

    def use_encoder_layers(self, name: str) -> None:
        """Every encoder of the model runs its layers in implementation `name` (`ENCODER_LAYERS`: "fused"
        computes the query, key and value projections in one GEMM), with the same weights and state dict
        (`VLBertEncoder.use_layers`). Before an optimiser is given the model's parameters: the fused
        projections are new ones."""
        for encoder in (module for module in self.modules() if isinstance(module, VLBertEncoder)):
            encoder.use_layers(name)

    def reads_pooled_output(self) -> bool:
        """Whether a head of the model reads the backbone's pooled [CLS] (`VLBertModel.pooler`)."""
        return True

    def skip_unread_pooler(self) -> None:
        """Where no head of the model reads the pooled [CLS], its backbone stops computing it: a dense
        layer and a tanh less each forward, the same losses bit for bit. The pooler's weights stay, and
        are saved, as they were."""
        if not self.reads_pooled_output():
            for backbone in (module for module in self.modules() if isinstance(module, VLBertModel)):
                backbone.pools = False

    def init_weights(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.modules():  # after the generic pass, which would reset the visual gains
            if isinstance(module, VLBertEmbeddings):
                for vector in (module.image_token, module.masked_image_token, module.end_token, module.text_only_visual):
                    nn.init.normal_(vector, std=std)
                nn.init.zeros_(module.masked_appearance)
                nn.init.constant_(module.text_visual_norm.weight, self.config.visual_gain_init)
                nn.init.constant_(module.region_visual_norm.weight, self.config.visual_gain_init)
        self._init_head_weights()

    def _init_head_weights(self) -> None:
        """Task models override this for heads whose initialisation is not N(0, 0.02)."""

    def _init_heads_from(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Task models override this to initialise absent heads from a checkpoint's other heads."""

    def save_pretrained(self, directory: str | Path) -> None:
        """A model folder (vlbert.model_folder): config.json, the weights, and the tokenizer's files where the
        model knows them (`tokenizer_source`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_config(directory, self.config, type(self).__name__, self.kept_config)
        state = {name: tensor.detach().contiguous().cpu() for name, tensor in self.state_dict().items()}
        save_file(state, directory / WEIGHTS_NAME, metadata={"format": "pt"})
        if self.tokenizer_source is not None:
            copy_tokenizer(self.tokenizer_source, directory)

    # The state-dict names that `from_pretrained` found no weights for under their own names in the
    # checkpoint (another task's, or this task's with other heads: new heads, a pooler): they start from
    # their initialisation, or from another head's (`_init_heads_from`). Empty for a checkpoint of this
    # model with these heads, which loads strictly.
    fresh_weights: tuple[str, ...] = ()

    @property
    def backbone_prefix(self) -> str:
        """Where the shared VL-BERT weights sit in this model's state dict."""
        return "" if isinstance(self, VLBertModel) else "vlbert."

    @classmethod
    def from_pretrained(cls, name: str | Path, config: Any = None, **options: Any) -> VLBertPreTrainedModel:
        """Load a model folder written by `save_pretrained`, named by its path or by a Hugging Face Hub id
        (`org/name`, vlbert.model_folder). `options`: VLBertConfig fields replacing the saved ones, and
        HUB_OPTIONS (revision, cache_dir, ...); `config`, a VLBertConfig or transformers'
        VLBertTransformersConfig (AutoModel passes one), replaces the folder's config.

        A checkpoint of another task (typically pre-training) gives the shared VL-BERT weights and
        the heads of the same name (pre-training's relationship head to retrieval's); this task's
        other heads start fresh or from the matching pre-training head (`fresh_weights` names them).
        """
        directory, saved = _saved_model(name, options)
        return cls._from_saved(directory, saved, config, options)

    @classmethod
    def _from_saved(cls, directory: Path, saved: SavedConfig, config: Any, options: dict[str, Any]
                    ) -> VLBertPreTrainedModel:
        for argument in AUTO_MODEL_ARGUMENTS:
            options.pop(argument, None)
        fields = (saved.fields if config is None else config.to_dict() if isinstance(config, VLBertConfig)
                  else vlbert_fields(config))
        try:
            model = cls(VLBertConfig.from_dict({**fields, **options}))
        except VLBertConfigError as exc:
            source = "from_pretrained's options" if getattr(exc, "key", None) in options else directory / CONFIG_NAME
            raise VLBertConfigError(f"{source}: {exc}") from None
        model._load_weights(directory, saved.architecture or cls.__name__)
        model.kept_config = saved.kept
        model.tokenizer_source = directory if vocabulary_file(directory) != directory else None
        return model

    def _load_weights(self, directory: Path, architecture: str) -> None:
        """The folder's weights, saved by a model of class `architecture`."""
        state = load_file(directory / WEIGHTS_NAME)
        saved_prefix = "" if architecture == VLBertModel.__name__ else "vlbert."
        backbone = {name[len(saved_prefix) :]: tensor for name, tensor in state.items() if name.startswith(saved_prefix)}
        self.check_backbone_shapes(backbone, directory)
        if architecture == type(self).__name__ and set(state) == set(self.state_dict()):
            self.load_state_dict(state, strict=True)
            return
        # Another task's checkpoint, or this task's with other heads (retrieval's matching head against
        # its relationship head): the shared weights, and the heads both have.
        heads = {name: tensor for name, tensor in state.items() if not name.startswith(saved_prefix)}
        self.load_backbone(backbone, source=str(directory))
        own = self.state_dict()
        shared_heads = {name: tensor for name, tensor in heads.items() if name in own}
        self.load_state_dict(shared_heads, strict=False)  # pre-training's relationship head into retrieval's
        self._init_heads_from(heads)
        given = {self.backbone_prefix + name for name in backbone} | set(shared_heads)
        self.fresh_weights = tuple(name for name in own if name not in given)

    @classmethod
    def from_bert(cls, bert_directory: str | Path, **config_overrides) -> VLBertPreTrainedModel:
        """A new model whose text side comes from a BERT checkpoint directory saved by `transformers`.

        Word, position and segment A/B embeddings, the embedding LayerNorm, the encoder, the
        pooler and the MLM head transform are BERT's; the [IMG]/[END]/visual parameters and
        segment 2 are new, N(0, 0.02). The config is BERT's sizes (`BERT_SIZES`: `config_overrides` of
        them are dropped, its weights fix them) and, unless `config_overrides` replace them, its
        `BERT_DEFAULTS`; VLBertConfig's defaults for the rest.
        """
        bert = BertConfig.from_pretrained(bert_directory)
        given = {name: getattr(bert, name) for name in BERT_SIZES + BERT_DEFAULTS}
        overrides = {name: value for name, value in config_overrides.items() if name not in BERT_SIZES}
        model = cls(VLBertConfig(**{**given, **overrides}))
        backbone, heads = read_bert_weights(bert_directory)
        segments = backbone.pop("embeddings.token_type_embeddings.weight")
        own_segments = model.state_dict()[model.backbone_prefix + "embeddings.token_type_embeddings.weight"].clone()
        own_segments[: segments.shape[0]] = segments
        if segments.shape[0] == 1:  # single-segment checkpoints: B starts as A
            own_segments[1] = segments[0]
        backbone["embeddings.token_type_embeddings.weight"] = own_segments
        model.load_backbone(backbone, source=str(bert_directory), new_ok=True)
        model._init_heads_from(heads)
        return model

    def check_backbone_shapes(self, weights: dict[str, torch.Tensor], directory: Path) -> None:
        """VLBertConfigError when a saved weight of the shared VL-BERT (names as in `VLBertModel`) has
        another shape than the folder's config gives it: a config.json edited, or from another model."""
        own = self.state_dict()
        for name, tensor in weights.items():
            expected = own.get(self.backbone_prefix + name)
            if expected is not None and expected.shape != tensor.shape:
                raise VLBertConfigError(f"{directory}: its {CONFIG_NAME} does not match its {WEIGHTS_NAME}: {name} "
                                        f"is {tuple(tensor.shape)} there, {tuple(expected.shape)} for the config")

    def load_backbone(self, weights: dict[str, torch.Tensor], source: str, new_ok: bool = False) -> None:
        """Load the shared VL-BERT weights (names as in `VLBertModel`); with `new_ok` (a BERT
        checkpoint), the VL-BERT-only parameters may be absent and keep their initialisation."""
        own = {name[len(self.backbone_prefix) :] for name in self.state_dict() if name.startswith(self.backbone_prefix)}
        wanted = {name: tensor for name, tensor in weights.items() if name in own}
        # A checkpoint without a pooler (VL-BERT pre-training, BertForMaskedLM) leaves it fresh, as the reference.
        absent = [name for name in sorted(own - set(wanted)) if not name.startswith("pooler.")]
        if new_ok:
            absent = [name for name in absent if not name.startswith(VISUAL_PARAMETER_PREFIXES)]
        if absent:
            raise ValueError(f"{source} lacks VL-BERT weights: {absent}")
        self.load_state_dict({self.backbone_prefix + name: tensor for name, tensor in wanted.items()}, strict=False)


# Parameters of VL-BERT that a text-only BERT checkpoint does not have.
VISUAL_PARAMETER_PREFIXES = (
    "embeddings.visual_feature_embedding.",
    "embeddings.text_visual_norm.",
    "embeddings.region_visual_norm.",
    "embeddings.image_token",
    "embeddings.masked_image_token",
    "embeddings.end_token",
    "embeddings.text_only_visual",
    "embeddings.masked_appearance",
)


def read_bert_weights(directory: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A BERT checkpoint's weights renamed to this library: (VL-BERT backbone, heads).

    Accepts `BertModel` and `BertForPreTraining`/`BertForMaskedLM` saves (`bert.` prefix),
    safetensors or PyTorch pickles, and the old `gamma`/`beta` LayerNorm names. The next-sentence
    head becomes the relationship head with its rows in this library's order (1 = matches).
    """
    directory = Path(directory)
    if (directory / WEIGHTS_NAME).is_file():
        state = load_file(directory / WEIGHTS_NAME)
    elif (directory / "pytorch_model.bin").is_file():
        state = load_weights_only(directory / "pytorch_model.bin")
    else:
        raise FileNotFoundError(f"{directory} has neither {WEIGHTS_NAME} nor pytorch_model.bin")
    backbone: dict[str, torch.Tensor] = {}
    heads: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        name = name.removeprefix("bert.").replace(".gamma", ".weight").replace(".beta", ".bias")
        if name.startswith("embeddings.LayerNorm."):
            backbone[name.replace("embeddings.LayerNorm.", "embeddings.layer_norm.")] = tensor
        elif name.startswith(("embeddings.word_", "embeddings.position_emb", "embeddings.token_type_emb")):
            backbone[name] = tensor
        elif name.startswith("encoder."):
            backbone["encoder.bert." + name.removeprefix("encoder.")] = tensor
        elif name.startswith("pooler."):
            backbone[name] = tensor
        elif name.startswith("cls.predictions.transform."):
            head_name = name.replace("cls.predictions.transform.", "mlm_head.transform.")
            heads[head_name.replace(".LayerNorm.", ".layer_norm.")] = tensor
        elif name == "cls.predictions.bias":
            heads["mlm_head.bias"] = tensor
        elif name.startswith("cls.seq_relationship."):
            # BERT's row 0 is IsNext, this library's label 1 is "matches": the rows swap.
            heads[name.replace("cls.seq_relationship.", "relationship_head.classifier.")] = tensor.flip(0)
    return backbone, heads


class VLBertModel(VLBertPreTrainedModel):
    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.embeddings = VLBertEmbeddings(config)
        self.encoder = VLBertEncoder(config)
        self.pooler = Pooler(config) if config.with_pooler else None
        self.pools = True  # False: pooled_output is None (`skip_unread_pooler`)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        text_mask: torch.Tensor,
        appearance: torch.Tensor | None = None,
        boxes: torch.Tensor | None = None,
        box_mask: torch.Tensor | None = None,
        image_size: torch.Tensor | None = None,
        text_box_index: torch.Tensor | None = None,
        masked_regions: torch.Tensor | None = None,
        feature_masking: bool = False,
        output_attentions: bool = False,
    ) -> VLBertOutput:
        """Encode text (B, T) and RoIs (B, N, ·); leave `appearance` None for a text-only batch.

        input_ids, token_type_ids, text_mask: (B, T) from the sequence builders (`[CLS] … [SEP]`).
        appearance: (B, N, visual_feature_size) RoI features, box 0 = whole image.
        boxes: (B, N, 4) x1, y1, x2, y2 in pixels; image_size: (B, 2) width, height.
        box_mask: (B, N) real RoIs; a row without any is a text-only sample.
        text_box_index: (B, T) box whose visual feature each word gets (default 0, the whole image).
        masked_regions: (B, N) RoIs whose [IMG] token is replaced by the masked-RoI token.
        feature_masking: for cached features without pixel-masked variants (the reference's
            precomputed-feature mode): masked RoIs' appearance becomes a learned vector (zero at
            first) and the whole-image appearance the mean of the visible boxes, in every sample.
        """
        if appearance is not None and (boxes is None or box_mask is None or image_size is None):
            raise ValueError("appearance needs boxes, box_mask and image_size")
        embeddings, attention_mask = self.embeddings(
            input_ids,
            token_type_ids,
            text_mask,
            appearance,
            boxes,
            box_mask,
            image_size,
            text_box_index,
            masked_regions,
            feature_masking,
        )
        hidden, attentions = self.encoder(embeddings, attention_mask, output_attentions)
        return VLBertOutput(
            last_hidden_state=hidden,
            attention_mask=attention_mask,
            text_length=input_ids.shape[1],
            num_regions=embeddings.shape[1] - input_ids.shape[1] - 1,
            pooled_output=self.pooler(hidden) if self.pooler is not None and self.pools else None,
            attentions=attentions,
        )


# ----------------------------------------------------------------------------------------------
# Heads
# ----------------------------------------------------------------------------------------------


class HeadTransform(nn.Module):
    """Dense → activation (→ LayerNorm), as BERT's prediction-head transform."""

    def __init__(self, config: VLBertConfig, with_layer_norm: bool):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if with_layer_norm else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation(self.dense(hidden_states))
        return self.layer_norm(hidden_states) if self.layer_norm is not None else hidden_states


class PredictionHead(nn.Module):
    """(Transform →) Dropout → Linear."""

    def __init__(self, config: VLBertConfig, num_outputs: int, transform: str = "none", dropout: float = 0.0):
        super().__init__()
        if transform not in ("none", "dense", "dense_norm"):
            raise ValueError(f"unknown head transform {transform!r}")
        self.transform = None if transform == "none" else HeadTransform(config, transform == "dense_norm")
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, num_outputs)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.transform is not None:
            hidden_states = self.transform(hidden_states)
        return self.classifier(self.dropout(hidden_states))


class MaskedLanguageModelingHead(nn.Module):
    """BERT's MLM head; the decoder is the word-embedding matrix itself (tied)."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.transform = HeadTransform(config, with_layer_norm=True)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(hidden_states), word_embeddings, self.bias)


def _xavier_classifier(head: PredictionHead) -> None:
    # The reference initialises its fine-tuning classifiers this way.
    nn.init.xavier_uniform_(head.classifier.weight)
    nn.init.zeros_(head.classifier.bias)


def _copy_transform(target: HeadTransform, state_dict: dict[str, torch.Tensor], prefix: str) -> None:
    """Start a fine-tuning head's transform from a pre-training head's, when the checkpoint has it."""
    names = list(target.state_dict())
    if all(prefix + name in state_dict for name in names):
        target.load_state_dict({name: state_dict[prefix + name] for name in names})


# ----------------------------------------------------------------------------------------------
# Task models
# ----------------------------------------------------------------------------------------------


@dataclass
class PreTrainingOutput(ModelOutput):
    loss: torch.Tensor | None = None  # the sum of the losses computed
    # Without mlm_labels, (B, T, vocab): every text position. With them, (M, vocab): only the M
    # labelled positions (mlm_labels != -100, in row-major order), all that the loss reads.
    mlm_logits: torch.Tensor | None = None
    region_logits: torch.Tensor | None = None  # (B, N, detector classes)
    relationship_logits: torch.Tensor | None = None  # (B, 2)
    mlm_loss: torch.Tensor | None = None
    region_loss: torch.Tensor | None = None
    relationship_loss: torch.Tensor | None = None
    vlbert: VLBertOutput | None = None


@dataclass
class TaskOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    vlbert: VLBertOutput | None = None


class VLBertForPreTraining(VLBertPreTrainedModel):
    """Masked language modelling, masked RoI classification, and optionally the sentence–image relationship."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        if config.with_relationship_head and not config.with_pooler:
            raise ValueError("the relationship head needs with_pooler=True")
        self.vlbert = VLBertModel(config)
        self.mlm_head = MaskedLanguageModelingHead(config)
        self.region_head = PredictionHead(config, config.num_detector_classes, transform="dense")
        self.relationship_head = PredictionHead(config, 2) if config.with_relationship_head else None
        self.init_weights()

    def _init_heads_from(self, state_dict: dict[str, torch.Tensor]) -> None:
        own = self.state_dict()
        found = {name: tensor for name, tensor in state_dict.items() if name in own}
        self.load_state_dict(found, strict=False)

    def reads_pooled_output(self) -> bool:
        return self.relationship_head is not None

    def forward(
        self,
        *,
        mlm_labels: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
        region_labels: torch.Tensor | None = None,
        relationship_labels: torch.Tensor | None = None,
        **inputs,
    ) -> PreTrainingOutput:
        """`inputs` as `VLBertModel.forward`; labels: mlm (B, T) ids or -100, region (B, N, classes)
        detector class distributions (all-zero rows are not predicted), relationship (B,) 1 = matching.

        With `mlm_labels`, the vocabulary-wide MLM head runs on the labelled positions only (about
        15% of the text), so `mlm_logits` holds their rows alone. `mlm_positions` (M,): those
        positions as indices into the flattened (B × T) text, in row-major order, as the batches
        bring them (`train.data.collate`); without them they are found here, which syncs with the
        host once (their count)."""
        encoded = self.vlbert(**inputs)
        text = encoded.text_hidden_state
        if mlm_labels is not None:
            if mlm_positions is None:
                mlm_positions = (mlm_labels.flatten() != losses.IGNORE_INDEX).nonzero().squeeze(1)
            rows, columns = mlm_positions // text.shape[1], mlm_positions % text.shape[1]
            text, mlm_labels = text[rows, columns], mlm_labels[rows, columns]
        mlm_logits = self.mlm_head(text, self.vlbert.embeddings.word_embeddings.weight)
        region_logits = self.region_head(encoded.region_hidden_state) if encoded.num_regions else None
        relationship_logits = (
            self.relationship_head(encoded.pooled_output) if self.relationship_head is not None else None
        )
        mlm_loss = losses.masked_lm_loss(mlm_logits, mlm_labels) if mlm_labels is not None else None
        region_loss = (losses.soft_cross_entropy(region_logits, region_labels)
                       if region_labels is not None and region_logits is not None else None)
        relationship_loss = None
        if relationship_labels is not None:
            if relationship_logits is None:
                raise ValueError("relationship_labels given but the model has no relationship head")
            relationship_loss = F.cross_entropy(relationship_logits.float(), relationship_labels)
        terms = [term for term in (mlm_loss, region_loss, relationship_loss) if term is not None]
        return PreTrainingOutput(loss=torch.stack(terms).sum() if terms else None, mlm_logits=mlm_logits,
                                 region_logits=region_logits, relationship_logits=relationship_logits,
                                 mlm_loss=mlm_loss, region_loss=region_loss, relationship_loss=relationship_loss,
                                 vlbert=encoded)


class VLBertForQuestionAnswering(VLBertPreTrainedModel):
    """VQA: `[CLS] question [SEP] [MASK] [SEP]`, answer scores from the [MASK] element's output."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.vlbert = VLBertModel(config)
        self.answer_head = PredictionHead(
            config, config.num_answers, transform="dense_norm", dropout=config.classifier_dropout
        )
        self.init_weights()

    def _init_head_weights(self) -> None:
        _xavier_classifier(self.answer_head)

    def _init_heads_from(self, state_dict: dict[str, torch.Tensor]) -> None:
        _copy_transform(self.answer_head.transform, state_dict, "mlm_head.transform.")

    def reads_pooled_output(self) -> bool:
        return False

    def forward(self, *, answer_positions: torch.Tensor, labels: torch.Tensor | None = None, **inputs) -> TaskOutput:
        """answer_positions: (B,) index of [MASK] in the text; labels: (B, answers) soft VQA scores."""
        encoded = self.vlbert(**inputs)
        rows = torch.arange(answer_positions.shape[0], device=answer_positions.device)
        logits = self.answer_head(encoded.text_hidden_state[rows, answer_positions])
        loss = losses.answer_loss(logits, labels) if labels is not None else None
        return TaskOutput(loss=loss, logits=logits, vlbert=encoded)


class VLBertForMultipleChoice(VLBertPreTrainedModel):
    """VCR (Q→A, QA→R): one sequence per candidate, a score from each one's pooled [CLS]."""

    def __init__(self, config: VLBertConfig):
        if not config.with_pooler:
            raise ValueError("multiple choice needs with_pooler=True")
        super().__init__(config)
        self.vlbert = VLBertModel(config)
        self.choice_head = PredictionHead(config, 1, dropout=config.classifier_dropout)
        self.init_weights()

    def _init_head_weights(self) -> None:
        _xavier_classifier(self.choice_head)

    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        text_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
        text_box_index: torch.Tensor | None = None,
        **visual_inputs,
    ) -> TaskOutput:
        """Text tensors (B, C, T) for C candidates; visual tensors per image (B, N, ·); labels (B,)."""
        batch, choices, length = input_ids.shape

        def per_candidate(tensor: torch.Tensor | None) -> torch.Tensor | None:
            if tensor is None or not isinstance(tensor, torch.Tensor):
                return tensor
            return tensor.unsqueeze(1).expand(batch, choices, *tensor.shape[1:]).flatten(0, 1)

        encoded = self.vlbert(
            input_ids=input_ids.reshape(-1, length),
            token_type_ids=token_type_ids.reshape(-1, length),
            text_mask=text_mask.reshape(-1, length),
            text_box_index=None if text_box_index is None else text_box_index.reshape(-1, length),
            **{name: per_candidate(value) for name, value in visual_inputs.items()},
        )
        logits = self.choice_head(encoded.pooled_output).view(batch, choices)
        loss = losses.multiple_choice_loss(logits, labels) if labels is not None else None
        return TaskOutput(loss=loss, logits=logits, vlbert=encoded)


class VLBertForReferringExpressions(VLBertPreTrainedModel):
    """RefCOCO+: a grounding score for every RoI from its output."""

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.vlbert = VLBertModel(config)
        self.region_score_head = PredictionHead(config, 1, transform="dense", dropout=config.classifier_dropout)
        self.init_weights()

    def _init_head_weights(self) -> None:
        _xavier_classifier(self.region_score_head)

    def _init_heads_from(self, state_dict: dict[str, torch.Tensor]) -> None:
        _copy_transform(self.region_score_head.transform, state_dict, "region_head.transform.")

    def reads_pooled_output(self) -> bool:
        return False

    def forward(self, *, labels: torch.Tensor | None = None, **inputs) -> TaskOutput:
        """labels: (B, N) 1 for the RoIs the expression refers to; scored only where box_mask."""
        encoded = self.vlbert(**inputs)
        logits = self.region_score_head(encoded.region_hidden_state).squeeze(-1)
        loss = losses.grounding_loss(logits, labels, inputs["box_mask"]) if labels is not None else None
        return TaskOutput(loss=loss, logits=logits, vlbert=encoded)


class VLBertForImageTextMatching(VLBertPreTrainedModel):
    """Retrieval: an image–text matching score from the pooled [CLS]: a matching head's, or, with
    `config.with_relationship_head`, the pre-training sentence–image relationship head's log-odds of
    "matches", log p(match) − log p(no match), which ranks pairs as that head's matching probability
    does (sigmoid(score) is the probability) without the float ties of probabilities near 1."""

    def __init__(self, config: VLBertConfig):
        if not config.with_pooler:
            raise ValueError("image-text matching needs with_pooler=True")
        super().__init__(config)
        self.vlbert = VLBertModel(config)
        if config.with_relationship_head:
            self.relationship_head = PredictionHead(config, 2)
        else:
            self.match_head = PredictionHead(config, 1, dropout=config.classifier_dropout)
        self.init_weights()

    def score(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, H) pooled outputs → (B,) matching scores."""
        if self.config.with_relationship_head:
            logits = self.relationship_head(pooled).float()
            return logits[:, 1] - logits[:, 0]  # label 1 = the caption matches the image (pre-training's)
        return self.match_head(pooled).squeeze(-1)

    def forward(self, *, labels: torch.Tensor | None = None, **inputs) -> TaskOutput:
        """labels: (B,) 1 for a matching pair, 0 otherwise (binary cross-entropy, pair by pair); or
        (G, 1 + 2n) for G groups of pairs (positive first, then n negative captions and n negative
        images, as `RetrievalPairs` makes them): `config.matching_loss` of each group."""
        encoded = self.vlbert(**inputs)
        logits = self.score(encoded.pooled_output)
        loss = None
        if labels is not None and labels.dim() == 2:
            if labels.shape[1] % 2 == 0 or (_on_host(labels) and not bool((labels[:, 0] == 1).all()
                                                                          and (labels[:, 1:] == 0).all())):
                raise ValueError(f"labels {tuple(labels.shape)}: expected groups of a positive then an even "
                                 "number of negatives")
            loss = losses.MATCHING_LOSSES[self.config.matching_loss](logits.view(labels.shape), labels,
                                                                    self.config.matching_margin)
        elif labels is not None:
            loss = losses.binary_loss(logits, labels)
        return TaskOutput(loss=loss, logits=logits, vlbert=encoded)


class VLBertForSequenceClassification(VLBertPreTrainedModel):
    """Visual entailment (SNLI-VE): one of `config.num_labels` classes from the pooled [CLS]."""

    def __init__(self, config: VLBertConfig):
        if not config.with_pooler:
            raise ValueError("sequence classification needs with_pooler=True")
        super().__init__(config)
        self.vlbert = VLBertModel(config)
        self.classifier_head = PredictionHead(config, config.num_labels, dropout=config.classifier_dropout)
        self.init_weights()

    def _init_head_weights(self) -> None:
        _xavier_classifier(self.classifier_head)

    def forward(self, *, labels: torch.Tensor | None = None, **inputs) -> TaskOutput:
        """labels: (B,) class indices; -100 (unlabelled) is left out of the cross-entropy."""
        encoded = self.vlbert(**inputs)
        logits = self.classifier_head(encoded.pooled_output)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss=loss, logits=logits, vlbert=encoded)


class PairClassificationHead(nn.Module):
    """Two images' pooled outputs, joined → Dense → activation → LayerNorm → Dropout → Linear (the
    recipe of LXMERT's and UNITER's NLVR2 heads): two classes, false and true."""

    def __init__(self, config: VLBertConfig):
        super().__init__()
        width = 2 * config.hidden_size
        self.dense = nn.Linear(width, width)
        self.activation = ACT2FN[config.hidden_act]
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(width, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled: (2B, H), each pair's left then right image → (B, 2) logits."""
        joined = pooled.reshape(-1, 2 * pooled.shape[-1])
        return self.classifier(self.dropout(self.layer_norm(self.activation(self.dense(joined)))))


class VLBertForPairClassification(VLBertPreTrainedModel):
    """NLVR2: whether a statement is true of a pair of images. Each image is encoded with the
    statement (`[CLS] statement [SEP] [IMG]… [END]`); the two pooled [CLS] outputs, joined, are
    classified false (0) or true (1)."""

    def __init__(self, config: VLBertConfig):
        if not config.with_pooler:
            raise ValueError("pair classification needs with_pooler=True")
        super().__init__(config)
        self.vlbert = VLBertModel(config)
        self.pair_head = PairClassificationHead(config)
        self.init_weights()

    def _init_head_weights(self) -> None:
        _xavier_classifier(self.pair_head)

    def forward(self, *, labels: torch.Tensor | None = None, **inputs) -> TaskOutput:
        """inputs: 2B sequences, each pair's left then right image; labels: (B,) or, as a batch of
        B groups of two samples gives them, (B, 2) with both columns the pair's label; -100
        (unlabelled) is left out of the cross-entropy. Logits: (B, 2)."""
        encoded = self.vlbert(**inputs)
        logits = self.pair_head(encoded.pooled_output)
        if labels is not None and labels.dim() == 2:
            if labels.shape[1] != 2 or (_on_host(labels) and not bool((labels[:, 0] == labels[:, 1]).all())):
                raise ValueError(f"labels {tuple(labels.shape)}: expected one label per pair, given to both images")
            labels = labels[:, 0]
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss=loss, logits=logits, vlbert=encoded)


def _on_host(labels: torch.Tensor) -> bool:
    """Whether checking the labels' values costs nothing: on a GPU, reading a check's result makes the
    host wait for the device every step, and under torch.compile it would break the graph (training's
    labels come from the task's datasets, which make them as these checks expect)."""
    return labels.device.type == "cpu" and not torch.compiler.is_compiling()


def load_pretrained(name: str | Path, **options: Any) -> VLBertPreTrainedModel:
    """Load a model folder (a path or a Hub id, as `from_pretrained` takes them) as the task model it was
    saved from; `options` as `from_pretrained`'s."""
    directory, saved = _saved_model(name, options)
    if saved.architecture not in TASK_MODELS:
        raise ModelFolderError(f"{directory / CONFIG_NAME}: unknown architecture {saved.architecture!r}; known: "
                               f"{', '.join(sorted(TASK_MODELS))}")
    return TASK_MODELS[saved.architecture]._from_saved(directory, saved, None, options)


def _saved_model(name: str | Path, options: dict[str, Any]) -> tuple[Path, SavedConfig]:
    """The folder of model `name` and its config.json, the HUB_OPTIONS taken out of `options`."""
    directory = model_folder(name, **{key: options.pop(key) for key in HUB_OPTIONS if key in options})
    return directory, read_config(directory)


register_config()
register_models()

