"""The batch extraction job: images → detector → FeatureStore, resumable and shardable.

Three stages overlap: worker processes decode the images (extract/loader.py), the detector
prepares and runs them on batches, and a commit thread writes each batch's records and failures
in one LMDB transaction while the next batch computes. A killed job loses only the batches in
flight, and a rerun skips every committed image (in any shard). A batch that runs out of CUDA
memory runs again in halves; a CUDA error that leaves the device unusable stops the job
(`StickyDeviceError`) without recording the batch in flight as failed, so a rerun retries it.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from extract.backends import build_extractor
from extract.checkpoint import file_sha256
from extract.detector import REGION_ARRAYS, Detector, regions_numpy
from extract.extraction_config import ExtractionConfig, JobError
from extract.images import IMAGE_EXTENSIONS, ImageError, image_id, is_utf8, list_images, load_image
from extract.jpeg import decode_batch, jpeg_for_device
from extract.loader import DecodingPipeline, WorkItem, failure_reason
from extract.masking import draw_masks
from extract.resources import job_resources
from extract.shard_source import ShardSource, unfinished_tar_shards
from extract.shards import find_shards, names_shards
from extract.store.layout import META
from extract.store.reader import FeatureStore
from extract.store.schema import MASKED_REGION_ARRAYS, build_meta, encode_key, record_from_regions
from extract.store.writer import CommitThread, FeatureStoreWriter
from vlbert.utils.device import (StickyDeviceError, check_device, is_sticky_cuda_error, launcher_variable, rank_device,
                           use_device)
from vlbert.utils.errors import FAILED, UserError
from vlbert.utils.kernels import cpu_capability
from vlbert.utils.paths import OutsidePathError, output_folder, outside_reason, path_inside
from vlbert.utils.precision import precision as find_precision
from vlbert.utils.progress import progress_bar
from vlbert.utils.records import read_record
from vlbert.utils.threads import ComputeLanes, configured_threads


@dataclass
class ExtractionSummary:
    store: Path
    shard: tuple[int, int]
    images: int  # in this shard's slice
    skipped: int  # already in the store
    written: int
    failed: int
    seconds: float
    bytes_written: int
    threads: int = 0  # CPU compute lanes, or on a GPU torch's host-side threads (vlbert/utils/threads.py)
    resources: str = ""  # lanes, decoding workers, where JPEGs are decoded (extract/resources.py)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (image, error) of this run
    tar_shards: int | None = None  # from tar shards: this task's (None: from image files)
    tar_shards_done: int = 0  # of those, complete before this run (not read again)
    damaged: int = 0  # damage met in the tar shards read (each also a failure)

    @property
    def images_per_second(self) -> float:
        return (self.written + self.failed) / self.seconds if self.seconds > 0 else 0.0

    def report(self) -> str:
        per_image = self.bytes_written / self.written if self.written else 0
        lines = [
            f"store {self.store} shard {self.shard[0]}/{self.shard[1]}: {self.images} images, "
            f"{self.skipped} already stored, {self.written} written, {self.failed} failed",
            f"{self.seconds:.1f} s, {self.images_per_second:.2f} images/s, "
            f"{self.bytes_written / 2**20:.1f} MiB written ({per_image / 1024:.1f} KiB per image), "
            f"{self.threads} CPU thread(s); {self.resources}",
        ]
        if self.tar_shards is not None:
            lines.insert(1, f"tar shards: {self.tar_shards} in this shard, {self.tar_shards_done} complete before "
                            f"(skipped), {self.tar_shards - self.tar_shards_done} read; {self.damaged} damage(s) met "
                            "(among the failures)")
        lines += [f"  failed: {image}: {error}" for image, error in self.failures[:10]]
        if len(self.failures) > 10:
            lines.append(f"  ... and {len(self.failures) - 10} more (see {self.store / 'failures.jsonl'})")
        return "\n".join(lines)


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' → (i, n) with 0 <= i < n."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise JobError(f"shard {text!r}: expected i/n, e.g. 0/4") from None
    if not 0 <= index < count:
        raise JobError(f"shard {text!r}: expected 0 <= i < n")
    return index, count


def resolve_shard_and_device(shard: tuple[int, int] | None, device: str,
                             env: Mapping[str, str] = os.environ) -> tuple[tuple[int, int], str]:
    """An explicit shard wins; otherwise a launcher's RANK/WORLD_SIZE (torchrun) pick the slice,
    and `rank_device` the device."""
    if shard is None:
        shard = (launcher_variable(env, "RANK", 0), launcher_variable(env, "WORLD_SIZE", 1))
        if not 0 <= shard[0] < shard[1]:
            raise JobError(f"RANK={shard[0]}, WORLD_SIZE={shard[1]}: expected 0 <= RANK < WORLD_SIZE")
    return shard, rank_device(device, env)


def in_shard(image_id: str, shard: tuple[int, int]) -> bool:
    """Slices by a hash of the id, so an image's shard never depends on which other images exist."""
    return zlib.crc32(image_id.encode("utf-8")) % shard[1] == shard[0]


def work_items(images: Path, boxes_file: Path | None,
               image_list: Path | None = None) -> tuple[list[WorkItem], list[tuple[WorkItem, str]]]:
    """Every image of the job, by id: those under `images`, those the boxes file names, or those
    the image list names; and the ones refused up front (a listed path outside the images folder,
    an id used twice)."""
    given: Mapping[str, Any] = {}
    if boxes_file is not None:
        given = read_boxes_file(boxes_file)
        paths, source = sorted(given), f"boxes file {boxes_file}"
    elif image_list is not None:
        paths, source = read_image_list(image_list), f"image list {image_list}"
    else:
        paths = [p.relative_to(images).as_posix() for p in list_images(images)]
        if not paths:
            raise JobError(f"{images}: no image files (looked for {', '.join(IMAGE_EXTENSIONS)} in it and its "
                           "subfolders, following symlinked folders)")
    if not paths:
        raise JobError(f"{source}: lists no images")
    items, refused, seen = [], [], {}
    for path in paths:
        if not is_utf8(path):
            refused.append(_not_utf8(path))
            continue
        try:
            file = path_inside(images, path, "listed path", record_id=False)
        except OutsidePathError as exc:
            # Keyed by its path: it names no image of the job.
            refused.append((WorkItem(path, path), str(exc)))
            continue
        item = WorkItem(path, image_id(file, images), file, given.get(path))
        if item.image_id in seen:
            # Keyed by its path: the id belongs to the image that is stored.
            refused.append((WorkItem(path, path), f"image id {item.image_id!r} is also the id of {seen[item.image_id]}"))
        else:
            seen[item.image_id] = path
            items.append(item)
    return items, refused


def _not_utf8(path: str) -> tuple[WorkItem, str]:
    # No id, LMDB key or log line can hold the name: it is shown with its undecodable bytes escaped.
    shown = os.fsencode(path).decode("utf-8", "backslashreplace")
    return WorkItem(shown, shown), "file name is not valid UTF-8 (its undecodable bytes are shown as \\xNN): rename the file"


def listed_ids(image_list: Path) -> tuple[set[str], list[tuple[WorkItem, str]]]:
    """The ids of the images an image list names (each path without its extension), for tar shards;
    and the lines refused (not UTF-8, a path that would leave the images root)."""
    ids, refused = set(), []
    for path in read_image_list(image_list):
        if not is_utf8(path):
            refused.append(_not_utf8(path))
        elif reason := outside_reason(path, record_id=False):
            refused.append((WorkItem(path, path), f"listed path {path!r} {reason}"))
        else:
            ids.add(image_id(path, "."))
    return ids, refused


def read_image_list(path: Path) -> list[str]:
    """The paths a text file lists, one a line, each once (`images.txt` of `vlbert data prepare`).
    A line that is not UTF-8 names its file as the file system would (surrogate escapes), so that it
    becomes that image's failure, not the whole list's."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except OSError as exc:
        raise JobError(f"image list {path}: unreadable ({exc})") from None
    return list(dict.fromkeys(line.strip() for line in lines if line.strip()))


def read_boxes_file(path: Path) -> dict[str, Any]:
    data = read_record(path, "a boxes file: a JSON object mapping image paths to lists of boxes", JobError)
    if data is None:
        raise JobError(f"boxes file {path}: no such file")
    return data


def decoded_where(resources) -> str:
    """Where the job decodes its JPEGs, as meta.json records it (`detector.jpeg_decoding`): `device`
    (torchvision's decoder, nvJPEG on CUDA) or `workers` (Pillow). The decoders' pixels differ, and so
    do the features (cosine 0.9994 on an H200: extract/jpeg.py): a store holds one decoder's."""
    return "device" if resources.jpeg_on_device else "workers"


def given_boxes(item: WorkItem) -> np.ndarray:
    try:
        boxes = np.asarray(item.boxes, dtype=np.float32)
    except (TypeError, ValueError):
        boxes = None
    if boxes is None or not (boxes.ndim == 2 and boxes.shape[1] == 4 or boxes.size == 0):
        raise ValueError(f"boxes file entry for {item.path}: expected a list of [x1, y1, x2, y2], got {item.boxes!r}")
    return boxes.reshape(-1, 4)


def run_extraction(config: ExtractionConfig, out: str | Path) -> ExtractionSummary:
    """Extracts every image of the job (those under `config.images`, or those its boxes file or image list
    names) that `out` does not hold yet into the FeatureStore `out`, as `config` says (extract/extraction_config.py).
    Raises StoreMismatchError when `out` was written with other settings."""
    start = time.perf_counter()
    out, tar_shards = Path(out), names_shards(config.images)
    shard, device = resolve_shard_and_device(config.shard, config.device)
    find_precision(config.precision).check(check_device(device))  # before anything else is read or built
    if config.boxes is not None and config.image_list is not None:
        raise JobError("give a boxes file or an image list, not both: the boxes file lists its images")
    if tar_shards and config.boxes is not None:
        raise JobError(f"--boxes with tar shards ({config.images}): a boxes file names image files; extract from "
                       "img2dataset's files output to give boxes")
    root = (find_shards(config.images)[0] if tar_shards else Path(config.images)).resolve()
    # Nothing is written before: an out over an input (OutputOverlapError) leaves every file as it was.
    output_folder(out, (("--images", root), ("--weights", config.weights), ("--boxes", config.boxes),
                        ("--list", config.image_list)))
    items, refused, source = _job_images(config, out, root, shard, tar_shards)
    model = build_extractor(config.detector, weights=config.weights, device=device, overrides=config.overrides,
                            precision=config.precision, res5_layout=config.res5_layout,
                            # Res5LayoutError where the detector's res5 cannot run so, SpeedPathError where a path
                            # does not apply
                            speed_paths=config.speed_paths)
    if config.mask_variants and config.boxes is None and model.cfg.box_source == "regressed":
        # Variants re-pool the stored boxes; with regressed boxes those are not the pooled proposals,
        # so masked and unmasked features would describe different regions.
        raise JobError("masked-pixel variants need box_source=proposals (the stored boxes are then the "
                       "pooled ones); drop --mask-variants or the box_source=regressed override")
    # On the CPU, lanes are threads that each compute a batch with single-threaded ops
    # (vlbert/utils/threads.py); on a GPU, CUDA streams, with torch's host-side threads as the thread
    # policy says (extract/resources.py).
    compute_device = use_device(model.device)
    on_cpu = compute_device.type == "cpu"
    resources = job_resources(compute_device, threads=config.threads, streams=config.streams,
                              decode_workers=config.decode_workers, jpeg_decoding=config.jpeg_decoding)
    meta = _store_meta(config, model, resources, root, tar_shards)
    stored: set[str] = set()
    if (out / META).exists():
        with FeatureStore(out) as existing:
            stored = set(existing.keys())
    items = [item for item in items if in_shard(item.image_id, shard)]
    refused = [(item, error) for item, error in refused if in_shard(item.image_id, shard)]
    pending = source.items(stored) if source else [item for item in items if item.image_id not in stored]
    compute = _region_computer(model, given=config.boxes is not None,
                               top_k=meta["class_probs"]["top_k"], mask_variants=config.mask_variants,
                               mask_prob=config.mask_prob, mask_seed=config.mask_seed)
    summary = ExtractionSummary(out, shard, len(items) + len(refused), len(items) - len(pending), 0, 0, 0.0, 0) \
        if source is None else ExtractionSummary(out, shard, 0, 0, 0, 0, 0.0, 0, tar_shards=len(source.tars),
                                                 tar_shards_done=len(source.tars) - len(source.pending))

    def committed(records: Mapping[str, Any], failures: Mapping[str, tuple[str, str]], written: int) -> None:
        """Counts a batch once its transaction is in (on the commit thread)."""
        summary.bytes_written += written
        summary.written += len(records)
        summary.failed += len(failures)
        summary.failures += list(failures.values())
        if source is None:
            bar.update(len(records) + len(failures))
        else:  # the bar counts tar shards (source.on_finished), the images beside it
            bar.set_postfix(images=summary.written + summary.failed)
            source.committed([*records, *failures])

    summary.resources = resources.describe(compute_device)
    # The workers are forked before the store is opened, so that they hold none of its files.
    decode = partial(_decode, max_pixels=config.max_pixels, for_device=resources.jpeg_on_device)
    # float32 math set for the whole job: each forward sets it too, and lanes setting and restoring
    # a process-wide setting on their own would race.
    with configured_threads(1 if on_cpu else config.threads) as torch_threads, \
            find_precision(config.precision).float32_math(compute_device), \
            DecodingPipeline(decode, pending, resources.decode_workers,
                             (resources.lanes + 1) * config.batch_size) as files, \
            FeatureStoreWriter(out, meta, shard, config.initial_map_size) as writer, \
            progress_bar(len(pending) + len(refused) if source is None else len(source.pending),
                         unit="img" if source is None else "shard", enabled=config.progress) as bar, \
            CommitThread(writer, committed) as commits, \
            ComputeLanes(partial(_compute_batch, model, compute), resources.lanes, partial(_hand_to_commits, commits),
                         resources.start_lane(compute_device, torch_threads)) as computing:
        summary.threads = resources.lanes if on_cpu else torch_threads
        if source is not None:
            source.on_finished = bar.update
        try:
            _submit_batches(files, computing, refused, source, config.batch_size)
        except Exception as exc:
            # Leaving the `with` lets the commit thread write the batches already submitted; those
            # in flight are not recorded at all, so that a rerun computes them again.
            if is_sticky_cuda_error(exc):
                raise StickyDeviceError(f"device {device}: {_first_line(exc)}; the job stopped and the images in "
                                        "flight were not recorded: rerun the same command to resume "
                                        "(CUDA_LAUNCH_BLOCKING=1 names the failing kernel)") from exc
            raise
    if source is not None:
        # The images met: the tar shards' count is known once they are read.
        summary.skipped, summary.damaged = source.skipped, source.damaged
        summary.images = summary.skipped + summary.written + summary.failed - summary.damaged
    summary.seconds = time.perf_counter() - start
    return summary


def _job_images(config: ExtractionConfig, out: Path, root: Path, shard: tuple[int, int], tar_shards: bool
                ) -> tuple[list[WorkItem], list[tuple[WorkItem, str]], ShardSource | None]:
    """(the job's image files, those refused up front, None), or from tar shards ([], the listed images
    refused, the ShardSource that reads this shard's tar shards)."""
    image_list = Path(config.image_list) if config.image_list is not None else None
    if not tar_shards:
        return *work_items(root, Path(config.boxes) if config.boxes is not None else None, image_list), None
    listed, refused = listed_ids(image_list) if image_list is not None else (None, [])
    source = ShardSource(config.images, out, shard, listed)
    refused += [(WorkItem(i, i), f"listed, but no tar shard of {config.images} would hold it") for i in source.unknown]
    return [], refused, source


def _store_meta(config: ExtractionConfig, model: Detector, resources, root: Path, tar_shards: bool) -> dict[str, Any]:
    """The store's meta.json: what a rerun into it must match (extract/store/schema.py)."""
    weights = config.weights
    return build_meta(
        feature_dim=model.cfg.feature_dim, feature_dtype=config.feature_dtype,
        mode="detect" if config.boxes is None else "given",
        detector={"source": str(config.detector), "config": model.cfg.to_dict(),
                  "checkpoint": None if weights is None else str(Path(weights).resolve()),
                  "checkpoint_sha256": None if weights is None else file_sha256(weights),
                  "precision": config.precision, "res5_layout": config.res5_layout,
                  "speed_paths": sorted(set(config.speed_paths)), "jpeg_decoding": decoded_where(resources)},
        top_k_classes=config.top_k_classes, num_classes=model.cfg.num_classes + 1,
        class_names=model.cfg.class_names, attribute_names=model.cfg.attribute_names,
        has_attributes=model.cfg.num_attributes > 0, mask_variants=config.mask_variants, mask_prob=config.mask_prob,
        mask_seed=config.mask_seed, images_root=str(root), source=f"tar shards {config.images}" if tar_shards else None,
        cpu_capabilities=[cpu_capability()],
    )


def _submit_batches(files, computing: ComputeLanes, refused: list[tuple[WorkItem, str]], source: ShardSource | None,
                    batch_size: int) -> None:
    """Hands the decoded images to the compute lanes `batch_size` at a time, each batch with the failures
    met since the last (decoding, refused up front, damage in tar shards); then waits for the lanes."""
    batch, failures = [], list(refused)
    for item, decoded, error in files:
        if error is not None:
            failures.append((item, error))
        else:
            batch.append((item, decoded))
        failures += source.take_failures() if source else []
        if len(batch) + len(failures) >= batch_size:
            computing.submit(batch, failures)
            batch, failures = [], []
    computing.submit(batch, failures + (source.take_failures() if source else []))
    computing.finish()


def _compute_batch(model: Detector, compute: Callable, batch: list[tuple[WorkItem, Any]]) -> tuple[dict, list]:
    """(records by id, failures) of a batch of (item, (decoded image, boxes)): its JPEGs decoded on
    the device in one call, every image prepared there, then computed (`_isolating_failures`)."""
    images = decode_batch([image for _, (image, _) in batch], model.device)
    prepared, failed = [], []
    for (item, (_, boxes)), image in zip(batch, images):
        if isinstance(image, ImageError):
            failed.append((item, failure_reason(image)))
        else:
            prepared.append((item, (model.prepare(image), boxes)))
    records, failures = _isolating_failures(compute, prepared) if prepared else ({}, [])
    return records, failed + failures


def _hand_to_commits(commits: CommitThread, computed: tuple[dict, list], failures: list[tuple[WorkItem, str]]) -> None:
    """A batch's records and every failure of its images (decoding and computing) to the commit thread."""
    records, failed = computed
    commits.submit(records, {item.image_id: (item.path, error) for item, error in failures + failed})


def _decode(item: WorkItem, max_pixels: int, for_device: bool) -> tuple[Any, np.ndarray | None]:
    """(the image, given boxes or None), in a decoding worker: its errors are the image's failure.
    The image is its RGB pixels, or with `for_device` a JPEG that the device can decode, undecoded
    (extract/jpeg.py).

    Resizing and normalising stay with the detector, on its device: in a forked worker torch
    must run single-threaded, and its single-threaded bilinear resize rounds differently from
    the multi-threaded one, which would change stored numbers (by ~3e-5 of a pixel value). The
    decoded image is also 8x fewer bytes to hand over than the float network input.
    """
    encode_key(item.image_id)
    boxes = given_boxes(item) if item.boxes is not None else None
    encoded = jpeg_for_device(item.file, max_pixels) if for_device else None
    return (encoded if encoded is not None else load_image(item.file, max_pixels)), boxes


def _first_line(exc: BaseException) -> str:
    """The exception's type and first line: CUDA errors add lines of debugging advice."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _isolating_failures(compute: Callable, batch: list[tuple[WorkItem, Any]]):
    """(records by id, failures) for a batch. A batch that fails runs again in pieces, so that
    only the images that fail on their own are reported: after a CUDA out-of-memory in halves
    (its cached memory released first), down to single images; after any other error image by image.
    A sticky CUDA error (`is_sticky_cuda_error`) is raised as it is: every piece would fail with it."""
    try:
        return {item.image_id: record for (item, _), record in zip(batch, compute(batch))}, []
    except Exception as exc:  # noqa: BLE001 - narrowed down below, every failure is reported
        if is_sticky_cuda_error(exc):
            raise
        reason, out_of_memory = failure_reason(exc), isinstance(exc, torch.cuda.OutOfMemoryError)
    if len(batch) == 1:
        return {}, [(batch[0][0], reason)]
    if out_of_memory:
        # Out of the except block, the failed attempt's tensors (alive in the exception's
        # traceback until then) are freed, so emptying the cache gives their memory back.
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        pieces = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
    else:
        pieces = [[one] for one in batch]
    records, failures = {}, []
    for piece in pieces:
        done, failed = _isolating_failures(compute, piece)
        records.update(done)
        failures += failed
    return records, failures


def _region_computer(model: Detector, *, given: bool, top_k: int | None,
                     mask_variants: int, mask_prob: float, mask_seed: int) -> Callable:
    """batch of (item, (prepared, boxes)) → records: detect (detection mode), then one `describe`
    call for every pass that knows its boxes: in given-box mode each image's clean pass, and every
    image's K masked-pixel variants. An image's passes share its input size, so the detector runs
    them through the trunk as one batch. Detected boxes stay on the device for the variants, and
    what the records keep comes to the host in one copy at the end."""
    def compute(batch: list[tuple[WorkItem, Any]]) -> list[dict]:
        prepared = [p for _, (p, _) in batch]
        detected = [] if given else model.detect(prepared)
        boxes = [b for _, (_, b) in batch] if given else [r.boxes for r in detected]
        masks = [draw_masks(item.image_id, len(b), mask_variants, mask_prob, mask_seed)
                 for (item, _), b in zip(batch, boxes)]
        passes = [(p, b, None) for p, b in zip(prepared, boxes)] if given else []
        passes += [(p, b, m[k]) for p, b, m in zip(prepared, boxes, masks) for k in range(mask_variants)]
        described = model.describe(*map(list, zip(*passes))) if passes else []
        clean = described[: len(batch)] if given else detected
        variants = described[len(batch):] if given else described
        arrays = regions_numpy(clean + variants, [REGION_ARRAYS] * len(clean) + [MASKED_REGION_ARRAYS] * len(variants))
        regions, masked = arrays[: len(batch)], iter(arrays[len(batch):])
        if not mask_variants:
            return [record_from_regions(r, top_k) for r in regions]
        return [record_from_regions(r, top_k, m, [next(masked) for _ in range(mask_variants)])
                for r, m in zip(regions, masks)]

    return compute


class ExtractionIncomplete(UserError):
    """A sharded extraction whose shards, all ended, left images neither stored nor failed."""

    exit_status = FAILED


def images_not_in_store(images: str | Path, out: str | Path, boxes: str | Path | None = None,
                        image_list: str | Path | None = None) -> list[str]:
    """The ids of the job's images that the store `out` holds neither as records nor as failures (in
    any shard): what a shard that stopped early left undone. For tar shards, the tar shards (`KEY.tar`)
    that no ledger records as committed whole."""
    if names_shards(images):
        return unfinished_tar_shards(images, Path(out))
    items, refused = work_items(Path(images).resolve(), Path(boxes) if boxes is not None else None,
                                Path(image_list) if image_list is not None else None)
    with FeatureStore(out) as store:
        done = set(store.keys()) | {failure["id"] for failure in store.failures()}
    ids = [item.image_id for item in items] + [item.image_id for item, _ in refused]
    return sorted(image_id for image_id in ids if image_id not in done)
