"""The Karpathy splits of Flickr30K and COCO (Karpathy and Fei-Fei 2015), the image–text retrieval
benchmarks' splits: `dataset_flickr30k.json` and `dataset_coco.json` from `caption_datasets.zip`.

Their format: {"images": [{"filename": str, "filepath": str (COCO only: train2014 | val2014),
"split": "train" | "val" | "test" | "restval", "sentences": [{"raw": str, "tokens": [...], ...}],
"imgid": int, "sentids": [...], "cocoid": int (COCO only)}], "dataset": str}. The file is read from
`--root`. Images are `flickr30k-images/<filename>` (the folder the Flickr30K archive unpacks) resp.
`<filepath>/<filename>` (the COCO 2014 folders) under `--images`. Splits as published: `train`,
`val`, `test`, and for COCO `restval` (the rest of val2014, which retrieval work adds to training).
One record per image with captions (each sentence's `raw`, surrounding whitespace removed; a blank
one is skipped with its reason), in the file's order, with `image_id` the COCO id (`cocoid`) resp.
the file's `imgid`; skipped.jsonl names an image by that id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from train.data.files import DataError, read_json, shown
from train.data.prepare import Preparation, Source
from train.data.sources.captions import CaptionedImage, add_captioned_images


@dataclass
class KarpathyImage(CaptionedImage):
    split: str


def flickr30k_file(entry: dict) -> str:
    return f"flickr30k-images/{entry['filename']}"


def coco_file(entry: dict) -> str:
    return f"{entry['filepath']}/{entry['filename']}"


def read_karpathy(path: Path, splits: tuple[str, ...], image_file: Callable[[dict], str],
                  id_key: str) -> list[KarpathyImage]:
    """The images of a Karpathy split file, in its order; DataError naming the file and the entry for
    anything that is not the published format."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"{path}: not a Karpathy split file (expected an object with a list 'images')")
    return [_image(entry, path, f"images[{index}]", splits, image_file, id_key)
            for index, entry in enumerate(data["images"])]


def _image(entry: Any, path: Path, where: str, splits: tuple[str, ...], image_file: Callable[[dict], str],
           id_key: str) -> KarpathyImage:
    try:
        if entry["split"] not in splits:
            raise ValueError(f"split {entry['split']!r} is not one of {', '.join(splits)}")
        image_id = entry[id_key]
        if not isinstance(image_id, int) or isinstance(image_id, bool):
            raise ValueError(f"'{id_key}' should be an int, found {shown(image_id)}")
        captions = [sentence["raw"].strip() for sentence in entry["sentences"]]
        return KarpathyImage(image_file(entry), image_id, captions, entry["split"])
    except KeyError as exc:
        raise DataError(f"{path}: {where}: missing key {exc}") from None
    except (TypeError, AttributeError, ValueError) as exc:
        what = str(exc) if isinstance(exc, ValueError) else "not in the published format"
        raise DataError(f"{path}: {where}: {what}") from None


def karpathy_preparer(file_name: str, image_file: Callable[[dict], str], id_key: str):
    def prepare(preparation: Preparation) -> None:
        splits = preparation.source.splits
        path = preparation.root / file_name
        if not preparation.present({split: path for split in splits}):
            return
        images = read_karpathy(path, splits, image_file, id_key)
        for split in splits:
            with preparation.split(split) as writer:
                add_captioned_images(preparation, writer, [image for image in images if image.split == split])
    return prepare


FLICKR30K = Source("flickr30k-karpathy", ("train", "val", "test"),
                   karpathy_preparer("dataset_flickr30k.json", flickr30k_file, "imgid"),
                   "Flickr30K, Karpathy splits: dataset_flickr30k.json under ROOT, images flickr30k-images/",
                   image_names="flickr30k-images/<filename without extension>")
COCO = Source("coco-karpathy", ("train", "val", "test", "restval"),
              karpathy_preparer("dataset_coco.json", coco_file, "cocoid"),
              "COCO, Karpathy splits: dataset_coco.json under ROOT, images <filepath>/<filename>",
              image_names="<filepath>/<filename without extension>")
SOURCES = (FLICKR30K, COCO)
