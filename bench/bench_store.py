"""FeatureStore benchmark: extraction images/s (K = 0 and K = 3 masked variants), reader records/s for
random keys next to the memory-copy rate of the same bytes, bytes per image, the cost of opening a
store (shard file check, key index), and every read path with and without record checksums.
Figures measured side by side in one run; nothing here is a test.

    .venv/bin/python bench/bench_store.py              # tiny detector on CPU (+ butd-vg when CUDA is there)
    .venv/bin/python bench/bench_store.py --records 2000 --workers 4
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store import FeatureStore, FeatureStoreWriter, build_meta, decode_record, encode_record, lmdb_file
from extract.synthetic import write_synthetic_images
from train.data.regions import RegionBank


def extraction(images: Path, work: Path, detector: str, device: str, batch_size: int) -> dict[int, tuple[float, float]]:
    """K → (images/s, bytes per image)."""
    figures = {}
    for variants in (0, 3):
        out = work / f"{detector}-k{variants}"
        summary = run_extraction(ExtractionConfig(images, detector, batch_size=batch_size, device=device,
                                                  mask_variants=variants, progress=False), out)
        figures[variants] = (summary.images_per_second, summary.bytes_written / max(summary.written, 1))
    return figures


def uniform_float16(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    return rng.random((rows, dim), dtype=np.float32).astype(np.float16)


def synthetic_record(rng: np.random.Generator, boxes: int, dim: int, variants: int,
                     draw=uniform_float16) -> dict:
    """A record at BUTD layout whose feature rows come from `draw(rng, rows, dim)`; class
    probabilities take the features' dtype (float16: as stored, float32: as the detector gives them)."""
    features = draw(rng, boxes, dim)
    record = {
        "boxes": rng.random((boxes, 4), dtype=np.float32), "features": features,
        "image_feature": features.mean(axis=0), "objects_id": rng.integers(0, 1600, boxes),
        "objects_conf": rng.random(boxes, dtype=np.float32), "attrs_id": rng.integers(0, 400, boxes),
        "attrs_conf": rng.random(boxes, dtype=np.float32),
        "class_topk_id": rng.integers(0, 1601, (boxes, 10)).astype(np.int32),
        "class_topk_prob": rng.random((boxes, 10), dtype=np.float32).astype(features.dtype),
        "image_h": 480, "image_w": 640, "box_source": "proposals",
    }
    if variants:  # every row changed: the case of a receptive field covering the image (BUTD)
        record.update(mask_boxes=rng.random((variants, boxes)) < 0.15,
                      masked_features=draw(rng, variants * boxes, dim).reshape(variants, boxes, dim),
                      masked_image_feature=draw(rng, variants, dim))
    return record


class InMemory(torch.utils.data.Dataset):
    """The same tensors without a store: what the DataLoader itself costs."""

    def __init__(self, count: int, boxes: int, dim: int) -> None:
        self.features = torch.zeros(count, boxes, dim, dtype=torch.float16)

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.features[i].clone()


class Features(torch.utils.data.Dataset):
    def __init__(self, store: FeatureStore, keys: list[str]) -> None:
        self.store, self.keys = store, keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.store[self.keys[i]]["features"])


def best_rate(read, items: list, repeats: int = 3) -> float:
    """Items/s of `read(item)` over `items`, the fastest of `repeats` passes (the machine is shared:
    the fastest is the least disturbed). Results are dropped as they come, as a reader's are."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for item in items:
            read(item)
        times.append(time.perf_counter() - start)
    return len(items) / min(times)


def reading(work: Path, records: int, boxes: int, dim: int, workers: int) -> dict[str, float]:
    """Records/s of each read path, each with checksums checked ("…") and not ("…_unchecked"),
    measured alternately on the same keys."""
    rng = np.random.default_rng(0)
    meta = build_meta(feature_dim=dim, mode="imported", num_classes=1601, top_k_classes=10)
    root = work / "read-store"
    with FeatureStoreWriter(root, meta) as writer:
        for start in range(0, records, 100):
            writer.commit({f"{i:07d}": synthetic_record(rng, boxes, dim, 0) for i in range(start, min(start + 100, records))})
    lmdb_file._checked.clear()  # measure the shard check, not the record of an earlier one
    start = time.perf_counter()
    store = FeatureStore(root)
    opened = time.perf_counter() - start
    start = time.perf_counter()
    store.refresh()  # the key index again, without the (now cached) file check
    indexed = time.perf_counter() - start
    unchecked = FeatureStore(root, checksums=False)
    keys = list(rng.permutation(store.keys()))
    record_bytes = len(store.raw(keys[0]))
    figures = {"record_bytes": record_bytes, "open_s": opened, "index_s": indexed}

    start = time.perf_counter()
    for key in keys:  # the first pass maps the store's pages into this process
        store[key]
    figures["cold"] = len(keys) / (time.perf_counter() - start)
    for _ in range(2):  # alternately, so that both sides see the same machine
        for name, reader in (("warm", store), ("warm_unchecked", unchecked)):
            rate = best_rate(reader.__getitem__, keys, repeats=1)
            figures[name] = max(figures.get(name, 0.0), rate)

    # What training reads per sample (fine-tuning: boxes, features, the whole-image feature, widened).
    banks = {"bank": RegionBank(str(root)), "bank_unchecked": RegionBank(str(root))}
    banks["bank_unchecked"]._store = unchecked  # the same reads without the checksum
    for _ in range(2):
        for name, bank in banks.items():
            figures[name] = max(figures.get(name, 0.0),
                                best_rate(bank.get, keys, repeats=1))

    raws = [store.raw(key) for key in keys[:200]]
    figures["raw"] = best_rate(store.raw, keys[:200])
    for name, checksum in (("decode", True), ("decode_unchecked", False)):
        figures[name] = best_rate(lambda pair: decode_record(*pair, checksum=checksum), list(zip(raws, keys)))

    def load_all(dataset: torch.utils.data.Dataset) -> float:
        loader = torch.utils.data.DataLoader(dataset, batch_size=16, num_workers=workers, persistent_workers=True)
        sum(len(batch) for batch in loader)  # workers started and warmed up outside the timing
        return best_rate(lambda _: sum(len(batch) for batch in loader), [None], repeats=2) * len(dataset)

    figures["loader"] = load_all(Features(store, keys))
    figures["loader_unchecked"] = load_all(Features(unchecked, keys))
    figures["in_memory"] = load_all(InMemory(len(keys), boxes, dim))

    # As many distinct source bytes as the store holds, so neither side reads from a warm cache.
    source = np.ones((len(keys), record_bytes), dtype=np.uint8)
    order = rng.permutation(len(keys))
    figures["memcpy"] = best_rate(lambda i: bytearray(source[i]), list(order), repeats=1)
    store.close()
    unchecked.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=32, help="synthetic images per extraction run")
    parser.add_argument("--records", type=int, default=1000, help="records in the reading benchmark")
    parser.add_argument("--boxes", type=int, default=100)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"CUDA: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")

        write_synthetic_images(work / "small", args.images)
        runs = [("tiny", "cpu", work / "small", 8)]
        if torch.cuda.is_available():
            write_synthetic_images(work / "large", args.images, min_side=480, max_side=640)
            runs.append(("butd-vg", "cuda", work / "large", 8))
        print("\nextraction (synthetic images; random weights)")
        for detector, device, images, batch in runs:
            figures = extraction(images, work, detector, device, batch)
            (r0, b0), (r3, b3) = figures[0], figures[3]
            print(f"  {detector:8s} {device:4s} K=0: {r0:7.2f} images/s, {b0 / 1024:8.1f} KiB/image | "
                  f"K=3: {r3:7.2f} images/s, {b3 / 1024:8.1f} KiB/image | K=3/K=0 time x{r0 / r3:.2f}, "
                  f"{(b3 - b0) / 3 / 1024:.1f} KiB per variant")

        rng = np.random.default_rng(0)
        base = len(encode_record(synthetic_record(rng, args.boxes, args.dim, 0), "id"))
        with_variants = len(encode_record(synthetic_record(rng, args.boxes, args.dim, 3), "id"))
        print(f"\nbytes per image at {args.boxes} boxes, {args.dim}-d float16, top-10 classes: "
              f"{base / 1024:.1f} KiB; per masked variant (every row changed): "
              f"{(with_variants - base) / 3 / 1024:.1f} KiB")

        figures = reading(work, args.records, args.boxes, args.dim, args.workers)
        mib = figures["record_bytes"] / 2**20
        print(f"\nopening the store: {figures['open_s'] * 1e3:.1f} ms with the shard file check, "
              f"{figures['index_s'] * 1e3:.1f} ms for the key index alone")
        print(f"reading {args.records} random keys, {figures['record_bytes'] / 1024:.1f} KiB records:")
        for label, key in (("store[key], first pass", "cold"), ("store[key], second pass", "warm"),
                           (f"DataLoader, {args.workers} workers, batch 16", "loader"),
                           ("  same DataLoader, in-memory tensors", "in_memory"),
                           ("raw bytes only (LMDB get)", "raw"), ("decode only (in memory)", "decode"),
                           ("memory copy of the same bytes", "memcpy")):
            rate = figures[key]
            print(f"  {label:36s} {rate:10.0f} records/s {rate * mib:8.0f} MiB/s   "
                  f"{rate / figures['memcpy']:.2f} x memcpy")
        print("checksums checked vs not (records/s, side by side):")
        for label, key in (("store[key], second pass", "warm"), ("training read (RegionBank.get)", "bank"),
                           (f"DataLoader, {args.workers} workers", "loader"), ("decode only (in memory)", "decode")):
            checked, unchecked = figures[key], figures[f"{key}_unchecked"]
            print(f"  {label:36s} {checked:10.0f} vs {unchecked:10.0f}   the check costs "
                  f"{(unchecked / checked - 1) * 100:5.1f}% of the time")


if __name__ == "__main__":
    main()
