"""`vlbert cache show`: a FeatureStore's boxes drawn over their images, with BUTD's labels.

Each picture is the image, enlarged by a whole factor when small (pixels repeated, so that labels
stay readable on 64-200 px images), under a band that names the image and says what is drawn. Every
stored box kept by `top` and `min_score` is outlined in its own colour, labelled with its top
attribute and class and their scores ("red 0.71 square 0.93"; indices where the store has no names,
"box 3" where it has no class predictions), above its corner where there is room, else inside it.
The whole-image box (the element VL-BERT puts first, whose feature the store keeps apart) is the
dashed frame. With `variant` k, the pixels that masked-pixel variant k hid (its boxes; extraction
set them to the pixel mean) are hatched. Nothing else of the image is changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from extract.store.labels import Naming
from extract.store.reader import FeatureStore
from extract.store.schema import StoreError
from vlbert.utils.atomic import file_written_whole, made_folder
from vlbert.utils.errors import UserError
from vlbert.utils.paths import OutsidePathError, output_folder, path_inside

PALETTE = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240),
           (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40), (128, 0, 0)]
LINE = 2  # outline width, in picture pixels
TARGET_SIDE = 640  # images smaller than this are enlarged by the largest whole factor that fits it
MAX_SCALE = 8
SHEET_COLUMNS = 4
SHEET_CELL = 480  # a contact sheet's pictures fit in squares of this side
SHEET = "sheet"  # OUT/sheet.png


class ShowError(UserError):
    """A `cache show` option that no image can be drawn with."""


@dataclass
class Picture:
    """A drawn picture and where things are in it: the image starts `top` pixels down, enlarged
    `scale` times; `boxes` are the rows drawn and `labels` their label rectangles (picture pixels)."""

    image: Image.Image
    scale: int
    top: int
    boxes: list[int]
    labels: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class ShowResult:
    written: list[Path]
    problems: list[str]  # one line per id not drawn
    note: str | None  # what the labels lack
    pictures: dict[str, Picture] = field(default_factory=dict)  # by id, as written


def enlargement(width: int, height: int) -> int:
    return max(1, min(MAX_SCALE, TARGET_SIDE // max(width, height)))


def kept_rows(record: Mapping[str, Any], top: int | None, min_score: float | None) -> list[int]:
    """The rows drawn: those whose class score reaches `min_score`, the first `top` of them (a store
    keeps its boxes best first)."""
    rows = list(range(len(record["boxes"])))
    if min_score is not None and "objects_conf" in record:
        rows = [row for row in rows if record["objects_conf"][row] >= min_score]
    return rows[:top]


def draw_record(pixels: np.ndarray, record: Mapping[str, Any], naming: Naming, title: list[str],
                rows: list[int], variant: int | None = None) -> Picture:
    """The picture of one record (see the module's docstring) over its image `pixels` (H, W, 3),
    which must have the record's size; `title` gives the band's lines."""
    height, width = pixels.shape[:2]
    scale = enlargement(width, height)
    font = ImageFont.load_default(size=max(12, round(max(width, height) * scale / 48)))
    spacing = font.size + 4
    title = [part for line in title for part in _wrapped(line, font, width * scale - 8)]
    top = spacing * len(title) + 4
    image = Image.new("RGB", (width * scale, height * scale + top), "white")
    image.paste(Image.fromarray(pixels).resize((width * scale, height * scale), Image.NEAREST), (0, top))
    if variant is not None:
        image = _hatched(image, [record["boxes"][row] for row in np.flatnonzero(record["mask_boxes"][variant])],
                         scale, top)
    draw = ImageDraw.Draw(image)
    for line, text in enumerate(title):
        draw.text((4, 2 + spacing * line), text, fill="black", font=font)
    _dashed_frame(draw, (0, top, width * scale - 1, top + height * scale - 1))
    picture = Picture(image, scale, top, rows)
    corners = [_scaled(record["boxes"][row], scale, top) for row in rows]
    for rank, corner in enumerate(corners):
        draw.rectangle(corner, outline=PALETTE[rank % len(PALETTE)], width=LINE)
    # Labels after every outline, the best box's last, so that no outline crosses a label and the
    # best boxes' labels are read first where labels overlap.
    labels = {}
    for rank in reversed(range(len(rows))):
        labels[rank] = _label(draw, font, naming.label(record, rows[rank]), corners[rank], top, image.size[0],
                              PALETTE[rank % len(PALETTE)])
    picture.labels = [labels[rank] for rank in range(len(rows))]
    return picture


def _wrapped(text: str, font, width: int) -> list[str]:
    """`text` in lines no wider than `width` pixels, broken between words."""
    lines = [""]
    for word in text.split(" "):
        joined = f"{lines[-1]} {word}" if lines[-1] else word
        if lines[-1] and font.getlength(joined) > width:
            lines.append(word)
        else:
            lines[-1] = joined
    return lines


def _scaled(box, scale: int, top: int) -> tuple[int, int, int, int]:
    """A box (x1, y1, x2, y2 in image pixels) as the picture's pixel rectangle (inclusive corners)."""
    x1, y1, x2, y2 = (float(value) * scale for value in box)
    return (math.floor(x1), math.floor(y1) + top, max(math.ceil(x2) - 1, math.floor(x1)),
            max(math.ceil(y2) - 1, math.floor(y1)) + top)


def _label(draw: ImageDraw.ImageDraw, font, text: str, corner: tuple[int, int, int, int], top: int,
           picture_width: int, colour: tuple[int, int, int]) -> tuple[int, int, int, int]:
    """The label on a filled rectangle of the box's colour: above the box's corner when it fits
    there, else inside it under its top edge; moved left where it would leave the picture. Returns
    the rectangle."""
    left, upper, right, bottom = draw.textbbox((0, 0), text, font=font)
    width, height = right - left + 4, bottom - upper + 2
    x = max(0, min(corner[0], picture_width - width))
    y = corner[1] - height if corner[1] - height >= top else corner[1] + LINE
    rectangle = (x, y, x + width - 1, y + height - 1)
    draw.rectangle(rectangle, fill=colour)
    light = sum(weight * value for weight, value in zip((0.299, 0.587, 0.114), colour)) > 150
    draw.text((x + 2 - left, y + 1 - upper), text, fill="black" if light else "white", font=font)
    return rectangle


def _dashed_frame(draw: ImageDraw.ImageDraw, frame: tuple[int, int, int, int], dash: int = 8) -> None:
    """The whole-image box: a black-and-white dashed line just inside the image's edge."""
    x1, y1, x2, y2 = frame
    for start in range(0, max(x2 - x1, y2 - y1) + 1, dash):
        colour = "black" if start // dash % 2 == 0 else "white"
        for edge in ((x1 + start, y1, min(x1 + start + dash - 1, x2), y1 + LINE - 1),
                     (x1 + start, y2 - LINE + 1, min(x1 + start + dash - 1, x2), y2),
                     (x1, y1 + start, x1 + LINE - 1, min(y1 + start + dash - 1, y2)),
                     (x2 - LINE + 1, y1 + start, x2, min(y1 + start + dash - 1, y2))):
            if edge[0] <= edge[2] and edge[1] <= edge[3]:
                draw.rectangle(edge, fill=colour)


def _hatched(image: Image.Image, boxes: list, scale: int, top: int) -> Image.Image:
    """`image` with grey diagonal hatching over `boxes` (a variant's masked boxes)."""
    mask = Image.new("L", image.size, 0)
    shape = ImageDraw.Draw(mask)
    for box in boxes:
        shape.rectangle(_scaled(box, scale, top), fill=255)
    stripes = Image.new("L", image.size, 0)
    lines = ImageDraw.Draw(stripes)
    for offset in range(-image.size[1], image.size[0], 6):
        lines.line([(offset, 0), (offset + image.size[1], image.size[1])], fill=150, width=2)
    grey = Image.new("RGB", image.size, (90, 90, 90))
    # Inside the boxes: grey at alpha 110 between the stripes, opaque on them.
    alpha = np.minimum(np.asarray(mask, np.int32), 110 + np.asarray(stripes, np.int32)).astype(np.uint8)
    shade = Image.composite(grey, image, Image.fromarray(alpha))
    return Image.composite(shade, image, mask)


def save_png(image: Image.Image, path: Path) -> Path:
    """`image` in `path`, whole or not at all (a temporary beside it, then renamed)."""
    made_folder(path.parent)
    with file_written_whole(path) as temporary:
        image.save(temporary, format="PNG", optimize=True)
    return path


def contact_sheet(pictures: list[Image.Image]) -> Image.Image:
    """The pictures in rows of SHEET_COLUMNS, each shrunk to fit a SHEET_CELL square."""
    columns = min(SHEET_COLUMNS, len(pictures))
    rows = -(-len(pictures) // columns)
    sheet = Image.new("RGB", (columns * SHEET_CELL, rows * SHEET_CELL), "white")
    for index, picture in enumerate(pictures):
        shrunk = picture.copy()
        shrunk.thumbnail((SHEET_CELL - 8, SHEET_CELL - 8), Image.LANCZOS)
        sheet.paste(shrunk, (index % columns * SHEET_CELL + 4, index // columns * SHEET_CELL + 4))
    return sheet


def _check_variant(meta: Mapping[str, Any], variant: int | None, store: Path) -> None:
    count = meta["mask_variants"]["count"]
    if variant is not None and not 0 <= variant < count:
        held = f"variants 0 to {count - 1}" if count else "no masked-pixel variants"
        raise ShowError(f"--variant {variant}: the store {store} holds {held}")


def _title(image_id: str, record: Mapping[str, Any], rows: list[int], top: int | None, min_score: float | None,
           variant: int | None, note: str | None) -> list[str]:
    kept = [f"top {top}"] if top is not None else []
    kept += [f"class score >= {min_score:g}"] if min_score is not None else []
    first = f"{image_id}  ({record['image_w']}x{record['image_h']}, {len(rows)} of {len(record['boxes'])} boxes" \
            + (f": {', '.join(kept)})" if kept else ")")
    second = "labels: attribute score, class score; dashed: the whole-image box"
    if variant is not None:
        masked = int(record["mask_boxes"][variant].sum())
        second += f"; hatched: the {masked} box{'es' if masked != 1 else ''} variant {variant} masked"
    return [first, second] + ([note] if note else [])


def show_records(store: str | Path, ids: list[str], out: str | Path, images: str | Path | None = None,
                 variant: int | None = None, top: int | None = None, min_score: float | None = None,
                 sheet: bool = False, log: Callable[[str], None] = print) -> ShowResult:
    """OUT/<id>.png for each of `ids` in `store` over its image under `images` (default: the
    images root the store records), and OUT/sheet.png of them all with `sheet`. An id the store does
    not hold, whose image is not found or cannot be read, or that would name a file outside OUT, is
    named in `problems` (one line each) and the others are drawn; bad options raise ShowError, and an
    OUT that is, lies inside or holds the store, the images root or an image read OutputOverlapError,
    before anything is drawn."""
    from train.data.image_lookup import load_images

    store, out = Path(store), Path(out)
    reader = FeatureStore(store)
    meta = reader.meta
    _check_variant(meta, variant, store)
    root = images if images is not None else meta.get("images_root")
    if root is None:
        raise ShowError(f"{store}: its meta.json records no images root (an imported store?): give --images")
    if not isinstance(root, str | Path):  # meta.json is the store writer's, or anyone's
        raise ShowError(f"{store}: its meta.json's images_root is {root!r}, not a path: give --images")
    naming = Naming.of(meta)
    if sheet and SHEET in ids:
        raise ShowError(f"image id {SHEET!r}: its picture would be {out / SHEET}.png, where --sheet writes the "
                        "contact sheet; draw it without --sheet")
    if min_score is not None and not naming.has_objects:
        log(f"--min-score {min_score:g}: the store {store} holds no class scores; every box is drawn")
    problems, records = [], {}
    for image_id in dict.fromkeys(ids):
        try:
            target = path_inside(out, f"{image_id}.png", "image id")
            records[image_id] = (reader[image_id], target)
        except KeyError:
            problems.append(f"{image_id}: not in the store {store}")
        except (OutsidePathError, StoreError) as exc:
            problems.append(f"{image_id}: {exc}")
    found = load_images(root, list(records), log)
    output_folder(out, (("CACHE", store), ("--images" if images is not None else "images root of CACHE", root),
                        *(("image", file) for file in found.files.values())))
    written, pictures = [], {}
    for image_id, (record, target) in records.items():
        if image_id in found.missing:
            problems.append(f"{image_id}: {found.missing[image_id]}")
            continue
        pixels = found.pixels[image_id]
        size = (int(record["image_w"]), int(record["image_h"]))
        if (pixels.shape[1], pixels.shape[0]) != size:
            log(f"{image_id}: the image under {root} is {pixels.shape[1]}x{pixels.shape[0]}, the store recorded "
                f"{size[0]}x{size[1]}; drawn resized to the store's size")
            pixels = np.asarray(Image.fromarray(pixels).resize(size, Image.BILINEAR))
        rows = kept_rows(record, top, min_score)
        picture = draw_record(pixels, record, naming, _title(image_id, record, rows, top, min_score, variant,
                                                             naming.note()), rows, variant)
        written.append(save_png(picture.image, target))
        pictures[image_id] = picture
    if sheet and pictures:
        written.append(save_png(contact_sheet([picture.image for picture in pictures.values()]), out / f"{SHEET}.png"))
    return ShowResult(written, problems, naming.note(), pictures)
