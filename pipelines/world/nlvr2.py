"""The demo world in NLVR2's published layout (`train.data.sources.nlvr2`): statements about pairs of
its images, each true or false of its pair, for `vlbert data prepare nlvr2` to read.

Written under `out`: train.json and dev.json (the world's train and val splits), one statement a
line as published, and <split>/<pair>-img0.png, <pair>-img1.png: hard links to the world's images
(copies where the file system links none). Set s of a split of n images pairs image s with images
s + 1 and s + 2 (mod n), pair ids 0 and 1; every sentence of `SENTENCES`, one per shape, is stated
of both pairs, so that consistency counts something.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from pipelines.world.generate import load_split
from pipelines.world.vocabulary import CLASS_NAMES
from vlbert.utils.atomic import made_folder, write_atomically

SPLITS = {"train": "train", "val": "dev"}  # the world's split → its name in NLVR2's layout
PAIRS_PER_SET = 2
# (sentence template, whether it is true given whether each image shows the shape)
SENTENCES = (("there is a {shape} in both images", lambda left, right: left and right),
             ("there is a {shape} in one of the images", lambda left, right: left or right))


def shapes(record: dict[str, Any]) -> set[str]:
    """The shapes that a world image shows."""
    return {obj["class"] for obj in record["objects"]}


def write_world_nlvr2(world: str | Path, out: str | Path) -> dict[str, int]:
    """Writes the world's splits as NLVR2 publishes its own under `out`; returns each split's
    number of statements."""
    world, out = Path(world), Path(out)
    counts = {}
    for world_split, split in SPLITS.items():
        records = load_split(world, world_split)
        made_folder(out / split)
        lines = []
        for set_id, left in enumerate(records):
            for pair_id in range(PAIRS_PER_SET):
                right = records[(set_id + 1 + pair_id) % len(records)]
                pair = f"{split}-{set_id}-{pair_id}"
                for side, record in enumerate((left, right)):
                    link_file(world / record["file"], out / split / f"{pair}-img{side}.png")
                number = 0
                for shape in CLASS_NAMES:
                    for template, truth in SENTENCES:
                        label = truth(shape in shapes(left), shape in shapes(right))
                        lines.append({"identifier": f"{pair}-{number}", "sentence": template.format(shape=shape),
                                      "label": str(label)})
                        number += 1
        write_atomically(out / f"{split}.json", "".join(json.dumps(line) + "\n" for line in lines))
        counts[split] = len(lines)
    return counts


def link_file(source: Path, target: Path) -> None:
    """`target` a hard link to `source` (a copy where the file system links none), replacing it."""
    if target.exists():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
