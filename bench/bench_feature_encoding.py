"""Feature encodings side by side (`--feature-dtype float16` vs `q8`): bytes per image at BUTD size,
fidelity per row to float16 (cosine, relative L2, class argmax through a linear head), encode and
decode time per record, and the alternatives q8 was chosen over (linear 8-bit levels; 8-bit class
probabilities; zlib on the stored bytes). Figures measured in one run; nothing here is a test.

    .venv/bin/python bench/bench_feature_encoding.py
    .venv/bin/python bench/bench_feature_encoding.py --rows 20000 --images 16
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from extract import Detector
from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from extract.store import FeatureStore, FeatureStoreWriter, build_meta, decode_record, encode_record
from extract.store import q8
from extract.store.schema import FEATURE_ENCODINGS, as_stored
from extract.synthetic import write_synthetic_images
from train.data.regions import RegionBank

import bench_store  # bench/ is on the path when a bench runs

CC3M_IMAGES = 3.3e6


def butd_like(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    """Non-negative heavy-tailed rows, as means of ReLU outputs are: a share of exact zeros (0 to
    60% per row), lognormal values whose tail width varies per row (sigma 0.5 to 2), and channels
    that are strong in every row (a lognormal scale per channel)."""
    zeros = rng.uniform(0, 0.6, (rows, 1))
    sigma = rng.uniform(0.5, 2.0, (rows, 1))
    channel = np.exp(rng.normal(0, 0.7, dim))
    x = np.exp(rng.normal(-1, 1, (rows, dim)) * sigma) * channel
    x[rng.random((rows, dim)) < zeros] = 0
    return x.astype(np.float32)


def one_large_value(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    """Uniform rows with one value 1 to 2000 times larger: near the worst case of the bound."""
    x = rng.random((rows, dim), dtype=np.float32)
    x[np.arange(rows), rng.integers(0, dim, rows)] = rng.uniform(1, 2000, rows)
    return x


def signed_outliers(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    """Gaussian rows with two values of either sign up to 200: the case q8 does not cover."""
    x = rng.normal(0, 1, (rows, dim)).astype(np.float32)
    x[:, :2] = rng.uniform(-200, 200, (rows, 2))
    return x


DISTRIBUTIONS: dict[str, Callable[[np.random.Generator, int, int], np.ndarray]] = {
    "BUTD-like, non-negative": butd_like,
    "one large value": one_large_value,
    "signed Gaussian": lambda rng, rows, dim: rng.normal(0, 1, (rows, dim)).astype(np.float32),
    "signed Laplace": lambda rng, rows, dim: rng.laplace(0, 1, (rows, dim)).astype(np.float32),
    "signed, two outliers": signed_outliers,
}


def linear_8bit(x: np.ndarray) -> np.ndarray:
    """Per-row min/max linear 8-bit levels, the scheme q8's square-root levels were chosen over."""
    low = x.min(axis=-1, keepdims=True)
    step = (x.max(axis=-1, keepdims=True) - low) / q8.LEVELS
    codes = np.rint((x - low) / np.where(step > 0, step, 1))
    return codes * step + low


def q8_round_trip(x: np.ndarray) -> np.ndarray:
    return q8.decode(q8.encode(x))


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.where(norms > 0, (a * b).sum(-1) / np.where(norms > 0, norms, 1), 1.0)


def relative_l2(a: np.ndarray, reference: np.ndarray) -> np.ndarray:
    reference = reference.astype(np.float64)
    return np.linalg.norm(a - reference, axis=-1) / np.maximum(np.linalg.norm(reference, axis=-1), 1e-30)


def argmax_agreement(logits: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """(share of rows whose argmax is the reference's, the largest top-2 gap of the reference's
    logits among the rows that differ, in units of the standard deviation of all its logits)."""
    same = logits.argmax(1) == reference.argmax(1)
    top = np.sort(reference, axis=1)[:, -2:]
    gap = (top[:, 1] - top[:, 0]) / reference.std()
    return float(same.mean()), float(gap[~same].max(initial=0))


def fidelity(rows: int, dim: int, classes: int) -> None:
    rng = np.random.default_rng(0)
    head = rng.normal(0, dim ** -0.5, (dim, classes)).astype(np.float32)
    bound = (1 + dim ** 0.5) / (12 * q8.LEVELS ** 2)
    print(f"\nfidelity per row to float16, {rows} rows of {dim} (1 - cos bound for non-negative rows under "
          f"q8: {bound:.1e}); argmax over {classes} classes through a random linear head, vs float16")
    print(f"  {'rows':24s} {'scheme':10s} {'cos min':>9s} {'cos median':>11s} {'1-cos max':>10s} "
          f"{'rel L2 max':>11s} {'rel L2 median':>14s} {'argmax same':>12s} {'flips: gap max':>15s}")
    for name, draw in DISTRIBUTIONS.items():
        x = draw(rng, rows, dim)
        reference = x.astype(np.float16)
        for scheme, decoded in (("float32", x), ("q8", q8_round_trip(x)), ("linear 8b", linear_8bit(x))):
            c, l2 = cosine(decoded, reference), relative_l2(decoded, reference)
            same, gap = argmax_agreement(decoded.astype(np.float32) @ head, reference.astype(np.float32) @ head)
            print(f"  {name:24s} {scheme:10s} {c.min():9.6f} {np.median(c):11.7f} {1 - c.min():10.1e} "
                  f"{l2.max():11.2e} {np.median(l2):14.2e} {same:12.4%} {gap:12.3f} sd")


def class_probabilities(rows: int, classes: int) -> None:
    """What 8-bit codes would do to soft-label targets: full softmax distributions of a peaked head."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (rows, classes)) + 6 * (rng.random((rows, classes)) < 2 / classes)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p = (p / p.sum(1, keepdims=True)).astype(np.float16).astype(np.float64)
    coded = np.clip(q8_round_trip(p.astype(np.float32)).astype(np.float64), 0, None)
    tv = 0.5 * np.abs(coded / coded.sum(1, keepdims=True) - p).sum(1)
    small = p < 1e-3
    tail = np.abs(coded - p)[small].sum() / p[small].sum()
    print(f"\nclass distributions ({classes} classes) as q8 instead of float16: total variation "
          f"median {np.median(tv):.1e}, max {tv.max():.1e}; the mass of probabilities < 1e-3 moves by "
          f"{tail:.1%}; they stay float16")


def synthetic_record(rng: np.random.Generator, boxes: int, dim: int, variants: int) -> dict:
    """A record as the detector gives it: float32 BUTD-like rows."""
    return bench_store.synthetic_record(rng, boxes, dim, variants, draw=butd_like)


def best_seconds(fn: Callable[[], object], repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def sizes_and_times(boxes: int, dim: int) -> None:
    rng = np.random.default_rng(2)
    print(f"\nper image at {boxes} boxes, {dim}-d, top-10 classes (records from float32 detector output; "
          "encode = as_stored + encode_record, decode = decode_record, checksums included):")
    print(f"  {'':10s} {'K':>2s} {'KiB/image':>10s} {'x float16':>10s} {'CC3M TB':>8s} {'encode ms':>10s} "
          f"{'decode ms':>10s} {'zlib-6 size':>12s} {'zlib ms':>8s}")
    for variants in (0, 3):
        record = synthetic_record(rng, boxes, dim, variants)
        sizes = {}
        for name in ("float16", "q8"):
            data = encode_record(as_stored(record, name), "id")
            sizes[name] = len(data)
            encode = best_seconds(lambda: encode_record(as_stored(record, name), "id"))
            decode = best_seconds(lambda: decode_record(data, "id"))
            packed = zlib.compress(data, 6)
            squeeze = best_seconds(lambda: zlib.compress(data, 6), repeats=3)
            print(f"  {name:10s} {variants:2d} {len(data) / 1024:10.1f} {len(data) / sizes['float16']:10.3f} "
                  f"{len(data) * CC3M_IMAGES / 1e12:8.2f} {encode * 1e3:10.2f} {decode * 1e3:10.2f} "
                  f"{len(packed) / len(data):11.3f}x {squeeze * 1e3:8.1f}")
    rows = {name: encoding.row_bytes(dim) for name, encoding in FEATURE_ENCODINGS.items()}
    print(f"  one feature row: {rows} bytes; q8 / float16 = {rows['q8'] / rows['float16']:.4f}")


def reading(work: Path, records: int, boxes: int, dim: int) -> None:
    """Training reads of the same records from a float16 and a q8 store, side by side."""
    banks = {}
    for variants in (0, 3):
        for name in ("float16", "q8"):
            rng = np.random.default_rng(3)
            meta = build_meta(feature_dim=dim, feature_dtype=name, mode="imported", num_classes=1601,
                              top_k_classes=10, mask_variants=variants)
            with FeatureStoreWriter(work / f"read-{name}-k{variants}", meta) as writer:
                for i in range(records):
                    writer.commit({f"{i:05d}": as_stored(synthetic_record(rng, boxes, dim, variants), name)})
            banks[name, variants] = RegionBank(str(work / f"read-{name}-k{variants}"))
    keys = [f"{i:05d}" for i in range(records)]
    print(f"\ntraining reads (RegionBank.get, {records} records, best of 3 passes), records/s:")
    for variants, label, wanted in ((0, "fine-tuning, K=0 store: features", {}),
                                    (3, "fine-tuning, K=3 store: features", {}),
                                    (3, "pre-training, K=3: + class targets, variants",
                                     {"class_probs": True, "variants": True})):
        rates = {}
        for _ in range(3):  # alternately, so that both see the same machine
            for name in ("float16", "q8"):
                bank = banks[name, variants]
                seconds = best_seconds(lambda: [bank.get(key, **wanted) for key in keys], repeats=1)
                rates[name] = max(rates.get(name, 0.0), records / seconds)
        print(f"  {label:44s} float16 {rates['float16']:7.0f}  q8 {rates['q8']:7.0f}  "
              f"q8/float16 {rates['q8'] / rates['float16']:.2f}")
    for bank in banks.values():
        bank.store.close()


def detector_features(work: Path, images: int) -> None:
    """The whole job with the tiny detector (random weights), float16 vs q8, and its own box
    predictor applied to what each store holds."""
    write_synthetic_images(work / "images", images)
    model = Detector.build("tiny")
    stores, bytes_per_image = {}, {}
    for name in ("float16", "q8"):
        for variants in (0, 3):
            out = work / f"{name}-k{variants}"
            summary = run_extraction(ExtractionConfig(work / "images", "tiny", feature_dtype=name,
                                                      mask_variants=variants, progress=False), out)
            bytes_per_image[name, variants] = summary.bytes_written / summary.written
        stores[name] = FeatureStore(work / f"{name}-k3")
    keys = stores["float16"].keys()
    rows = {name: np.concatenate([np.concatenate([store[k]["features"], store[k]["masked_features"].reshape(
        -1, store[k]["features"].shape[1])]) for k in keys]) for name, store in stores.items()}
    with torch.no_grad():
        logits = {name: model.roi_heads.box_predictor(torch.from_numpy(r.astype(np.float32))).class_logits.numpy()
                  for name, r in rows.items()}
    c = cosine(rows["q8"], rows["float16"])
    same, gap = argmax_agreement(logits["q8"], logits["float16"])
    print(f"\ntiny detector, {len(keys)} synthetic images through run_extraction (random weights, "
          f"{rows['q8'].shape[1]}-d): {len(c)} rows incl. 3 variants, cosine to float16 min {c.min():.6f}, "
          f"class argmax of its box predictor the same for {same:.2%} (flips at top-2 gaps up to {gap:.3f} sd)")
    for variants in (0, 3):
        f16, coded = bytes_per_image["float16", variants], bytes_per_image["q8", variants]
        print(f"  K={variants}: {f16 / 1024:.1f} KiB/image float16, {coded / 1024:.1f} KiB q8 ({coded / f16:.3f}x)")
    for store in stores.values():
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000, help="rows per distribution in the fidelity table")
    parser.add_argument("--boxes", type=int, default=100)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--classes", type=int, default=1601)
    parser.add_argument("--images", type=int, default=8, help="synthetic images for the tiny detector runs")
    parser.add_argument("--records", type=int, default=100, help="records in the training-read comparison")
    args = parser.parse_args()
    print(f"numpy {np.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    sizes_and_times(args.boxes, args.dim)
    fidelity(args.rows, args.dim, args.classes)
    class_probabilities(args.rows // 5, args.classes)
    with tempfile.TemporaryDirectory() as tmp:
        reading(Path(tmp), args.records, args.boxes, args.dim)
        detector_features(Path(tmp), args.images)


if __name__ == "__main__":
    main()
