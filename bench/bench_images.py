"""Image reading from img2dataset's tar shards vs its files output, on the same images, and the
extraction job's end-to-end CPU rate from tar shards with the shipped demo detector.

    .venv/bin/python bench/bench_images.py                        # 2000 images; about a minute on 2 cores
    .venv/bin/python bench/bench_images.py --images 10000 --samples-per-shard 1000 --dir /scratch/bench

Writes `--images` synthetic JPEGs (noise with flat rectangles, `--size`, quality 90) under `--dir`
(default: a temporary folder on the file system of the working directory, not a tmpfs) twice: as
img2dataset's files output (NNNNN/KEY.jpg, .txt, .json) and as its webdataset output (NNNNN.tar).
Then prints, for shards and for files:
  read cold           the image bytes only (extract.shards.read_shard / one open+read per file), twice
                      per source (shards, files, files, shards), each pass after every file was
                      fsynced and dropped from the page cache with posix_fadvise(POSIX_FADV_DONTNEED):
                      what the disk (or a virtual disk's host cache) delivers, which this benchmark
                      cannot tell apart
  warm read img/s     the same pass again, from the page cache
  decode img/s        bytes read (warm) and decoded by extract.images.load_image, in one process
and `run_extraction` over the first `--extract-images` images from tar shards and from files with
the demo detector (pipelines/data/demo_detector.*) on the CPU (`--workers` decoding processes), as
images/s over the whole call, and the ratios read img/s / detector img/s (the goal: at least 10).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile
import tempfile
import time
from pathlib import Path

from PIL import Image

from extract.images import EncodedImage, load_image
from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.shards import IMAGE_MEMBER_EXTENSIONS, find_shards, read_shard
from extract.synthetic import synthetic_image
from pipelines.world.shards import write_tar

ROOT = Path(__file__).resolve().parents[1]
DETECTOR = ROOT / "pipelines" / "data" / "demo_detector.yaml"


def write_outputs(folder: Path, count: int, per_shard: int, size: tuple[int, int]) -> tuple[Path, Path]:
    """img2dataset's files and webdataset outputs of `count` synthetic JPEGs; img2dataset's keys."""
    files, shards = folder / "files", folder / "webdataset"
    shards.mkdir(parents=True)
    digits = len(str(per_shard - 1)) + 5
    for shard, first in enumerate(range(0, count, per_shard)):
        name = f"{shard:05d}"
        (files / name).mkdir(parents=True)
        members = []
        for number in range(first, min(count, first + per_shard)):
            key = str(shard * per_shard + number - first).zfill(digits)
            encoded = io.BytesIO()
            Image.fromarray(synthetic_image(*size, seed=number)).save(encoded, format="JPEG", quality=90)
            for extension, data in (("jpg", encoded.getvalue()), ("json", json.dumps({"key": key}).encode()),
                                    ("txt", f"image {number}".encode())):
                (files / name / f"{key}.{extension}").write_bytes(data)
                members.append((f"{key}.{extension}", data))
        write_tar(shards / f"{name}.tar", members)
    return files, shards


def drop_from_cache(paths: list[Path]) -> None:
    """Written pages are flushed first: the kernel drops only clean ones."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_shards(shards: Path, decode: bool) -> tuple[int, int]:
    root, tars = find_shards(shards)
    count = size = 0
    for tar in tars:
        for sample in read_shard(tar, root, IMAGE_MEMBER_EXTENSIONS, print):
            data = sample.members["jpg"]
            if decode:
                load_image(EncodedImage(f"{tar}:{sample.id}", data))
            count, size = count + 1, size + len(data)
    return count, size


def read_files(files: list[Path], decode: bool) -> tuple[int, int]:
    size = 0
    for path in files:
        if decode:
            load_image(path)
            size += path.stat().st_size
        else:
            size += len(path.read_bytes())
    return len(files), size


def timed(read, *args) -> tuple[float, float]:
    start = time.perf_counter()
    count, size = read(*args)
    seconds = time.perf_counter() - start
    return count / seconds, size / seconds / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--samples-per-shard", type=int, default=500)
    parser.add_argument("--size", default="384x512", help="HxW of the synthetic JPEGs")
    parser.add_argument("--extract-images", type=int, default=48)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where the temporary folder is made")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="bench-images-", dir=args.dir) as tmp:
        folder = Path(tmp)
        files_root, shards = write_outputs(folder, args.images, args.samples_per_shard, size)
        image_files = sorted(files_root.rglob("*.jpg"))
        tars = sorted(shards.glob("*.tar"))
        print(f"{args.images} JPEGs of {size[0]}x{size[1]}, {sum(p.stat().st_size for p in image_files) / 1e6:.1f} MB "
              f"of image bytes; {len(tars)} tar shards of {args.samples_per_shard}; under {folder}")
        sources = {"shards": (read_shards, shards, tars), "files": (read_files, image_files, image_files)}
        cold: dict[str, list] = {name: [] for name in sources}
        for name in ("shards", "files", "files", "shards"):  # each source first once: no order favours one
            read, target, paths = sources[name]
            drop_from_cache(list(files_root.rglob("*.*")) if name == "files" else paths)
            cold[name].append(timed(read, target, False))
        rates = {}
        for name, (read, target, _) in sources.items():
            warm = timed(read, target, False)
            decoded = timed(read, target, True)
            rates[name] = min(rate for rate, _ in cold[name]), decoded[0]
            print(f"{name:7s} read cold " + ", ".join(f"{rate:.0f} img/s {mb:.1f} MB/s" for rate, mb in cold[name])
                  + f" | warm read {warm[0]:.0f} img/s {warm[1]:.1f} MB/s | read+decode {decoded[0]:.0f} img/s "
                  "(one process)")
        print(f"cold read rate shards / files (the slower of each two passes): "
              f"{rates['shards'][0] / rates['files'][0]:.2f}")

        subset = folder / "subset"
        keep = args.extract_images
        with tarfile.open(tars[0]) as archive:
            members = [(member.name, archive.extractfile(member).read()) for member in archive.getmembers()[: 3 * keep]]
        (subset / "webdataset").mkdir(parents=True)
        write_tar(subset / "webdataset" / "00000.tar", members)
        for name, _ in members:
            if name.endswith(".jpg"):
                (subset / "files" / "00000").mkdir(parents=True, exist_ok=True)
                os.link(files_root / "00000" / name, subset / "files" / "00000" / name)
        extraction = {}
        for name, images in (("shards", subset / "webdataset"), ("files", subset / "files")):
            summary = run_extraction(ExtractionConfig(images, str(DETECTOR),
                                                      weights=DETECTOR.with_suffix(".safetensors"),
                                                      batch_size=args.batch_size, decode_workers=args.workers,
                                                      progress=False), folder / f"store-{name}")
            extraction[name] = summary.images_per_second
            print(f"extraction from {name}: {summary.written} images, {summary.images_per_second:.2f} img/s "
                  f"({summary.threads} CPU thread(s), {args.workers} decoding worker(s), demo detector)")
        print(f"shards: cold read rate (slower pass) / detector rate {rates['shards'][0] / extraction['shards']:.0f}x "
              f"(goal >= 10x); read+decode rate in one process / detector rate {rates['shards'][1] / extraction['shards']:.1f}x")


if __name__ == "__main__":
    main()
