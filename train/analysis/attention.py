"""One sample's attention, every layer and head, from each of its words to each of its regions: what
`vlbert analyze attention` draws (a grid of word × region heat maps, and for one word the regions
over the image shaded by attention, as VisualBERT's Figure 3).

A sample is a text of an annotation file with its image's regions, as the grounding analysis builds
it (`[CLS] text [SEP]`, the whole-image box, then the RoIs best first): `kind` picks the texts (the
captions, the referring expressions or the VQA questions) and `item` one of them, numbered from 0
in file order. A word's attention is the mean over its word pieces (as a phrase's in grounding);
values are attention probabilities, each word's row over every position summing to 1, so a row
over the regions sums to the share of the word's attention that goes to the image.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from extract.store.labels import Naming
from train.analysis.attention_figures import SampleAttention, draw_word_regions, draw_word_region_grid
from train.analysis.common import batch_text_attention, caption_sample, could_not_start, open_model
from train.data.annotations import AnnotationFile
from train.data.collate import collate
from train.data.files import DataError
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.device import check_device

# An annotation item kind → its text, for the kinds whose items are one text about the image.
TEXT_KINDS: dict[str, Callable[[Any], str]] = {"captions": lambda caption: caption,
                                               "refs": lambda ref: ref.text,
                                               "vqa": lambda question: question.question}


def read_item(annotations: Path, kind: str, item: int, keep: Callable[[str], bool]) -> tuple[Any, str, list | None]:
    """(the image's annotation, the item's text, its box for a referring expression) of the `item`-th
    text of `kind` in `annotations`; DataError when there is no such item or its image is not stored."""
    if kind not in TEXT_KINDS:
        raise DataError(f"--kind {kind!r}: expected one of {', '.join(TEXT_KINDS)}")
    file = AnnotationFile(annotations)
    positions = file.items(kind)
    if not 0 <= item < len(positions):
        held = f"items 0 to {len(positions) - 1}" if len(positions) else "none"
        raise DataError(f"{annotations}: --item {item}: the file has {len(positions)} {kind} ({held})")
    annotation, found = file.item(positions[item], kind)
    if not keep(annotation.image_id):
        raise DataError(f"{annotations}: --item {item}: its image {annotation.image_id} is not in the store")
    return annotation, TEXT_KINDS[kind](found), getattr(found, "box", None)


def word_pieces(tokenizer, text: str, pieces: int) -> tuple[list[str], np.ndarray]:
    """The words of `text` that the first `pieces` word pieces (those kept under the length cap) make,
    and (words, pieces) weights that average each word's pieces."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    owners = encoding.word_ids()[:pieces]
    order = list(dict.fromkeys(owners))
    weights = np.zeros((len(order), pieces))
    spans: dict[int, list[int]] = {}
    for piece, owner in enumerate(owners):
        weights[order.index(owner), piece] = 1.0
        start, end = encoding["offset_mapping"][piece]
        spans.setdefault(owner, [start, end])[1] = end
    weights /= weights.sum(1, keepdims=True)
    return [text[spans[owner][0]:spans[owner][1]] for owner in order], weights


def pick_word(words: list[str], word: str) -> int:
    """The position of `word` among the sample's words (the first, ignoring case); DataError naming them."""
    lowered = [w.lower() for w in words]
    if word.lower() not in lowered:
        raise DataError(f"--word {word!r}: not a word of the sample; its words are {' '.join(words)}")
    return lowered.index(word.lower())


@torch.no_grad()
def analyze_attention(model_dir: str | Path, store: str | Path, annotations: str | Path, vocabulary: str | Path,
                      out: str | Path, item: int = 0, kind: str = "captions", word: str | None = None,
                      images: str | Path | None = None, device: str = "cpu", max_length: int | None = None,
                      fresh_weights: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """OUT/attention.json (the sample's words, regions and every layer's and head's attention between
    them), OUT/attention.png (the heat maps) and with `word`, OUT/word-<position>.png (the regions over
    the image, from `images`, default the store's images root, shaded by that word's attention; a
    grey canvas where the image is not found, which `log` says). Every input is checked before the
    model runs."""
    from train.data.image_lookup import load_images

    torch_device = check_device(device)
    out = Path(out)
    with could_not_start():
        model, tokenizer, regions = open_model(Path(model_dir), Path(store), Path(vocabulary), torch_device,
                                               fresh_weights)
        annotation, text, box = read_item(Path(annotations), kind, item, regions.__contains__)
        sample, offsets = caption_sample(text, annotation.image_id, annotation.file, str(item), regions, tokenizer,
                                         max_length or model.config.max_position_embeddings)
        words, weights = word_pieces(tokenizer, text, len(offsets))
        if not words:
            raise DataError(f"{annotations}: --item {item}: its text has no word to analyse (it is empty, or only "
                            "spaces and characters the tokenizer drops)")
        chosen = pick_word(words, word) if word is not None else None
        made_folder(out)
    batch = collate([sample], tokenizer.pad_token_id)
    pieces = batch_text_attention(model, batch, torch_device)[0, :, :, 1:1 + len(offsets)].numpy()
    naming, record = Naming.of(regions.store.meta), regions.store[annotation.image_id]
    rois = range(len(sample.regions) - 1)
    labels = ["whole image"] + [naming.label(record, row) for row in rois]
    classes = ["whole image"] + [naming.class_name(record, row) for row in rois]
    result = SampleAttention(item, kind, annotation.image_id, text, words, labels, classes, sample.regions.boxes,
                             sample.regions.image_size, np.einsum("wp,lhpn->lhwn", weights, pieces), box)
    written = {"json": out / "attention.json", "heat_maps": draw_word_region_grid(result, out / "attention.png")}
    if chosen is not None:
        root = images if images is not None else regions.store.meta.get("images_root")
        found = load_images(root, [annotation.image_id], log) if root is not None else None
        pixels = found.pixels.get(annotation.image_id) if found is not None else None
        if pixels is None:
            log(f"{annotation.image_id}: " + (found.missing[annotation.image_id] if found is not None else
                                               "the store records no images root and --images was not given")
                + "; the regions are drawn on a grey canvas")
        written["word"] = draw_word_regions(result, chosen, pixels, out / f"word-{chosen:02d}.png")
    document = {"model": str(model_dir), "annotations": str(annotations), **result.record(),
                "files": {name: str(path) for name, path in written.items()}}
    write_atomically(written["json"], json.dumps(document))
    return document
