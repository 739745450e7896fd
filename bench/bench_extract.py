"""The whole extraction job's throughput: images/s of `run_extraction` from JPEG files on disk to
committed LMDB records (decoding workers, detector, commit thread), not just the model.

    .venv/bin/python bench/bench_extract.py --images 16                  # tiny on the CPU: a few minutes
    .venv/bin/python bench/bench_extract.py --detectors butd-vg --images 3 --batch-size 1   # ~1 min per image and setting on 2 cores
    python3 bench/bench_extract.py --device cuda --detectors butd-vg --precisions bf16 --modes detect,given \
        --variants 0,3 --images 272 --batch-size 16 --warmup 3 --profile prof   # on a GPU: 224 images measured each
    python3 bench/bench_extract.py --device cuda --detectors butd-vg --precisions bf16 --modes detect --variants 0 \
        --res5-layouts dilated,polyphase --images 272 --batch-size 16 --warmup 3   # res5's layouts side by side
    python3 bench/bench_extract.py --device cuda --detectors butd-vg --precisions bf16 --modes detect --variants 0 \
        --speed-paths none,all --images 272 --batch-size 16 --warmup 3   # today's path beside every speed path

Writes `--images` synthetic 480x640 JPEGs (noise with flat rectangles, quality 90) and a boxes
file (10 boxes per image) into a temporary folder. For each detector (random weights) x precision
x mode (detection, given boxes) x K (0 and 3 masked-pixel variants) x res5 layout (`--res5-layouts`,
default dilated; extract/modeling/res5_layouts.py) x set of speed paths (`--speed-paths`: sets of
names joined by `+`, `none` or `all`, those that apply to the precision; default none;
extract/modeling/speed_paths.py) the job runs into a fresh store
(with the job's defaults, or `--workers`, `--streams`, `--jpeg-decoding`; the job's choice is printed
under the table) and prints:
  measured      images in the steady window: every batch after the `--warmup` first ones (default 1)
  steady img/s  those images / the time from the last warm-up batch's commit to the last commit:
                model building, worker start-up, CUDA warm-up and compilation excluded
  passes/s      given-box passes a second: steady img/s x the passes of an image (its K masked
                variants, and in given-box mode its clean pass)
  run img/s     every image / the whole call
  wait %        the share of the steady window in which the job waited for decoded images
  K3/K0         the steady time per image with K=3 over that with K=0 (same detector, precision, mode, layout)
  res5 ratio    with several layouts or sets of speed paths, each later one's steady img/s over the first's (same
                setting otherwise); the res5 column names the layout, and the speed paths after a +
On CUDA also the GPU utilisation (torch.cuda.utilization(), i.e. NVML, sampled every 50 ms over
the steady window; "n/a" when pynvml is missing) and the fraction of the FLOP floor:
  floor         FLOPs of one image's job (detection or given-box pass plus its K masked passes),
                counted with torch.utils.flop_counter on the benchmark's first image (at 480x640 the
                input is 600x800); the issue's reference is ~1.9 TFLOP for a detection pass at
                600x1000 with 300 proposals, most of it res5 over the 301 RoIs, so a given-box pass
                with 10 boxes costs far less than its input area alone suggests
  of peak       floor x steady img/s / the GPU's dense peak at that precision (--peak-tflops, or a
                table of H100/H200/A100 figures by device name)
  sel ms/img    detection mode: the detector's box selection per image, on the device in use
                (the computing stream waits for the device before and after it, so this is its
                whole time)
On the CPU the first detector and precision, in both modes, also run old-style, side by side:
decoding in the job's process (`--workers 0`) and each batch committed before the next computes.

`--profile DIR` then runs the first setting's job once more under torch.profiler for
`--profile-batches` batches after the warm-up (bench/trace_top.py): the trace in DIR, and a table of
where a batch's time goes (decode wait, prepare, trunk, RPN, res5 and box head, selection, pixel
masks, to host, records, writer): host ms, of it waiting in CUDA calls, and device ms per section.

`--baseline PATH` instead runs every setting with this checkout and with the code at PATH (another
checkout, e.g. `git worktree add /tmp/base HEAD`), each job in a fresh process, alternating which
goes first, `--repeat` times; it prints the medians and ours / baseline (steady img/s, and
selection ms per image in detection mode), so that "nothing got slower" is measured side by side:

    .venv/bin/python bench/bench_extract.py --baseline /tmp/base --images 32 --repeat 3
    .venv/bin/python bench/bench_extract.py --baseline /tmp/base --detectors butd-vg --modes detect --variants 0 \\
        --images 6 --batch-size 3 --repeat 3 --set rpn_post_nms_topk=300 --set min_size=300 --set max_size=500
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from PIL import Image

from checkouts import ROOT, checkout, run_child

# The code the jobs run: this checkout, or the baseline's in a child process of --baseline.
sys.path[:0] = [str(checkout())]

import extract.detector  # noqa: E402
import extract.job  # noqa: E402
from extract.backends import build_extractor  # noqa: E402
from extract.config import parse_override  # noqa: E402
from extract.images import load_image  # noqa: E402
from extract.extraction_config import ExtractionConfig  # noqa: E402
from extract.job import _region_computer, run_extraction  # noqa: E402
from extract.loader import DecodingPipeline  # noqa: E402
from extract.modeling.roi_heads import Res5ROIHeads  # noqa: E402
from extract.modeling.rpn import RPN  # noqa: E402
from extract.store.writer import FeatureStoreWriter  # noqa: E402
from extract.synthetic import synthetic_image  # noqa: E402
from vlbert.utils.threads import ComputeLanes  # noqa: E402
from trace_top import TRACE_NAME, Section, profiled, sections_marked, top  # noqa: E402

VARIANTS = (0, 3)
MODES = ("detect", "given")
# Dense peak TFLOP/s by (a part of the CUDA device name, precision); the first name that matches wins.
PEAK_TFLOPS = (
    ("H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0}),
    ("H100", {"fp32": 67.0, "tf32": 495.0, "bf16": 989.0}),
    ("H200", {"fp32": 67.0, "tf32": 495.0, "bf16": 989.0}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}),
)


@dataclass
class Job:
    """One extraction run of the benchmark."""

    images: str
    boxes: str | None
    detector: str
    device: str
    precision: str
    variants: int
    workers: int | None  # None: the job's default (extract/resources.py)
    batch_size: int
    overrides: dict[str, Any]
    store: str
    warmup: int = 1
    # None: the job's defaults (and arguments that code from before them, a baseline's, lacks)
    streams: int | None = None
    jpeg_decoding: str | None = None
    res5_layout: str | None = None
    speed_paths: tuple[str, ...] | None = None


@dataclass
class Measured:
    images: int
    run_seconds: float
    commits: list[tuple[float, int]]  # (time, images) of each committed batch
    utilisation: list[tuple[float, int]] = field(default_factory=list)  # (time, GPU %)
    selection_seconds: float = 0.0  # in the detector's box selection, every image
    waits: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each wait for a decoded image
    warmup: int = 1  # batches left out of the steady window
    resources: str = ""  # the job's lanes, workers and JPEG decoding, as its summary says

    @property
    def selection_ms_per_image(self) -> float:
        return 1000 * self.selection_seconds / self.images

    @property
    def window(self) -> tuple[float, float]:
        """From the commit of the last warm-up batch to the last commit."""
        if len(self.commits) <= self.warmup:
            raise ValueError(f"{len(self.commits)} batches committed, not more than the {self.warmup} warm-up "
                             "batch(es): give more --images or fewer --warmup batches")
        return self.commits[self.warmup - 1][0] if self.warmup else self.commits[0][0], self.commits[-1][0]

    @property
    def steady(self) -> tuple[float, int]:
        """(seconds, images) of the steady window: the batches after the warm-up."""
        start, end = self.window
        return end - start, sum(count for _, count in self.commits[max(self.warmup, 1):])

    @property
    def steady_rate(self) -> float:
        seconds, images = self.steady
        return images / seconds

    def mean_utilisation(self) -> float | None:
        start, end = self.window
        inside = [percent for moment, percent in self.utilisation if start <= moment <= end]
        return sum(inside) / len(inside) if inside else None

    def data_wait_share(self) -> float:
        """The share of the steady window in which the job waited for decoded images."""
        start, end = self.window
        waited = sum(max(0.0, min(stop, end) - max(begin, start)) for begin, stop in self.waits)
        return waited / (end - start)


def write_inputs(folder: Path, count: int) -> Path:
    """`count` JPEGs and a boxes file of 10 boxes per image; returns the boxes file."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    boxes = {}
    for i in range(count):
        name = f"image{i:05d}.jpg"
        Image.fromarray(synthetic_image(480, 640, seed=i)).save(folder / name, quality=90)
        xy = rng.uniform(0, 0.6, size=(10, 2)) * [640, 480]
        wh = rng.uniform(0.1, 0.4, size=(10, 2)) * [640, 480]
        boxes[name] = np.concatenate([xy, xy + wh], axis=1).round(1).tolist()
    path = folder.parent / "boxes.json"
    path.write_text(json.dumps(boxes))
    return path


@contextmanager
def wait_clock(waits: list[tuple[float, float]]) -> Iterator[None]:
    """Records each wait of the job for its next decoded image (from the decoding workers)."""
    iterate = DecodingPipeline.__iter__

    def timed(self):
        items = iterate(self)
        while True:
            begin = time.perf_counter()
            item = next(items, None)
            waits.append((begin, time.perf_counter()))
            if item is None:
                return
            yield item

    DecodingPipeline.__iter__ = timed
    try:
        yield
    finally:
        DecodingPipeline.__iter__ = iterate


@contextmanager
def commit_clock(commits: list[tuple[float, int]]) -> Iterator[None]:
    """Records when each batch's transaction is in, and how many images it held."""
    commit = FeatureStoreWriter.commit

    def timed(self, records, failures={}):
        written = commit(self, records, failures)
        commits.append((time.perf_counter(), len(records) + len(failures)))
        return written

    FeatureStoreWriter.commit = timed
    try:
        yield
    finally:
        FeatureStoreWriter.commit = commit


class InlineCommits:
    """The job's commits before the commit thread: each batch written before the next computes."""

    def __init__(self, writer, committed, depth: int = 1) -> None:
        self.writer, self.committed = writer, committed

    def submit(self, records, failures) -> None:
        self.committed(records, failures, self.writer.commit(records, failures))

    def __enter__(self) -> "InlineCommits":
        return self

    def __exit__(self, *exc) -> None:
        pass


@contextmanager
def old_style() -> Iterator[None]:
    threaded = extract.job.CommitThread
    extract.job.CommitThread = InlineCommits
    try:
        yield
    finally:
        extract.job.CommitThread = threaded


@contextmanager
def selection_clock(device: str, spent: list[float]) -> Iterator[None]:
    """Adds the time of each call of the detector's box selection to `spent`: the batched
    `select_boxes_batch`, or `select_boxes` in code from before it (a baseline)."""
    name = next(n for n in ("select_boxes_batch", "select_boxes") if hasattr(extract.detector, n))
    select = getattr(extract.detector, name)
    on_cuda = device.startswith("cuda")

    def timed(*args, **kwargs):
        # The calling lane's stream only: other lanes go on.
        if on_cuda:
            torch.cuda.current_stream().synchronize()  # what was queued before is not the selection's
        start = time.perf_counter()
        result = select(*args, **kwargs)
        if on_cuda:
            torch.cuda.current_stream().synchronize()
        spent.append(time.perf_counter() - start)
        return result

    setattr(extract.detector, name, timed)
    try:
        yield
    finally:
        setattr(extract.detector, name, select)


@contextmanager
def gpu_sampler(device: str, samples: list[tuple[float, int]]) -> Iterator[str | None]:
    """Samples the GPU's utilisation every 50 ms; yields why it cannot, or None."""
    if not device.startswith("cuda"):
        yield "not on CUDA"
        return
    try:
        torch.cuda.utilization(device)
    except Exception as exc:  # noqa: BLE001 - pynvml missing or NVML unusable: said, not fatal
        yield f"unavailable ({type(exc).__name__}: {exc})"
        return
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            samples.append((time.perf_counter(), torch.cuda.utilization(device)))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield None
    finally:
        stop.set()
        thread.join()


def measure(job: Job) -> tuple[Measured, str | None]:
    commits: list[tuple[float, int]] = []
    utilisation: list[tuple[float, int]] = []
    selection: list[float] = []
    waits: list[tuple[float, float]] = []
    with commit_clock(commits), selection_clock(job.device, selection), wait_clock(waits), \
            gpu_sampler(job.device, utilisation) as no_utilisation:
        start = time.perf_counter()
        summary = run_job(job)
        seconds = time.perf_counter() - start
    if summary.failed:
        raise RuntimeError(f"{summary.failed} images failed: {summary.failures[:3]}")
    return Measured(summary.written, seconds, commits, utilisation, sum(selection), waits, job.warmup,
                    getattr(summary, "resources", "")), no_utilisation


def run_job(job: Job, image_list: Path | None = None):
    newer = {name: getattr(job, name) for name in ("streams", "jpeg_decoding", "res5_layout", "speed_paths")
             if getattr(job, name) is not None}
    return run_extraction(ExtractionConfig(job.images, job.detector, boxes=job.boxes, image_list=image_list,
                                           batch_size=job.batch_size, device=job.device, precision=job.precision,
                                           mask_variants=job.variants, decode_workers=job.workers,
                                           overrides=job.overrides, progress=False, **newer), job.store)


def measure_in_child(job: Job, code: Path) -> Measured:
    """`measure(job)` in a fresh process that imports `extract` from the checkout at `code`."""
    fields = run_child(__file__, code, asdict(job))
    return Measured(fields["images"], fields["run_seconds"], [tuple(c) for c in fields["commits"]],
                    selection_seconds=fields["selection_seconds"], warmup=job.warmup)


def child(spec: str) -> None:
    measured, _ = measure(Job(**json.loads(spec)))
    print(json.dumps({"images": measured.images, "run_seconds": measured.run_seconds, "commits": measured.commits,
                      "selection_seconds": measured.selection_seconds}))


# Where a batch's time goes (--profile): each section the function it wraps.
SECTIONS = (
    Section("decode wait", DecodingPipeline, "__iter__", per_item=True),
    Section("prepare", extract.detector.Detector, "prepare"),
    Section("trunk", extract.detector.Detector, "_trunk"),
    Section("RPN", RPN, "propose"),
    Section("res5 and box head", Res5ROIHeads, "forward"),
    Section("selection", extract.detector, "select_boxes_batch"),
    Section("pixel masks", extract.detector, "masked_images"),
    Section("to host", extract.job, "regions_numpy"),
    Section("records", extract.job, "record_from_regions"),
    Section("writer", FeatureStoreWriter, "commit"),
)


def profile_job(job: Job, folder: Path, batches: int) -> list[str]:
    """A torch.profiler trace of `batches` batches of `job` after its warm-up batches (and one more
    that warms the profiler up), saved in `folder`; returns its top. The job reads only the images
    that those batches and one after them need."""
    names = sorted(p.name for p in Path(job.images).iterdir())[: (job.warmup + batches + 2) * job.batch_size]
    listing = Path(job.store + ".list")
    if job.boxes:  # a boxes file names the job's images
        given = json.loads(Path(job.boxes).read_text())
        listing.write_text(json.dumps({name: given[name] for name in names}))
        job = replace(job, boxes=str(listing))
    else:
        listing.write_text("\n".join(names) + "\n")
    submit = ComputeLanes.submit
    with sections_marked(SECTIONS), profiled(folder, job.warmup, batches) as step:
        def stepping(self, batch, note):
            submit(self, batch, note)
            step()
        ComputeLanes.submit = stepping
        try:
            run_job(job, None if job.boxes else listing)
        finally:
            ComputeLanes.submit = submit
    return top(folder / TRACE_NAME, [s.label for s in SECTIONS], "batch")


def flops_per_image(detector: str, device: str, precision: str, res5_layout: str, image: Path, boxes: list | None,
                    variants: int) -> float:
    """FLOPs of the job's work on one image: its pass and its `variants` masked passes."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_extractor(detector, device=device, precision=precision, res5_layout=res5_layout)
    compute = _region_computer(model, given=boxes is not None, top_k=10,
                               mask_variants=variants, mask_prob=0.15, mask_seed=0)
    item = extract.job.WorkItem(image.name, image.stem, image, boxes)
    batch = [(item, (model.prepare(load_image(image)), None if boxes is None else np.asarray(boxes, np.float32)))]
    with FlopCounterMode(display=False) as counter:
        compute(batch)
    return float(counter.get_total_flops())


def peak_tflops(args, precision: str) -> float | None:
    if args.peak_tflops is not None:
        return args.peak_tflops
    name = torch.cuda.get_device_name(args.device)
    return next((peaks[precision] for part, peaks in PEAK_TFLOPS if part in name), None)


def main() -> None:
    from extract.modeling.res5_layouts import DEFAULT_RES5_LAYOUT, RES5_LAYOUTS  # here: a --baseline child may lack it
    from extract.modeling.speed_paths import SPEED_PATHS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--detectors", default="tiny", help="comma-separated presets (tiny, butd-vg, ...)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precisions", default="fp32", help="comma-separated: fp32, tf32 (CUDA), bf16")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: detect, given")
    parser.add_argument("--variants", default=",".join(map(str, VARIANTS)), help="comma-separated K values")
    parser.add_argument("--res5-layouts", default=DEFAULT_RES5_LAYOUT,
                        help=f"comma-separated: {', '.join(RES5_LAYOUTS)} (extract/modeling/res5_layouts.py)")
    parser.add_argument("--speed-paths", default="none",
                        help=f"comma-separated sets of speed paths, each none, all or names joined by +: "
                             f"{', '.join(SPEED_PATHS)} (extract/modeling/speed_paths.py)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None, help="decoding processes of the job (default: the job's)")
    parser.add_argument("--streams", type=int, default=None, help="CUDA streams of the job (default: the job's)")
    parser.add_argument("--jpeg-decoding", default=None, help="auto, device or workers (default: the job's, auto)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="detector config override, e.g. rpn_post_nms_topk=50 (repeatable)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense peak at every precision, instead of the table by device name")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of other code: run every setting with both, side by side")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each code per setting with --baseline")
    parser.add_argument("--warmup", type=int, default=1,
                        help="batches left out of the steady rate (model warm-up, cuDNN autotuning, worker start)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="after the measurements, a torch.profiler trace of the first setting's job into DIR "
                             f"({TRACE_NAME}, top.txt) and its top: where a batch's time goes")
    parser.add_argument("--profile-batches", type=int, default=4, help="batches traced with --profile")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    on_cuda = args.device.startswith("cuda")
    modes, variants = args.modes.split(","), [int(k) for k in args.variants.split(",")]
    layouts = args.res5_layouts.split(",")

    def ways(precision: str) -> list[tuple[str, tuple[str, ...]]]:
        """(res5 layout, speed paths) of each job of a setting: every layout with every set of paths."""
        applying = tuple(name for name, path in SPEED_PATHS.items() if path.applies(precision))
        sets = [() if text == "none" else applying if text == "all" else tuple(text.split("+"))
                for text in args.speed_paths.split(",")]
        return [(layout, paths) for layout in layouts for paths in sets]

    overrides = dict(parse_override(o) for o in args.overrides)
    with tempfile.TemporaryDirectory() as tmp:
        images = Path(tmp) / "images"
        boxes_file = write_inputs(images, args.images)
        first_image = images / "image00000.jpg"
        first_boxes = json.loads(boxes_file.read_text())[first_image.name]
        print(f"{args.images} JPEGs 480x640 on disk, batch {args.batch_size}, "
              f"{'the job' + chr(39) + 's' if args.workers is None else args.workers} decoding workers, "
              f"device {args.device}" + (f" ({torch.cuda.get_device_name(args.device)})" if on_cuda else "")
              + f", torch threads {torch.get_num_threads()}" + (f", overrides {overrides}" if overrides else ""))
        runs = 0

        def job(detector: str, precision: str, mode: str, k: int, way: tuple[str, tuple[str, ...]],
                workers: int = args.workers) -> Job:
            nonlocal runs
            runs += 1
            return Job(str(images), str(boxes_file) if mode == "given" else None, detector, args.device, precision,
                       k, workers, args.batch_size, overrides, str(Path(tmp) / f"run{runs}"), args.warmup,
                       args.streams, args.jpeg_decoding,
                       # None: code from before layouts and speed paths runs too
                       None if way[0] == DEFAULT_RES5_LAYOUT else way[0], way[1] or None)

        for detector in args.detectors.split(","):
            for precision in args.precisions.split(","):
                if args.baseline is not None:
                    for way in ways(precision):
                        settings = [(mode, k, lambda m=mode, k=k, way=way: job(detector, precision, m, k, way))
                                    for mode in modes for k in variants]
                        baseline_comparison(args, settings, f"{detector} {precision} res5 {way_label(way)}")
                    continue
                print("\n" + header(on_cuda))
                said = ""
                for mode in modes:
                    rates = {}
                    for k in variants:
                        for way in ways(precision):
                            measured, no_utilisation = measure(job(detector, precision, mode, k, way))
                            rates[way, k] = measured.steady_rate
                            line = row(detector, precision, way_label(way), mode, k, measured)
                            if on_cuda:
                                line += gpu_columns(args, detector, precision, way[0], first_image,
                                                    first_boxes if mode == "given" else None, k, measured,
                                                    no_utilisation)
                            print(line, flush=True)
                            if measured.resources != said:
                                said = measured.resources
                                print(f"{'':9s} the job: {said}", flush=True)
                        first_way, *later = ways(precision)
                        for way in later:
                            print(f"{'':9s} {precision:5s} {mode:7s} K={k} res5 {way_label(way)}/"
                                  f"{way_label(first_way)} steady img/s: {rates[way, k] / rates[first_way, k]:.2f}x")
                    for way in ways(precision):
                        if (way, 0) in rates and (way, 3) in rates:
                            print(f"{'':9s} {precision:5s} {mode:7s} {way_label(way)} K3/K0 time per image: "
                                  f"{rates[way, 0] / rates[way, 3]:.2f}x")
            if args.baseline is None and not on_cuda and detector == args.detectors.split(",")[0]:
                first_precision = args.precisions.split(",")[0]
                old_style_comparison(modes, variants, lambda mode, k, workers: job(
                    detector, first_precision, mode, k, ways(first_precision)[0], workers), args.workers)
        if args.profile is not None:
            precision = args.precisions.split(",")[0]
            first = (args.detectors.split(",")[0], precision, modes[0], variants[0], ways(precision)[0])
            print(f"\nprofile of {' '.join(map(str, first[:3]))} K={first[3]} res5 {way_label(first[4])}, batches "
                  f"{args.warmup + 2} to {args.warmup + 1 + args.profile_batches} "
                  f"(trace: {args.profile / TRACE_NAME}):")
            lines = profile_job(job(*first), args.profile, args.profile_batches)
            (args.profile / "top.txt").write_text("\n".join(lines) + "\n")
            print("\n".join(lines), flush=True)


def header(on_cuda: bool) -> str:
    line = (f"{'detector':9s} {'prec':5s} {'res5':9s} {'mode':7s} {'K':>2s} {'measured':>8s} {'steady img/s':>12s} "
            f"{'passes/s':>8s} {'run img/s':>10s} {'wait %':>6s}")
    return line + f" {'sel ms/img':>10s}" + (f" {'GPU %':>6s} {'floor TFLOP':>11s} {'of peak':>8s}" if on_cuda else "")


def way_label(way: tuple[str, tuple[str, ...]]) -> str:
    """The res5 layout, and the speed paths after a +."""
    return "+".join((way[0], *way[1]))


def row(detector: str, precision: str, layout: str, mode: str, k: int, measured: Measured) -> str:
    selection = f"{measured.selection_ms_per_image:.2f}" if mode == "detect" else "-"
    passes = k + (mode == "given")  # given-box passes an image costs: its clean pass (given mode), its variants
    passes_rate = f"{measured.steady_rate * passes:.4g}" if passes else "-"
    return (f"{detector:9s} {precision:5s} {layout:9s} {mode:7s} {k:2d} {measured.steady[1]:8d} "
            f"{measured.steady_rate:12.4g} {passes_rate:>8s} {measured.images / measured.run_seconds:10.4g} "
            f"{measured.data_wait_share():6.1%} "
            f"{selection:>10s}")


def baseline_comparison(args, settings: list[tuple[str, int, Any]], label: str) -> None:
    """Each setting run with this checkout's code and with the baseline's, alternating which goes
    first, `--repeat` times each, every job in a fresh process: medians and their ratios."""
    print(f"\n{label}: this checkout ({ROOT}) vs baseline ({args.baseline}), {args.repeat} runs each, alternating; "
          "medians")
    print(f"{'mode':7s} {'K':>2s} {'ours img/s':>10s} {'base img/s':>10s} {'ours/base':>9s} "
          f"{'ours sel ms':>11s} {'base sel ms':>11s} {'base/ours':>9s}   (steady img/s; selection ms per image)")
    for mode, k, make_job in settings:
        ours, base = [], []
        for rep in range(args.repeat):
            pair = [(ours, ROOT), (base, args.baseline)]
            for results, code in pair if rep % 2 == 0 else pair[::-1]:
                results.append(measure_in_child(make_job(), code))
        rate = [statistics.median(m.steady_rate for m in runs) for runs in (ours, base)]
        line = f"{mode:7s} {k:2d} {rate[0]:10.4g} {rate[1]:10.4g} {rate[0] / rate[1]:8.2f}x"
        if mode == "detect":
            selection = [statistics.median(m.selection_ms_per_image for m in runs) for runs in (ours, base)]
            line += f" {selection[0]:11.2f} {selection[1]:11.2f} {selection[1] / selection[0]:8.2f}x"
        print(line, flush=True)


def gpu_columns(args, detector: str, precision: str, layout: str, image: Path, boxes: list | None,
                variants: int, measured: Measured, no_utilisation: str | None) -> str:
    utilisation = measured.mean_utilisation()
    columns = f" {'n/a' if utilisation is None else f'{utilisation:.0f}':>6s}"
    floor = flops_per_image(detector, args.device, precision, layout, image, boxes, variants)
    peak = peak_tflops(args, precision)
    columns += f" {floor / 1e12:11.3f}"
    columns += f" {'n/a' if peak is None else f'{floor * measured.steady_rate / (peak * 1e12):.1%}':>8s}"
    if no_utilisation:
        columns += f"  (GPU utilisation {no_utilisation})"
    if peak is None:
        columns += "  (peak unknown for this GPU: give --peak-tflops)"
    return columns


def old_style_comparison(modes: list[str], variants: list[int], make_job, workers: int) -> None:
    """The job as it is vs old-style (decoding in the job's process, each batch committed before the next computes)."""
    print("\nside by side: the job as it is vs old-style (decoding in the job's process, each batch committed "
          "before the next computes)")
    for mode in modes:
        for k in variants:
            new, _ = measure(make_job(mode, k, workers))
            with old_style():
                old, _ = measure(make_job(mode, k, 0))
            print(f"  {mode:6s} K={k}: {new.steady_rate:7.4g} img/s with {workers or 'the default'} workers and the "
                  f"commit thread, {old.steady_rate:7.4g} img/s old-style: {new.steady_rate / old.steady_rate:.2f}x")


if __name__ == "__main__":
    main()
