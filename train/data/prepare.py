"""`vlbert data prepare SOURCE`: a dataset as published → the project's annotation files.

The output folder holds:
    <split>.jsonl    annotations in the project's one schema (train/data/annotations.py), an image a
                     line; split names as published (`val2014`, `testA`, ...)
    images.txt       the images to extract, relative to the images root, one per line
    boxes.json       given-box sources: image path → [[x1, y1, x2, y2], ...] (`vlbert extract --boxes`)
    answers.txt      vqa2: the answer vocabulary, most frequent first
    skipped.jsonl    every item left out, with the reason: {"split", "id", "reason"}
    summary.json     {"source", "splits": {SPLIT: {"items", "skipped", "missing_images", ...}}, "absent"}
Items whose image is missing are skipped and counted; `max_missing` fails the preparation when a
split misses a larger share. Files appear whole or not at all, and summary.json last: its presence
says the preparation finished.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from tqdm import tqdm

from train.data.files import DataError, write_atomically

SUMMARY = "summary.json"
IMAGES = "images.txt"
BOXES = "boxes.json"
SKIPPED = "skipped.jsonl"


@dataclass(frozen=True)
class Source:
    """A published dataset: its name on the command line, its split names, and the function that
    reads the files under `--root` into a Preparation."""

    name: str
    splits: tuple[str, ...]
    prepare: Callable[["Preparation"], None]
    about: str  # one line for `vlbert data prepare --help`
    options: tuple[str, ...] = ()  # the source's own options (keyword arguments of prepare_dataset)
    images_folder: str = ""  # where the images lie under --root when --images is not given (if it exists)


class Preparation:
    """What a source's `prepare` writes into: splits, the boxes of given-box extraction, other files."""

    def __init__(self, source: Source, root: Path, images: Path, out: Path, max_missing: float | None,
                 options: dict[str, Any], log: Callable[[str], None]) -> None:
        self.source, self.root, self.images, self.out = source, root, images, out
        self.max_missing, self.options, self.log = max_missing, options, log
        self.boxes: dict[str, list[list[float]]] = {}
        self.summary: dict[str, Any] = {"source": source.name, "splits": {}, "absent": []}
        self._images_list = (out / f"{IMAGES}.tmp").open("w")
        self._skipped = (out / f"{SKIPPED}.tmp").open("w")

    def present(self, files: dict[str, Path]) -> list[str]:
        """The splits among `files` (split → its published file) that are there, in published order;
        logs which were found and which not, and records the absent ones in the summary."""
        found = [split for split, path in files.items() if path.is_file()]
        absent = [split for split in files if split not in found]
        self.summary["absent"] += absent
        self.log(f"{self.source.name}: found {', '.join(found) or 'no split'}"
                 + (f"; not present: {', '.join(absent)}" if absent else ""))
        return found

    def split(self, name: str) -> SplitWriter:
        return SplitWriter(self, name)

    def image_exists(self, file: str) -> bool:
        # os.path rather than a Path per call: this runs once per row of 3.3M-row files.
        return os.path.isfile(os.path.join(self.images, file))

    def progress(self, items: Iterable, what: str, total: int | None = None) -> Iterator:
        """`items` with a progress bar on a terminal."""
        return iter(tqdm(items, desc=f"{self.source.name} {what}", total=total, unit=" items", disable=None,
                         dynamic_ncols=True, leave=False))

    def write_json(self, name: str, value: Any) -> None:
        write_atomically(self.out / name, json.dumps(value))

    def write_lines(self, name: str, lines: Iterable[str]) -> None:
        write_atomically(self.out / name, "".join(f"{line}\n" for line in lines))

    def finish(self) -> None:
        self.close()
        os.replace(self._images_list.name, self.out / IMAGES)
        os.replace(self._skipped.name, self.out / SKIPPED)
        if self.boxes:
            self.write_json(BOXES, self.boxes)
        self.write_json(SUMMARY, self.summary)

    def close(self) -> None:
        self._images_list.close()
        self._skipped.close()


class SplitWriter:
    """One split's annotation file, written line by line (streamed) and counted. A context manager:
    the file is renamed into place, and the split's counts enter the summary, when the block ends."""

    def __init__(self, preparation: Preparation, name: str) -> None:
        self.preparation, self.name = preparation, name
        self.path = preparation.out / f"{name}.jsonl"
        self.counts: dict[str, int] = {"items": 0, "skipped": 0, "missing_images": 0}
        self.extra: dict[str, Any] = {}  # the source's own summary fields for this split
        self._file = self.path.with_name(self.path.name + ".tmp").open("w")

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self._file.close()
        if kind is not None:
            return
        os.replace(self._file.name, self.path)
        summary = {**self.counts, **self.extra}
        self.preparation.summary["splits"][self.name] = summary
        self.preparation.log(f"{self.preparation.source.name} {self.name}: {self.counts['items']} items"
                             + (f", {self.counts['skipped']} skipped ({self.counts['missing_images']} for a "
                                f"missing image)" if self.counts["skipped"] else ""))
        self._check_missing_share()

    def add(self, record: dict[str, Any], items: int) -> None:
        """One image's annotation record (`file` relative to the images root) holding `items` items."""
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.preparation._images_list.write(record["file"] + "\n")
        self.counts["items"] += items

    def skip(self, item_id: Any, reason: str, items: int = 1) -> None:
        """Leaves out `items` items (`item_id` names them in skipped.jsonl) for `reason`."""
        self.counts["skipped"] += items
        self.preparation._skipped.write(json.dumps({"split": self.name, "id": item_id, "reason": reason}) + "\n")

    def skip_missing_image(self, item_id: Any, file: str, items: int = 1) -> None:
        self.counts["missing_images"] += items
        self.skip(item_id, f"image not found: {self.preparation.images / file}", items)

    def _check_missing_share(self) -> None:
        limit = self.preparation.max_missing
        total = self.counts["items"] + self.counts["skipped"]
        missing = self.counts["missing_images"]
        if limit is not None and total and missing / total > limit:
            raise DataError(f"{self.preparation.source.name} {self.name}: {missing} of {total} items "
                            f"({missing / total:.1%}) have no image under {self.preparation.images}, more than "
                            f"--max-missing {limit:.1%}; the reasons are in {self.preparation.out / SKIPPED}")


def prepare_dataset(source: Source, root: str | Path, out: str | Path, images: str | Path | None = None,
                    max_missing: float | None = None, log: Callable[[str], None] = print,
                    **options: Any) -> dict[str, Any]:
    """Reads `source`'s published files under `root` (images under `images`, default
    `root/source.images_folder` where it exists, else `root`) into
    `out`; returns the summary. `options` are the source's own (vqa2: `min_answer_count`). DataError
    for files that cannot be read and for a missing share above `max_missing` (0–1)."""
    root, out = Path(root), Path(out)
    if images is None:
        images = root / source.images_folder if (root / source.images_folder).is_dir() else root
    images = Path(images)
    for what, path in (("--root", root), ("--images", images)):
        if not path.is_dir():
            raise DataError(f"{what} {path}: not a folder")
    if max_missing is not None and not 0 <= max_missing <= 1:
        raise DataError(f"--max-missing {max_missing}: expected a share between 0 and 1")
    unknown = sorted(set(options) - set(source.options))
    if unknown:
        raise DataError(f"{source.name}: unknown option {', '.join(map(repr, unknown))}; "
                        f"it takes {', '.join(map(repr, source.options)) or 'none'}")
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY).unlink(missing_ok=True)
    preparation = Preparation(source, root, images, out, max_missing, options, log)
    try:
        source.prepare(preparation)
        if not preparation.summary["splits"]:
            raise DataError(f"{root}: holds none of {source.name}'s published files "
                            f"(splits {', '.join(source.splits)}); see `vlbert data prepare --help`")
        preparation.finish()
    finally:
        preparation.close()
    return preparation.summary
