"""The demo world's images as pre-training corpora are published and downloaded: Conceptual
Captions' two TSVs and SBU Captions' two line-aligned files, each row a world image (its first
caption, a made-up URL), and the images as img2dataset's webdataset output of each file
(pipelines/world/shards.py), so that `vlbert data prepare cc|sbu` and `vlbert extract` read them as
they read the real corpora. Written under OUT:

    cc/Train_GCC-training.tsv, cc/Validation_GCC-1.1.0-Validation.tsv    caption<TAB>url, a row a line
    sbu/SBU_captioned_photo_dataset_{urls,captions}.txt                  a URL / a caption a line
    images/{training,validation,sbu}/NNNNN.tar (+ .parquet, _stats.json) img2dataset's output of each

Conceptual Captions' training rows are the first two thirds of the world's training images, SBU's
the last third, Conceptual Captions' validation rows the world's validation images. The last row
of each file is a failed download (a parquet row, no image), as real downloads have them. Shards
hold img2dataset's default 10,000 samples, which the cc and sbu readers' image names assume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.world.generate import load_split
from pipelines.world.shards import image_rows, write_img2dataset
from train.data.sources.captions import CC_FILES
from train.data.sources.img2dataset import SHARD_SIZE
from train.data.sources.sbu import CAPTIONS, IMAGES_FOLDER, URLS
from vlbert.utils.atomic import made_folder, write_atomically

CC_FOLDER, SBU_FOLDER, IMAGES = "cc", "sbu", "images"


def write_corpus_files(world: str | Path, out: str | Path) -> dict[str, int]:
    """Writes the world's corpora to `out` (see the module's text); returns each file's row count."""
    world, out = Path(world), Path(out)
    train, val = load_split(world, "train"), load_split(world, "val")
    cut = len(train) * 2 // 3
    parts = {"training": train[:cut], "validation": val, IMAGES_FOLDER: train[cut:]}
    rows = {folder: _download(world, out, folder, records) for folder, records in parts.items()}
    for split, name in CC_FILES.items():
        write_atomically(made_folder(out / CC_FOLDER) / name,
                         "".join(f"{row['caption']}\t{row['url']}\n" for row in rows[split]))
    for name, column in ((URLS, "url"), (CAPTIONS, "caption")):
        write_atomically(made_folder(out / SBU_FOLDER) / name,
                         "".join(f"{row[column]}\n" for row in rows[IMAGES_FOLDER]))
    return {folder: len(folder_rows) for folder, folder_rows in rows.items()}


def _download(world: Path, out: Path, folder: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """img2dataset's output of `records` (the world's image records) in `out/images/folder`, its last
    row failed; its rows, in order."""
    if not records:
        raise ValueError(f"{world}: too few images for the {folder} corpus")
    rows = image_rows(records)
    return write_img2dataset(world, out / IMAGES / folder, "webdataset", SHARD_SIZE, {rows[-1]["url"]}, rows)
