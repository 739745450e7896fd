"""Caption datasets as published: COCO Captions and Conceptual Captions.

`coco-captions` reads the COCO 2014 caption files, `captions_train2014.json` and
`captions_val2014.json`, from `--root` or from `--root/annotations/` (where the
`annotations_trainval2014.zip` archive unpacks them); the first of the two that holds the file is
read. Their format: {"images": [{"id": int, "file_name": str, ...}], "annotations": [{"id": int,
"image_id": int, "caption": str}], ...}. Images are `{split}/{file_name}` under `--images` (the
COCO root holding `train2014/` and `val2014/`). Splits: `train2014`, `val2014`. One record per
image, in the order of "images", with its `image_id` and its captions (surrounding whitespace
removed: some published captions end in spaces or a newline); an item is an image-caption pair. A
caption that is empty or whitespace only is no item: it is skipped with its reason. skipped.jsonl
names an image by its COCO image id.

`cc` reads Conceptual Captions' `Train_GCC-training.tsv` (3,318,333 rows) and
`Validation_GCC-1.1.0-Validation.tsv` (15,840 rows) from `--root`: UTF-8, no header, a row per line,
`caption<TAB>url`. Splits: `training` and `validation`, after the file names. The images are the
ones img2dataset (github.com/rom1504/img2dataset) writes with its default `--output_format files`,
10,000 samples a shard, run once per split with `--output_folder <images>/training` (resp.
`validation`) on the published TSV given its column names (img2dataset's CC3M example adds the
header line `caption<TAB>url`, and does not count it as a row). The image of the row with 0-based
number `i` is then

    {split}/{i // 10000:05d}/{i:09d}.{jpg | png | webp | jpeg}

(img2dataset's key is 10**4 * shard + index in the shard, zero-padded to 9 digits; its encoder
writes .jpg unless `--encode_format` says otherwise; any extension extraction reads is found). With
`--output_format webdataset` the image is the member `{i:09d}.jpg` of `{split}/{i // 10000:05d}.tar`,
which reads as the folder of its name, under the same name (train/data/prepare.py). Row
`i` is line i + 1 of the published file; where the first line is that header (a leading UTF-8 BOM
dropped), the header is recognised, logged and skipped, and row `i` is line i + 2, so that captions
stay on their images either way. Blank lines are not rows (img2dataset's CSV reader skips them). A row without a downloaded image (img2dataset writes no image for a
failed download) is skipped and counted as a missing image. A line that is not `caption<TAB>url`,
or whose caption is blank, is skipped with its line number in the reason; the run goes on.
skipped.jsonl names a row by its 0-based number. No `image_id` is written: the dataset has none. The
TSV is streamed: memory does not grow with the number of rows; each shard folder is listed once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from train.data.files import BOM, DataError, read_json, shown
from train.data.prepare import Preparation, SplitWriter, Source
from train.data.sources.img2dataset import EMPTY_CAPTION, add_caption_row, decoded_caption, img2dataset_stem

COCO_SPLITS = ("train2014", "val2014")
CC_FILES = {"training": "Train_GCC-training.tsv", "validation": "Validation_GCC-1.1.0-Validation.tsv"}
CC_HEADER = (b"caption", b"url")  # img2dataset's column names, as its CC3M example adds them


@dataclass
class CaptionedImage:
    file: str  # relative to the images root
    image_id: int
    captions: list[str]  # surrounding whitespace removed; blank ones are skipped when written


def coco_caption_file(root: Path, split: str) -> Path:
    """`captions_{split}.json` under `root`, or under `root/annotations/` where the zip unpacks it."""
    name = f"captions_{split}.json"
    direct = root / name
    return direct if direct.is_file() else root / "annotations" / name


def read_coco_captions(path: Path, split: str) -> list[CaptionedImage]:
    """The images of a COCO caption file with their captions, in the file's image order; DataError
    naming the file and the entry for anything that is not the published format."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
            or not isinstance(data.get("annotations"), list):
        raise DataError(f"{path}: not a COCO caption file (expected an object with lists 'images' and 'annotations')")
    images: dict[int, CaptionedImage] = {}
    for index, image in enumerate(data["images"]):
        image_id, file_name = _fields(image, {"id": int, "file_name": str}, path, f"images[{index}]")
        if image_id in images:
            raise DataError(f"{path}: images[{index}]: image id {image_id} appears twice")
        images[image_id] = CaptionedImage(f"{split}/{file_name}", image_id, [])
    for index, annotation in enumerate(data["annotations"]):
        image_id, caption = _fields(annotation, {"image_id": int, "caption": str}, path, f"annotations[{index}]")
        if image_id not in images:
            raise DataError(f"{path}: annotations[{index}]: image id {image_id} is not among 'images'")
        images[image_id].captions.append(caption.strip())
    return list(images.values())


def _fields(entry: Any, types: dict[str, type], path: Path, where: str) -> tuple:
    if not isinstance(entry, dict):
        raise DataError(f"{path}: {where}: expected an object, found {type(entry).__name__}")
    values = []
    for key, kind in types.items():
        value = entry.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise DataError(f"{path}: {where}: '{key}' should be {kind.__name__}, found {shown(value)}")
        values.append(value)
    return tuple(values)


def prepare_coco_captions(preparation: Preparation) -> None:
    files = {split: coco_caption_file(preparation.root, split) for split in COCO_SPLITS}
    for split in preparation.present(files):
        images = read_coco_captions(files[split], split)
        with preparation.split(split) as writer:
            add_captioned_images(preparation, writer, images)


def add_captioned_images(preparation: Preparation, writer: SplitWriter, images: Sequence[CaptionedImage]) -> None:
    """A record per image with captions whose file exists (a missing one is skipped once per caption,
    a blank caption is skipped); the split's summary counts the images written."""
    written = 0
    for image in preparation.progress(images, writer.name, total=len(images)):
        captions = [caption for caption in image.captions if caption]
        if len(captions) < len(image.captions):
            writer.skip(image.image_id, EMPTY_CAPTION, len(image.captions) - len(captions))
        if not captions:
            continue  # an image without captions holds no item
        file = writer.find_image(image.image_id, image.file, len(captions))
        if file is None:
            continue
        writer.add({"file": file, "image_id": image.image_id, "captions": captions}, len(captions))
        written += 1
    writer.extra["images"] = written


def cc_rows(path: Path, log: Callable[[str], None]) -> Iterator[tuple[int, int, bytes]]:
    """(line number, row, line without its end) of every row of `path`, streamed; `row` is the
    0-based number among the rows, which a header line (logged) and blank lines do not count.
    DataError when the file cannot be read."""
    try:
        with path.open("rb") as f:
            first = f.readline()
            lines = enumerate(f, 2)
            if is_cc_header(first):
                log(f"cc: {path}:1 is the header line 'caption<TAB>url': skipped, rows counted from line 2")
            else:
                lines = itertools.chain([(1, first.removeprefix(BOM))], lines)
            row = 0
            for number, line in lines:
                if line.strip():
                    yield number, row, line.rstrip(b"\r\n")
                    row += 1
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def is_cc_header(line: bytes) -> bool:
    fields = line.removeprefix(BOM).split(b"\t")
    return tuple(field.strip().lower() for field in fields) == CC_HEADER


def parse_cc_row(line: bytes) -> str:
    """The caption of a `caption<TAB>url` line; ValueError saying why the line is not one."""
    fields = line.split(b"\t")
    if len(fields) != 2 or not fields[1].strip():
        raise ValueError("not a 'caption<TAB>url' line")
    return decoded_caption(fields[0])


def prepare_conceptual_captions(preparation: Preparation) -> None:
    files = {split: preparation.root / name for split, name in CC_FILES.items()}
    for split in preparation.present(files):
        with preparation.split(split) as writer:
            for number, row, line in preparation.progress(cc_rows(files[split], preparation.log), split):
                add_caption_row(writer, row, f"{files[split]}:{number}", lambda: parse_cc_row(line),
                                img2dataset_stem(split, row))


COCO_CAPTIONS = Source("coco-captions", COCO_SPLITS, prepare_coco_captions,
                       "COCO Captions 2014: captions_{train,val}2014.json under ROOT or ROOT/annotations",
                       image_names="<split>/<file_name without extension>")
CONCEPTUAL_CAPTIONS = Source("cc", tuple(CC_FILES), prepare_conceptual_captions,
                             "Conceptual Captions: the published TSVs, images as img2dataset writes them "
                             "(files or webdataset)",
                             image_names="<split>/<row // 10000:05d>/<row:09d>")
SOURCES = (COCO_CAPTIONS, CONCEPTUAL_CAPTIONS)
