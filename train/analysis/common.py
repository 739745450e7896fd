"""What the analyses share: a saved model opened with its tokenizer and store (every input checked
before the first item), caption samples and the pieces of a character span, and the attention from
text positions to regions, read from the model as it evaluates (train.analysis.grounding, syntax,
attention, masked_words)."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import PreTrainedTokenizerFast

from extract.store.schema import StoreError, StoreMismatchError
from train.analysis.phrases import Phrase
from train.data.collate import model_inputs, to_device
from train.data.datasets import Sample
from train.data.files import DataError, read_json
from train.data.regions import RegionBank
from train.engine.config import model_settings
from vlbert.model_folder import saved_config
from vlbert.modeling import CONFIG_NAME, WEIGHTS_NAME, VLBertModel, VLBertPreTrainedModel
from vlbert.tokenization import build_caption_sequence, check_vocabulary_size, load_tokenizer


def text_region_attention(attentions: tuple[torch.Tensor, ...], text_length: int, num_regions: int) -> torch.Tensor:
    """(B, layers, heads, T, N): each layer's attention (B, heads, L, L) from the T text positions
    (which come first) to the N region elements (right after the text)."""
    stacked = torch.stack(attentions, 1).float()
    return stacked[:, :, :, :text_length, text_length:text_length + num_regions]


def pieces_mean(text_attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, layers, heads, N): `text_region_attention` rows averaged over the pieces of `mask` (B, T)."""
    weights = mask.float() / mask.sum(1, keepdim=True).clamp(min=1)
    return torch.einsum("blhtk,bt->blhk", text_attention, weights)


def load_model(model_dir: str | Path, device: torch.device, fresh_weights: bool = False,
               model_class: type[VLBertPreTrainedModel] = VLBertModel) -> VLBertPreTrainedModel:
    """The VL-BERT encoder of any task's `save_pretrained` folder, for reading its attention (or its
    `model_class`, with that model's heads); with `fresh_weights`, its config initialised afresh
    (seed 0): the same model before any training.
    DataError (RunConfigError for a config field) naming the file that cannot be read as saved."""
    model_dir = Path(model_dir)
    check_saved_config(model_dir)
    weights = model_dir / WEIGHTS_NAME
    if not weights.is_file():
        raise DataError(f"{model_dir}: not a saved model (no {WEIGHTS_NAME})")
    try:
        model = model_class.from_pretrained(model_dir)
    except SafetensorError as exc:
        raise DataError(f"{weights}: not a readable safetensors file ({exc}); truncated or damaged?") from None
    if fresh_weights:
        torch.manual_seed(0)
        model.init_weights()
    return model.to(device).eval()


def check_saved_config(model_dir: Path) -> None:
    """DataError unless the saved model folder holds a JSON config.json, RunConfigError unless it
    reads as a VL-BERT config (its fields, types and their own checks)."""
    path = model_dir / CONFIG_NAME
    if not path.is_file():
        raise DataError(f"{model_dir}: not a saved model (no {CONFIG_NAME})")
    values = read_json(path)
    if not isinstance(values, dict):
        raise DataError(f"{path}: expected a JSON object of VL-BERT config fields, found {type(values).__name__}")
    model_settings(saved_config(values, str(path)).fields, str(path))


def box_problem(box: list[float]) -> str | None:
    """Why an annotated box cannot be scored against, or None."""
    if not all(math.isfinite(value) for value in box):
        return "a coordinate is not a finite number"
    x1, y1, x2, y2 = box
    if x2 <= x1 or y2 <= y1:
        return "an empty or inverted box (x2 <= x1 or y2 <= y1)"
    return None


def left_out(phrases: list[Phrase]) -> list[dict[str, str]]:
    """The phrases whose box `box_problem` refuses: item id, phrase, box and problem, in order."""
    return [{"item_id": phrase.item_id, "phrase": phrase.phrase, "box": str(phrase.box), "problem": problem}
            for phrase in phrases if (problem := box_problem(phrase.box)) is not None]


def caption_sample(text: str, image_id: str, file: str, item_id: str, regions: RegionBank, tokenizer,
                   max_length: int) -> tuple[Sample, list[tuple[int, int]]]:
    """`[CLS] text [SEP]` with the image's RoIs, and the character offsets of the pieces kept under
    the length cap (piece k is at position k + 1)."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    image = regions[image_id]
    sequence = build_caption_sequence(tokenizer, list(encoding["input_ids"]), len(image), max_length)
    image = image.truncated(sequence.num_regions)
    return Sample(sequence, image, file, item_id=item_id), list(encoding["offset_mapping"][:len(sequence) - 2])


def span_pieces(offsets: list[tuple[int, int]], span: tuple[int, int], length: int) -> np.ndarray:
    """(length,) bool over the sequence: the pieces (at `offsets`, from position 1) that overlap the
    characters `span` (none for a span cut off entirely: every head then ties among all RoIs, the
    random baseline)."""
    inside = np.zeros(length, bool)
    inside[1:1 + len(offsets)] = [start < span[1] and end > span[0] for start, end in offsets]
    return inside


def batch_text_attention(model: VLBertModel, batch: dict[str, Any], device: torch.device) -> torch.Tensor:
    """(B, layers, heads, T, N) on the CPU: the model's attention from each text position to each
    region (`text_region_attention`), as the model sees them at evaluation; DataError naming the model
    when it gives no attention probabilities."""
    inputs = to_device(batch, device)
    given = model_inputs(model, inputs, training=False)
    output = model(**given, output_attentions=True)
    if not output.attentions or any(layer is None for layer in output.attentions):
        raise DataError(f"{getattr(model, 'name_or_path', '') or type(model).__name__}: the model gives no attention "
                        "probabilities (its encoder returned none): there is no attention to analyse")
    return text_region_attention(output.attentions, batch["text_mask"].shape[1], output.num_regions).cpu()


def piece_masks(inside: tuple[np.ndarray, ...], text_length: int) -> torch.Tensor:
    """(len(inside), T) bool: the masks over each sample's sequence, padded to the batch's text length."""
    masks = torch.zeros(len(inside), text_length, dtype=torch.bool)
    for row, mask in enumerate(inside):
        masks[row, :len(mask)] = torch.from_numpy(mask)
    return masks


@contextlib.contextmanager
def could_not_start() -> Iterator[None]:
    """A store that does not open, or a file or folder that cannot be read or made, before the
    analysis begins is a DataError (the command could not start, exit status 2); the same errors
    later, while analysing, stay what they are (the job failed, 1)."""
    try:
        yield
    except OSError as exc:
        raise DataError(f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc)) from exc
    except StoreMismatchError:
        raise  # already a could-not-start error
    except StoreError as exc:
        raise DataError(str(exc)) from exc


def open_model(model_dir: Path, store: Path, vocabulary: Path, device: torch.device, fresh_weights: bool,
               load: Callable[[Path, torch.device, bool], VLBertPreTrainedModel] = load_model,
               ) -> tuple[VLBertPreTrainedModel, PreTrainedTokenizerFast, RegionBank]:
    """The model (as `load` reads it), its tokenizer and the store; StoreMismatchError when the
    store's features are not the size the model takes, DataError when the vocabulary is not the model's."""
    model = load(model_dir, device, fresh_weights)
    tokenizer = load_tokenizer(vocabulary)
    check_vocabulary_size(tokenizer, model.config.vocab_size, vocabulary)
    regions = RegionBank(str(store))
    if regions.feature_dim != model.config.visual_feature_size:
        raise StoreMismatchError(f"{store}: holds {regions.feature_dim}-d features, but the model {model_dir} takes "
                                 f"visual_feature_size {model.config.visual_feature_size}; analyse it on a store "
                                 "of the detector it was trained with")
    return model, tokenizer, regions
