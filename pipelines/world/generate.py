"""Writing and reading a world directory: PNG images, one JSONL annotation file per split, a corpus.

Layout:
    world.json              vocabulary, seed, split sizes, the generation config
    train.jsonl, val.jsonl  one image per line (see `image_record`)
    images/<split>/<id>.png
    corpus.txt              text-only corpus, one long sentence per line

Every image is drawn from its own generator seeded by (seed, index), so an image does not depend
on how many others are generated.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from pipelines.world.corpus import corpus_sentences
from pipelines.world.language import captions, questions, referring_expressions
from pipelines.world.render import render_scene
from pipelines.world.scene import MAX_OBJECTS, Scene, sample_scene
from pipelines.world.vocabulary import ATTRIBUTE_NAMES, CLASS_NAMES
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.paths import checked

SPLITS = ("train", "val")
VAL_SHARE = 0.2  # of the images, in the val split unless `WorldConfig.val_images` says otherwise
FORMAT_VERSION = 1


@dataclass(frozen=True)
class WorldConfig:
    # Images of the val split, the last of the world's (None: a fifth). Training images come first, so a
    # larger val split leaves the training split as it was and only adds evaluation items.
    val_images: int | None = None
    # Each scene holds 1 to `max_objects` objects, each count as likely. With fewer, fewer questions need
    # their object told apart from others (ablation.yaml uses 2; docs/notes/ablation.md, "Choosing the world", says what that changes).
    max_objects: int = MAX_OBJECTS
    questions_per_image: int = 6
    corpus_sentences: int = 2000
    # The share of training images that keep their VQA questions and referring expressions (every image
    # keeps its captions): below 1, a low-data fine-tuning regime beside caption pre-training over the
    # whole split, as VQA and RefCOCO+ annotate a subset of the images that captions cover. Which
    # images keep them is drawn apart from the scene, so images and captions are those of the full world.
    annotated_fraction: float = 1.0


def image_record(image_id: str, file: str, scene: Scene, rng: np.random.Generator,
                 config: WorldConfig, annotated: bool = True) -> dict[str, Any]:
    """The image's annotations; with `annotated` false its VQA questions and referring expressions are
    drawn (so the generator moves on as for any image) and left out."""
    objects = [{"class": o.shape, "attributes": o.attributes, "box": list(o.box)} for o in scene.objects]
    record = {
        "id": image_id,
        "file": file,
        "width": scene.width,
        "height": scene.height,
        "background": scene.background,
        "objects": objects,
        "captions": captions(scene, rng),
        "vqa": [dataclasses.asdict(q) for q in questions(scene, rng, config.questions_per_image)],
        "refs": [{"text": r.text, "object": r.target, "box": objects[r.target]["box"]}
                 for r in referring_expressions(scene, rng)],
    }
    return record if annotated else {**record, "vqa": [], "refs": []}


def _keeps_annotations(seed: int, index: int, fraction: float) -> bool:
    return fraction >= 1 or np.random.default_rng([seed, index, 1]).random() < fraction


def split_sizes(num_images: int, val_images: int | None = None) -> dict[str, int]:
    """The splits' sizes: `val_images` (default a fifth) in val, the rest, at least one, in train."""
    num_val = int(round(num_images * VAL_SHARE)) if val_images is None else val_images
    if num_val < 0:
        raise ValueError(f"val_images: expected at least 0, found {num_val}")
    if num_val >= num_images:
        raise ValueError(f"val_images: {num_val} of {num_images} images leaves none to train on")
    return {"train": num_images - num_val, "val": num_val}


def generate_world(out_dir: str | Path, num_images: int = 1000, seed: int = 0,
                   config: WorldConfig = WorldConfig()) -> dict[str, Any]:
    """Writes the world to `out_dir` and returns the contents of its world.json."""
    out_dir = Path(out_dir)
    sizes = split_sizes(num_images, config.val_images)
    index = 0
    for split in SPLITS:
        made_folder(out_dir / "images" / split)
        with checked(out_dir / f"{split}.jsonl").open("w") as annotations:
            for _ in range(sizes[split]):
                rng = np.random.default_rng([seed, index])
                scene = sample_scene(rng, config.max_objects)
                image_id = f"{index:06d}"
                file = f"images/{split}/{image_id}.png"
                Image.fromarray(render_scene(scene, rng)).save(checked(out_dir / file))
                annotated = split != "train" or _keeps_annotations(seed, index, config.annotated_fraction)
                annotations.write(json.dumps(image_record(image_id, file, scene, rng, config, annotated)) + "\n")
                index += 1
    corpus = corpus_sentences(np.random.default_rng([seed, 2**32 - 1]), config.corpus_sentences)
    write_atomically(out_dir / "corpus.txt", "\n".join(corpus) + "\n")
    meta = {
        "format_version": FORMAT_VERSION,
        "seed": seed,
        "num_images": num_images,
        "splits": sizes,
        "class_names": list(CLASS_NAMES),
        "attribute_names": list(ATTRIBUTE_NAMES),
        "config": dataclasses.asdict(config),
    }
    write_atomically(out_dir / "world.json", json.dumps(meta, indent=2) + "\n")
    return meta


def load_split(world_dir: str | Path, split: str) -> list[dict[str, Any]]:
    """The image records of one split, in order."""
    path = Path(world_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such split (generate the world with `vlbert world generate`)")
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def load_world_image(world_dir: str | Path, record: dict[str, Any]) -> np.ndarray:
    """(H, W, 3) uint8 RGB."""
    with Image.open(Path(world_dir) / record["file"]) as image:
        return np.array(image.convert("RGB"))
