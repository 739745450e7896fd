"""`vlbert data prepare SOURCE`: a dataset as published → the project's annotation files.

The output folder holds:
    <split>.jsonl    annotations in the project's one schema (train/data/annotations.py), an image a
                     line; split names as published (`val2014`, `testA`, ...)
    images.txt       the images to extract, relative to the images root, one per line
    boxes.json       given-box sources: image path → [[x1, y1, x2, y2], ...] (`vlbert extract --boxes`)
    answers.txt      vqa2: the answer vocabulary, most frequent first
    skipped.jsonl    every item left out, with the reason: {"split", "id", "reason"}
    summary.json     {"source", "splits": {SPLIT: {"items", "skipped", "missing_images", ...}}, "absent"}
An image is found by its path without extension, with any extension extraction reads
(extract.images.IMAGE_EXTENSIONS); a name outside the images folder (absolute, or with `..`) is not
looked for. Where `--images` holds tar shards (img2dataset's webdataset output; extract/shards.py),
a shard reads as the folder of its name: `a/00000/KEY.jpg` is found as the image member `KEY.jpg` of
`a/00000.tar`, from the tar headers only, and names the same store key as the file would. Items
whose image is missing are skipped and counted; `max_missing` fails the preparation when a split
misses a larger share, and a preparation that yields no item fails.

Outputs never replace inputs: `--out` may not be, lie inside or hold `--root`, `--images` or an
input file option (vlbert/utils/paths.py). Every file is written under a temporary name and renamed only
when the whole preparation has succeeded, and summary.json last: its presence says the preparation
finished. A failed preparation leaves the folder as it was. Of the files listed above, those the new
summary does not account for (splits it calls absent, a boxes.json or answers.txt not written this
time) are removed; nothing else is.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from extract.images import IMAGE_EXTENSIONS, is_utf8
from extract.shards import SHARD_SUFFIX, names_shards, read_shard
from train.data.files import DataError, shown
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.paths import checked, output_folder, outside_reason
from vlbert.utils.progress import progress_bar

SUMMARY = "summary.json"
IMAGES = "images.txt"
BOXES = "boxes.json"
ANSWERS = "answers.txt"
SKIPPED = "skipped.jsonl"
OPTIONAL_OUTPUTS = (BOXES, ANSWERS)  # written by some sources only: removed when not written
EXTENSION_RANK = {extension: rank for rank, extension in enumerate(IMAGE_EXTENSIONS)}  # the first is preferred
ANY_IMAGE_EXTENSION = "{" + ",".join(extension[1:] for extension in IMAGE_EXTENSIONS) + "}"


@dataclass(frozen=True)
class SourceOption:
    """An option of one or more sources: `--NAME` of `vlbert data prepare`, `NAME` in a prepare step,
    a keyword argument of prepare_dataset (the source reads it from `Preparation.options`)."""

    name: str
    type: type  # int, str, or Path (an existing file)
    help: str
    minimum: int | None = None  # an int's least value


@dataclass(frozen=True)
class Source:
    """A published dataset: its name on the command line, its split names, and the function that
    reads the files under `--root` into a Preparation."""

    name: str
    splits: tuple[str, ...]
    prepare: Callable[["Preparation"], None]
    about: str  # one line for `vlbert data prepare --help`
    options: tuple[SourceOption, ...] = ()  # the source's own options
    images_folder: str = ""  # where the images lie under --root when --images is not given (if it exists)
    image_names: str = ""  # how an item's image is named under the images root, without extension: for messages


class ImageFinder:
    """Finds an image under the images root by its path without extension, with any of
    IMAGE_EXTENSIONS (any case). A folder is listed once, not stat'ed per candidate: the readers
    run over millions of rows. The last FOLDERS_KEPT listings are kept, so that memory stays flat:
    Conceptual Captions' rows go through its 333 shard folders in turn, a VQA or COCO split is one
    folder, and the Karpathy COCO split alternates between two."""

    FOLDERS_KEPT = 2

    def __init__(self, root: Path) -> None:
        self.root = root
        # folder → (its image names, stem → the name with the first extension in IMAGE_EXTENSIONS)
        self._listings: OrderedDict[str, tuple[set[str], dict[str, str]]] = OrderedDict()

    def find(self, file: str) -> str | None:
        """`file` (relative to the root) as found: itself, else the same stem with the first of
        IMAGE_EXTENSIONS present; None when there is none."""
        folder, _, name = file.rpartition("/")
        names, by_stem = self._listing(folder)
        found = name if name in names else by_stem.get(os.path.splitext(name)[0])
        return f"{folder}/{found}" if folder and found else found

    def stems(self, folder: str) -> dict[str, str]:
        """Every image of `folder` (relative to the root): its stem → its name there."""
        return self._listing(folder)[1]

    def _listing(self, folder: str) -> tuple[set[str], dict[str, str]]:
        if folder in self._listings:
            self._listings.move_to_end(folder)
            return self._listings[folder]
        names: set[str] = set()
        by_stem: dict[str, str] = {}
        for name, stem, rank in self._image_names(folder):
            names.add(name)
            first = by_stem.setdefault(stem, name)
            if first != name and rank < EXTENSION_RANK[os.path.splitext(first)[1].lower()]:  # rare: one stem, two files
                by_stem[stem] = name
        listing = self._listings[folder] = names, by_stem
        if len(self._listings) > self.FOLDERS_KEPT:
            self._listings.popitem(last=False)
        return listing

    def _image_names(self, folder: str) -> Iterator[tuple[str, str, int]]:
        """(name, stem, rank of its extension) of every image file in `folder`."""
        try:
            with os.scandir(self.root / folder) as entries:
                for entry in entries:
                    stem, extension = os.path.splitext(entry.name)
                    rank = EXTENSION_RANK.get(extension.lower())
                    # A name that is not UTF-8 could not be written into images.txt; extraction
                    # reports such files itself.
                    if rank is not None and entry.is_file() and is_utf8(entry.name):
                        yield entry.name, stem, rank
        except (FileNotFoundError, NotADirectoryError):
            return


class ShardImageFinder(ImageFinder):
    """An ImageFinder over tar shards: the folder `a/00000` is the shard `a/00000.tar`, its images the
    samples holding an image member (read from the headers; damage is logged)."""

    def __init__(self, root: Path, log: Callable[[str], None]) -> None:
        super().__init__(root)
        self.log = log

    def _image_names(self, folder: str) -> Iterator[tuple[str, str, int]]:
        shard = self.root / f"{folder}{SHARD_SUFFIX}"
        if not shard.is_file():
            return
        for sample in read_shard(shard, self.root, (), self.log):
            shard_folder, _, key = sample.id.rpartition("/")
            extension = sample.image_extension
            if extension is not None and shard_folder == folder:
                yield f"{key}.{extension}", key, EXTENSION_RANK[f".{extension}"]


def image_finder(images: Path, log: Callable[[str], None]) -> ImageFinder:
    """The finder of the images under `images`: tar shards where it holds them, else files."""
    return ShardImageFinder(images, log) if names_shards(images) else ImageFinder(images)


def outside(file: str) -> bool:
    """Whether `file`, given as relative to a folder, could name something outside it."""
    return outside_reason(file, record_id=False) is not None


class Preparation:
    """What a source's `prepare` writes into: splits, the boxes of given-box extraction, other files.
    Every file goes under a temporary name until `finish` renames them all."""

    def __init__(self, source: Source, root: Path, images: Path, out: Path, max_missing: float | None,
                 options: dict[str, Any], log: Callable[[str], None]) -> None:
        self.source, self.root, self.images, self.out = source, root, images, out
        self.max_missing, self.options, self.log = max_missing, options, log
        self.boxes: dict[str, list[list[float]]] = {}
        self.summary: dict[str, Any] = {"source": source.name, "splits": {}, "absent": []}
        # The first reason an item was left out, and the first missing image: for the errors that
        # end a preparation, whose skipped.jsonl is not kept.
        self.first_skip: str | None = None
        self.first_missing: str | None = None
        self.finder = image_finder(images, log)
        self._staged: dict[str, IO[bytes]] = {}  # output name → its temporary file
        self._images_list = self.stage(IMAGES)
        self._skipped = self.stage(SKIPPED)

    def stage(self, name: str) -> IO[bytes]:
        """A temporary file for the output `name`, renamed into place by `finish`."""
        self._staged[name] = checked(self.out / f"{name}.tmp").open("wb")
        return self._staged[name]

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
        """Whether the image `file` is under the images root, with any image extension."""
        return not outside(file) and self.finder.find(file) is not None

    def progress(self, items: Iterable, what: str, total: int | None = None) -> Iterator:
        """`items`, with a bar on a terminal and a line a minute in a log."""
        with progress_bar(total, f"{self.source.name} {what}", "items", leave=False) as bar:
            for item in items:
                yield item
                bar.update(1)

    def write_json(self, name: str, value: Any) -> None:
        """`value` as the output `name`; standard JSON (no NaN or Infinity), non-ASCII escaped."""
        self.stage(name).write(json.dumps(value, allow_nan=False).encode())

    def write_lines(self, name: str, lines: Iterable[str]) -> None:
        self.stage(name).write("".join(f"{line}\n" for line in lines).encode())

    def finish(self) -> None:
        """Every output renamed into place, stale ones removed, summary.json written last."""
        if self.boxes:
            self.write_json(BOXES, self.boxes)
        self.close()
        (self.out / SUMMARY).unlink(missing_ok=True)  # absent while the outputs change
        for name, file in self._staged.items():
            os.replace(file.name, checked(self.out / name))
        for name in self._stale_outputs():
            (self.out / name).unlink(missing_ok=True)
        write_atomically(self.out / SUMMARY, json.dumps(self.summary))

    def _stale_outputs(self) -> list[str]:
        """The outputs of an earlier preparation that this one does not account for."""
        splits = [split for split in (*self.source.splits, *self.summary["absent"])
                  if split not in self.summary["splits"]]
        return [f"{split}.jsonl" for split in dict.fromkeys(splits)] + [
            name for name in OPTIONAL_OUTPUTS if name not in self._staged]

    def discard(self) -> None:
        """The temporary files removed: a failed preparation leaves the folder as it was."""
        self.close()
        for file in self._staged.values():
            Path(file.name).unlink(missing_ok=True)

    def close(self) -> None:
        for file in self._staged.values():
            file.close()


class SplitWriter:
    """One split's annotation file, written line by line (streamed) and counted. A context manager:
    the split's counts enter the summary when the block ends; the file is renamed into place with
    the others when the whole preparation has succeeded."""

    def __init__(self, preparation: Preparation, name: str) -> None:
        self.preparation, self.name = preparation, name
        self.counts: dict[str, int] = {"items": 0, "skipped": 0, "missing_images": 0}
        self.extra: dict[str, Any] = {}  # the source's own summary fields for this split
        self._file = preparation.stage(f"{name}.jsonl")

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self._file.close()
        if kind is not None:
            return
        summary = {**self.counts, **self.extra}
        self.preparation.summary["splits"][self.name] = summary
        self.preparation.log(f"{self.preparation.source.name} {self.name}: {self.counts['items']} items"
                             + (f", {self.counts['skipped']} skipped ({self.counts['missing_images']} for a "
                                f"missing image)" if self.counts["skipped"] else ""))
        self._check_missing_share()

    def add(self, record: dict[str, Any], items: int) -> None:
        """One image's annotation record (`file` relative to the images root) holding `items` items."""
        line = json.dumps(record, ensure_ascii=False)
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a JSON escape as published) stays an escape
            data = json.dumps(record).encode("utf-8")
        self._file.write(data + b"\n")
        self.preparation._images_list.write(record["file"].encode("utf-8") + b"\n")
        self.counts["items"] += items

    def skip(self, item_id: Any, reason: str, items: int = 1) -> None:
        """Leaves out `items` items (`item_id` names them in skipped.jsonl) for `reason`."""
        self.counts["skipped"] += items
        self.preparation.first_skip = self.preparation.first_skip or reason
        line = json.dumps({"split": self.name, "id": item_id, "reason": reason})
        self.preparation._skipped.write(line.encode() + b"\n")

    def skip_missing_image(self, item_id: Any, file: str, items: int = 1, reason: str | None = None) -> None:
        """Leaves out `items` items whose image `file` is missing; `reason` says why where it is
        known (img2dataset's status of a failed download), else where it was looked for."""
        self.counts["missing_images"] += items
        looked_for = f"{self.preparation.images / os.path.splitext(file)[0]}.{ANY_IMAGE_EXTENSION}"
        self.preparation.first_missing = self.preparation.first_missing or looked_for
        self.skip(item_id, reason or f"no image found as {looked_for}", items)

    def find_image(self, item_id: Any, file: str, items: int = 1) -> str | None:
        """The image `file` (relative to the images root) as found, with any image extension; None
        when it is outside the images folder or missing, its `items` items then skipped."""
        if outside(file):
            self.skip(item_id, f"image {shown(file)} lies outside the images folder {self.preparation.images}", items)
            return None
        found = self.preparation.finder.find(file)
        if found is None:
            self.skip_missing_image(item_id, file, items)
        return found

    def _check_missing_share(self) -> None:
        limit = self.preparation.max_missing
        total = self.counts["items"] + self.counts["skipped"]
        missing = self.counts["missing_images"]
        if limit is not None and total and missing / total > limit:
            raise DataError(f"{self.preparation.source.name} {self.name}: {missing} of {total} items "
                            f"({missing / total:.1%}) have no image under {self.preparation.images}, more than "
                            f"--max-missing {limit:.1%}; the first: no image found as {self.preparation.first_missing}")


def prepare_dataset(source: Source, root: str | Path, out: str | Path, images: str | Path | None = None,
                    max_missing: float | None = None, log: Callable[[str], None] = print,
                    **options: Any) -> dict[str, Any]:
    """Reads `source`'s published files under `root` (images under `images`, default
    `root/source.images_folder` where it exists, else `root`) into `out`; returns the summary.
    `options` are the source's own (vqa2: `min_answer_count`). OutputOverlapError for an `out` that
    is, lies inside or holds an input; DataError, with `out` as it was, for files that cannot be
    read, a missing share above `max_missing`
    (0–1), and a preparation that yields no item."""
    root, out = Path(root), Path(out)
    if images is None:
        images = root / source.images_folder if (root / source.images_folder).is_dir() else root
    images = Path(images)
    for what, path in (("--root", root), ("--images", images)):
        if not path.is_dir():
            raise DataError(f"{what} {path}: not a folder")
    output_folder(out, (("--root", root), ("--images", images),
                      *((f"--{name.replace('_', '-')}", value) for name, value in options.items()
                        if isinstance(value, Path))))
    if max_missing is not None and not 0 <= max_missing <= 1:
        raise DataError(f"--max-missing {max_missing}: expected a share between 0 and 1")
    known = [option.name for option in source.options]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise DataError(f"{source.name}: unknown option {', '.join(map(repr, unknown))}; "
                        f"it takes {', '.join(map(repr, known)) or 'none'}")
    created = not out.exists()
    made_folder(out)
    preparation = Preparation(source, root, images, out, max_missing, options, log)
    try:
        source.prepare(preparation)
        _check_yield(preparation)
    except BaseException:
        preparation.discard()
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    preparation.finish()
    return preparation.summary


def _check_yield(preparation: Preparation) -> None:
    """DataError when the preparation found no split, or kept no item of any."""
    source, summary = preparation.source, preparation.summary
    if not summary["splits"]:
        raise DataError(f"{preparation.root}: holds none of {source.name}'s published files "
                        f"(splits {', '.join(source.splits)}); see `vlbert data prepare --help`")
    if any(split["items"] for split in summary["splits"].values()):
        return
    skipped = sum(split["skipped"] for split in summary["splits"].values())
    if preparation.first_missing:
        images = f"{preparation.images}/{source.image_names or '<file>'}.{ANY_IMAGE_EXTENSION}"
        why = f"images are looked for as {images}; the first missing: {preparation.first_missing}"
    else:
        why = f"the first left out: {preparation.first_skip}" if skipped else "the files hold no item"
    raise DataError(f"{source.name}: no item prepared from {preparation.root} ({skipped} skipped): {why}")
