"""`vlbert data prepare` at the published sizes: wall time and peak memory of preparing VQA v2 and
Conceptual Captions, each in a fresh subprocess. Figures measured in one run; nothing here is a test.

    .venv/bin/python bench/bench_prepare.py --scale 0.01          # a quick run
    .venv/bin/python bench/bench_prepare.py --dir /tmp/prep --keep # full size; files kept for a rerun

Writes synthetic files in the published formats and names: VQA v2 train2014 + val2014 (443,757 +
214,354 questions on 82,783 + 40,504 images, ten answers each, drawn from a Zipf-like vocabulary
tuned so that about 3.2k answers reach the minimum count of 9, near the usual 3,129) with the images
as empty files in the COCO layout; Conceptual Captions training + validation TSVs (3,318,333 +
15,840 rows) with a share of rows (`--cc-present`) given an empty image file in img2dataset's layout.
Preparation never decodes an image, so empty files cost what real ones do. Conceptual Captions runs
twice, on `--cc-part` of its training rows and on all of them: equal peak memory shows that it is
streamed. Peak RSS is each child's VmHWM (/proc/self/status, read as it ends), not ru_maxrss:
Linux carries the parent's high-water mark across fork and exec into the child's ru_maxrss (measured
here: a 10.9 MiB child of a 511 MiB parent reports 511 MiB there, and in RUSAGE_CHILDREN too). Wall
time includes the interpreter's start and imports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from train.data.sources.captions import CC_FILES
from train.data.sources.img2dataset import SHARD_SIZE as CC_SHARD_SIZE, img2dataset_stem
from train.data.sources.vqa2 import ANNOTATIONS, QUESTIONS, image_file

ROOT = Path(__file__).resolve().parents[1]

VQA_SIZES = {"train2014": (82_783, 443_757), "val2014": (40_504, 214_354)}  # (images, questions)
CC_ROWS = {"training": 3_318_333, "validation": 15_840}
LARGEST_COCO_ID = 581_929
ANSWER_VOCABULARY, ANSWER_EXPONENT = 40_000, 1.2  # measured: ~3.2k answers seen >= 9 times at full size
ANSWER_TYPES = (("yes/no", 0.38), ("number", 0.12), ("other", 0.50))  # VQA v2's shares, roughly
AGREEMENT = 0.65  # chance that one of the ten answers is the chosen one
BLOCK = 100_000  # rows generated at a time
INPUTS = ("vqa2", "cc", "cc-part", "images")  # folders written under --dir
OUTPUTS = ("out-vqa2", "out-cc", "out-cc-part")

CHILD = """
import json, re, sys, time
from importlib import import_module
module, attribute = sys.argv[1:3]
source = getattr(import_module(module), attribute)
result = {"seconds": None, "summary": None}
if len(sys.argv) > 3:  # else the imports alone
    from train.data.prepare import prepare_dataset
    start = time.perf_counter()
    result["summary"] = prepare_dataset(source, *sys.argv[3:], log=lambda _: None)
    result["seconds"] = time.perf_counter() - start
with open("/proc/self/status") as status:
    result["peak_kib"] = int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))
print(json.dumps(result))
"""


def touch(path: str) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def scaled(count: int, scale: float) -> int:
    return max(1, round(count * scale))


def write_vqa2(root: Path, images: Path, scale: float, rng: np.random.Generator) -> dict[str, tuple[int, int]]:
    """The published questions and annotations files of train2014 and val2014, and empty images;
    returns split -> (images, questions)."""
    p = 1.0 / np.arange(1, ANSWER_VOCABULARY + 1) ** ANSWER_EXPONENT
    p /= p.sum()
    sizes = {split: (scaled(n, scale), scaled(q, scale)) for split, (n, q) in VQA_SIZES.items()}
    all_ids = rng.choice(LARGEST_COCO_ID, sum(n for n, _ in sizes.values()), replace=False) + 1
    first = 0
    for split, (image_count, question_count) in sizes.items():
        image_ids = np.sort(all_ids[first:first + image_count])
        first += image_count
        (images / split).mkdir(parents=True, exist_ok=True)
        for image_id in image_ids.tolist():
            touch(f"{images}/{image_file(split, image_id)}")
        per_image = np.full(image_count, question_count // image_count)
        per_image[rng.choice(image_count, question_count % image_count, replace=False)] += 1
        image_of = np.repeat(image_ids, per_image)
        index_on_image = np.arange(question_count) - np.repeat(np.cumsum(per_image) - per_image, per_image)
        question_ids = image_of * 1000 + index_on_image  # VQA v2's numbering
        chosen = rng.choice(ANSWER_VOCABULARY, question_count, p=p)
        answers = np.where(rng.random((question_count, 10)) < AGREEMENT, chosen[:, None],
                           rng.choice(ANSWER_VOCABULARY, (question_count, 10), p=p))
        types = rng.choice(len(ANSWER_TYPES), question_count, p=[share for _, share in ANSWER_TYPES])
        header = {"info": {"description": "synthetic"}, "license": {"name": "none"}, "data_subtype": split,
                  "data_type": "mscoco"}
        questions = (f'{{"image_id": {i}, "question": "What is shown in picture {q}?", "question_id": {q}}}'
                     for i, q in zip(image_of.tolist(), question_ids.tolist()))
        write_published_list(root / QUESTIONS.format(split=split),
                             {**header, "task_type": "Open-Ended"}, "questions", questions)
        annotations = (
            f'{{"question_type": "what is", "multiple_choice_answer": "word{c}", "answers": ['
            + ", ".join(f'{{"answer": "word{a}", "answer_confidence": "yes", "answer_id": {k}}}'
                        for k, a in enumerate(row, 1))
            + f'], "image_id": {i}, "answer_type": "{ANSWER_TYPES[t][0]}", "question_id": {q}}}'
            for i, q, c, row, t in zip(image_of.tolist(), question_ids.tolist(), chosen.tolist(), answers.tolist(),
                                       types.tolist()))
        write_published_list(root / ANNOTATIONS.format(split=split), header, "annotations", annotations)
    return sizes


def write_published_list(path: Path, header: dict[str, Any], key: str, items) -> None:
    """{**header, key: [items...]} with `items` already JSON, written as they come."""
    with path.open("w") as f:
        f.write(json.dumps(header)[:-1] + f', "{key}": [')
        for n, item in enumerate(items):
            f.write(("," if n else "") + item)
        f.write("]}")


def write_cc(full: Path, part: Path, images: Path, scale: float, present: float, part_share: float,
             rng: np.random.Generator) -> dict[str, tuple[int, int, int]]:
    """Both published TSVs under `full`; under `part`, the first `part_share` of the training rows and
    the same validation file; an empty image for a `present` share of rows. Returns split -> (rows,
    rows in `part`, rows with an image)."""
    counts = {}
    for split, rows in CC_ROWS.items():
        rows = scaled(rows, scale)
        part_rows = scaled(rows, part_share) if split == "training" else rows
        with_image = 0
        with (full / CC_FILES[split]).open("w") as whole, (part / CC_FILES[split]).open("w") as prefix:
            for start in range(0, rows, BLOCK):
                block = range(start, min(start + BLOCK, rows))
                lines = [f"actor attends the premiere of film {i} at a theatre in the city\t"
                         f"http://example.com/images/{i}.jpg\n" for i in block]
                whole.writelines(lines)
                prefix.writelines(lines[:max(0, part_rows - start)])
                for first in range(block.start - block.start % CC_SHARD_SIZE, block.stop, CC_SHARD_SIZE):
                    (images / img2dataset_stem(split, first)).parent.mkdir(parents=True, exist_ok=True)
                for i in (np.flatnonzero(rng.random(len(block)) < present) + start).tolist():
                    touch(f"{images}/{img2dataset_stem(split, i)}.jpg")
                    with_image += 1
        counts[split] = (rows, part_rows, with_image)
    return counts


@dataclass
class Run:
    wall_s: float
    peak_rss: int  # bytes
    prepare_s: float | None
    summary: dict[str, Any] | None


def run_prepare(module: str, attribute: str, *arguments: Path) -> Run:
    """`prepare_dataset(module.attribute, *arguments)` in a fresh interpreter (the imports alone
    without `arguments`)."""
    start = time.perf_counter()
    child = subprocess.run([sys.executable, "-c", CHILD, module, attribute, *map(str, arguments)],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if child.returncode:
        raise SystemExit(f"{module}.{attribute} failed with exit status {child.returncode}")
    result = json.loads(child.stdout)
    return Run(wall, result["peak_kib"] * 1024, result["seconds"], result["summary"])


def generate(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The synthetic dataset files under `work`, written unless `work` holds the same ones already."""
    settings = {"scale": args.scale, "cc_present": args.cc_present, "cc_part": args.cc_part}
    marker = work / "generated.json"
    if marker.is_file() and json.loads(marker.read_text())["settings"] == settings:
        print(f"reusing the files in {work}")
        return json.loads(marker.read_text())
    remove_generated(work)
    for name in INPUTS:
        (work / name).mkdir(parents=True)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    vqa2 = write_vqa2(work / "vqa2", work / "images", args.scale, rng)
    vqa2_s = time.perf_counter() - start
    start = time.perf_counter()
    cc = write_cc(work / "cc", work / "cc-part", work / "images", args.scale, args.cc_present, args.cc_part, rng)
    cc_s = time.perf_counter() - start
    generated = {"settings": settings, "vqa2": vqa2, "cc": cc, "seconds": {"vqa2": vqa2_s, "cc": cc_s}}
    marker.write_text(json.dumps(generated))
    return generated


def remove_generated(work: Path) -> None:
    """What this benchmark writes under `work`, and nothing else there."""
    for name in (*INPUTS, *OUTPUTS):
        shutil.rmtree(work / name, ignore_errors=True)
    (work / "generated.json").unlink(missing_ok=True)


def describe(name: str, run: Run, items: str) -> str:
    return (f"  {name:34s} {run.wall_s:7.1f} s wall ({run.prepare_s:7.1f} s preparing)   peak RSS "
            f"{run.peak_rss / 2**20:7.0f} MiB   {items}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, help="where the files go (default: a temporary folder)")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the published sizes")
    parser.add_argument("--keep", action="store_true", help="keep the generated files (with --dir: reused next time)")
    parser.add_argument("--cc-present", type=float, default=1.0, help="share of CC rows with an image file")
    parser.add_argument("--cc-part", type=float, default=0.1, help="share of CC training rows of the smaller run")
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    work.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:  # from an earlier run
        shutil.rmtree(work / name, ignore_errors=True)
    try:
        generated = generate(work, args)
        vqa2, cc = generated["vqa2"], generated["cc"]
        print(f"generated in {work} (scale {args.scale}):")
        print(f"  vqa2: {' + '.join(f'{q:,} questions on {n:,} images ({s})' for s, (n, q) in vqa2.items())}, "
              f"{generated['seconds']['vqa2']:.0f} s")
        print(f"  cc:   {' + '.join(f'{rows:,} rows ({s})' for s, (rows, _, _) in cc.items())}, "
              f"{sum(i for _, _, i in cc.values()):,} with an image file ({args.cc_present:.0%}), "
              f"{generated['seconds']['cc']:.0f} s")
        print(f"  disk: {shutil.disk_usage(work).free / 2**30:.1f} GiB free, "
              f"{os.statvfs(work).f_favail:,} inodes free after generating")

        print("\nprepare_dataset, each in a fresh subprocess:")
        images = work / "images"
        base = run_prepare("train.data.sources.captions", "CONCEPTUAL_CAPTIONS")
        print(f"  {'python + imports only':34s} {base.wall_s:7.1f} s wall{'':23s}"
              f"peak RSS {base.peak_rss / 2**20:7.0f} MiB")
        runs = {"vqa2": run_prepare("train.data.sources.vqa2", "SOURCE", work / "vqa2", work / "out-vqa2", images)}
        summary = runs["vqa2"].summary
        questions = sum(s["items"] for s in summary["splits"].values())
        print(describe("vqa2 (train2014 + val2014)", runs["vqa2"],
                       f"{questions:,} questions, {summary['answers']:,} answers in answers.txt"))
        for name, folder in (("cc-part", "cc-part"), ("cc", "cc")):
            runs[name] = run_prepare("train.data.sources.captions", "CONCEPTUAL_CAPTIONS", work / folder,
                                     work / f"out-{name}", images)
            splits = runs[name].summary["splits"]
            rows = sum(s["items"] + s["skipped"] for s in splits.values())
            label = f"cc, {args.cc_part:.0%} of training rows" if name == "cc-part" else "cc, all rows"
            print(describe(label, runs[name], f"{rows:,} rows, {sum(s['items'] for s in splits.values()):,} "
                                              f"pairs, {rows / runs[name].prepare_s:,.0f} rows/s"))

        print("\nagainst the targets:")
        run = runs["vqa2"]
        print(f"  vqa2: {run.wall_s:.0f} s of <= 120 s, {run.peak_rss / 2**30:.2f} GiB of <= 4 GiB "
              f"(scale {args.scale})")
        small, large = runs["cc-part"], runs["cc"]
        grown = (small.peak_rss - base.peak_rss, large.peak_rss - base.peak_rss)
        print(f"  cc peak RSS, all rows / {args.cc_part:.0%}: x{large.peak_rss / small.peak_rss:.3f} for "
              f"x{cc['training'][0] / cc['training'][1]:.1f} the training rows; above the imports: "
              f"{grown[0] / 2**20:.1f} MiB vs {grown[1] / 2**20:.1f} MiB")
    finally:
        if not args.keep:
            remove_generated(work)
            if args.dir is None:
                work.rmdir()


if __name__ == "__main__":
    main()
