"""SBU Captions (Ordonez et al., 2011) as published: `SBU_captioned_photo_dataset_urls.txt` and
`SBU_captioned_photo_dataset_captions.txt` under `--root` (1,000,000 lines each), line-aligned: line
n of one is the URL of the photo whose caption is line n of the other. One split, `training`.

The images are the ones img2dataset writes when it is given the two files joined, a row per line
in the files' order (`vlbert data sbu-urls` writes that table; docs/benchmarks.md has the whole
command), with `--output_folder <images>/sbu`, `files` or `webdataset` output. The image of line n
(row i = n - 1) is then

    sbu/{i // 10000:05d}/{i:09d}.{jpg | png | webp | jpeg}

under `--images` (as a file, or as member `{i:09d}.jpg` of the shard `sbu/{i // 10000:05d}.tar`,
which reads as the folder of its name). A row without a downloaded image is skipped and counted as
a missing image (`--max-missing` limits their share). A row whose URL is blank, or whose caption is
blank or not UTF-8, is skipped with its line number in the reason; the run goes on. Files of
different lengths are refused, naming the line where one ends: the captions would not be on their
photos. skipped.jsonl names a row by its 0-based number. Both files are streamed: memory does not
grow with the number of rows.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Iterator

from train.data.files import BOM, DataError
from train.data.prepare import Preparation, Source
from train.data.sources.img2dataset import add_caption_row, decoded_caption, img2dataset_stem, pyarrow_parquet
from vlbert.utils.paths import check_apart

URLS = "SBU_captioned_photo_dataset_urls.txt"
CAPTIONS = "SBU_captioned_photo_dataset_captions.txt"
SPLIT = "training"
IMAGES_FOLDER = "sbu"  # img2dataset's --output_folder under the images root
TABLE_ROWS = 100_000  # rows of the URL table written at a time: memory stays flat


def sbu_lines(urls: Path, captions: Path) -> Iterator[tuple[int, bytes, bytes]]:
    """(line number, URL, caption) of each line of the two files, without line ends, streamed;
    DataError when one cannot be read or ends before the other."""
    try:
        with urls.open("rb") as url_file, captions.open("rb") as caption_file:
            pairs = itertools.zip_longest(url_file, caption_file)
            for number, (url, caption) in enumerate(pairs, 1):
                if url is None or caption is None:
                    ended, longer = (urls, captions) if url is None else (captions, urls)
                    raise DataError(f"{longer}:{number}: {ended} ends at line {number - 1}: the two SBU files must "
                                    "have a line each per photo")
                if number == 1:
                    url, caption = url.removeprefix(BOM), caption.removeprefix(BOM)
                yield number, url.rstrip(b"\r\n"), caption.rstrip(b"\r\n")
    except OSError as exc:
        raise DataError(f"{exc.filename}: cannot read ({exc.strerror or exc})") from None


def sbu_caption(url: bytes, caption: bytes) -> str:
    """The caption of a line pair; ValueError saying why the pair holds none."""
    if not url.strip():
        raise ValueError("blank URL")
    return decoded_caption(caption)


def prepare_sbu(preparation: Preparation) -> None:
    captions = preparation.root / CAPTIONS
    if not preparation.present({SPLIT: captions}):
        return
    urls = preparation.root / URLS
    if not urls.is_file():
        raise DataError(f"{preparation.root}: holds {CAPTIONS} but not {URLS}, the photos' URLs")
    with preparation.split(SPLIT) as writer:
        for number, url, caption in preparation.progress(sbu_lines(urls, captions), SPLIT):
            row = number - 1
            add_caption_row(writer, row, f"{captions}:{number}", lambda: sbu_caption(url, caption),
                            img2dataset_stem(IMAGES_FOLDER, row))


def write_sbu_url_table(root: str | Path, out: str | Path) -> int:
    """img2dataset's input for SBU: a parquet table (`url`, `caption`) with a row per line of the two
    published files under `root`, in their order, whatever a line holds (a blank or undecodable
    one too: undecodable bytes become U+FFFD), so that row i is line i + 1 and img2dataset's keys
    are the rows the `sbu` reader names images by. (A TSV would not do: img2dataset reads one with
    pandas, which takes a caption's leading quote as the start of a quoted field across lines.)
    Written under a temporary name, renamed when whole; returns the number of rows. DataError for
    files that cannot be read or differ in length."""
    root, out = Path(root), Path(out)
    urls, captions = root / URLS, root / CAPTIONS
    check_apart(out, (("the URLs", urls), ("the captions", captions)))
    parquet = pyarrow_parquet()
    import pyarrow

    schema = pyarrow.schema([("url", pyarrow.string()), ("caption", pyarrow.string())])
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    rows = 0
    try:
        with parquet.ParquetWriter(temporary, schema) as writer:
            lines = sbu_lines(urls, captions)
            while block := list(itertools.islice(lines, TABLE_ROWS)):
                columns = [[line[index].decode("utf-8", "replace") for line in block] for index in (1, 2)]
                writer.write_table(pyarrow.table(columns, schema=schema))
                rows += len(block)
        os.replace(temporary, out)
    finally:
        temporary.unlink(missing_ok=True)
    return rows


SOURCE = Source("sbu", (SPLIT,), prepare_sbu,
                "SBU Captions: the published urls and captions files, images as img2dataset writes them "
                "(files or webdataset)", image_names=f"{IMAGES_FOLDER}/<row // 10000:05d>/<row:09d>")
