"""Retrieval scoring throughput: pairs/s of the cross-encoder over every (image, caption) pair, with
each image's regions read from the store once (cached) vs once per pair, and the projected time of a
1k-image × 5k-caption test set (5M pairs: Flickr30K's or COCO 1k's) at the measured rate.

    .venv/bin/python bench/bench_retrieval.py                      # tiny and VL-BERT-base, CPU (CUDA when available)
    .venv/bin/python bench/bench_retrieval.py --images 100 --batch-size 128 --models tiny

Builds a small demo world and its FeatureStore (tiny detector) in a temporary folder and scores its
val split with the trainer's own evaluation loop (train/engine/evaluate.py) and the retrieval
evaluator, whose pairs/s counts data reading, collation and the forward pass. The tiny detector
stores narrower features than BUTD's 2048, so reading a record here costs less than on real data.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.world.tiny import TINY_MODEL, build_tiny_world  # noqa: E402
from train.data.annotations import AnnotationFile  # noqa: E402
from train.data.regions import RegionBank  # noqa: E402
from train.engine.evaluate import EvaluationSetting, evaluate  # noqa: E402
from train.tasks.retrieval import RetrievalCandidates, RetrievalRecall  # noqa: E402
from vlbert import VLBertConfig  # noqa: E402
from vlbert.modeling import VLBertForImageTextMatching  # noqa: E402
from vlbert.tokenization import load_tokenizer  # noqa: E402
from vlbert.utils.precision import PRECISIONS  # noqa: E402

MODELS = {"tiny": TINY_MODEL, "base": {}}  # base: VLBertConfig's defaults are VL-BERT-base's sizes
TEST_PAIRS = 1_000 * 5_000


def pairs_per_s(model, dataset: RetrievalCandidates, batch_size: int, device: torch.device, pad: int) -> float:
    evaluator = RetrievalRecall(None, dataset)
    evaluate(evaluator, model, None, dataset, EvaluationSetting(batch_size, device, pad, PRECISIONS["fp32"]),
             lambda batch: None)
    return evaluator.result()["pairs_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=60, help="demo world images (a fifth are the val split)")
    parser.add_argument("--repeats", type=int, default=2, help="timings per mode, alternating; the best is kept")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=40)
    parser.add_argument("--models", default="tiny,base", help=f"comma-separated, of {', '.join(MODELS)}")
    args = parser.parse_args()
    print("command:", shlex.join([".venv/bin/python", "bench/bench_retrieval.py", *sys.argv[1:]]))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = build_tiny_world(Path(tmp), images=args.images)
        tokenizer = load_tokenizer(root / "vocab")
        bank = RegionBank(str(root / "cache"))
        annotations = AnnotationFile(root / "world" / "val.jsonl", keep=bank.__contains__)
        print(f"device {device}, torch threads {torch.get_num_threads()}, batch {args.batch_size}")
        for name in args.models.split(","):
            config = VLBertConfig(**MODELS[name], vocab_size=len(tokenizer), visual_feature_size=bank.feature_dim)
            model = VLBertForImageTextMatching(config).to(device).eval()
            rates = {False: 0.0, True: 0.0}
            for _ in range(args.repeats):  # alternating, so warm-up and load changes hit both modes
                for cached in rates:
                    dataset = RetrievalCandidates(annotations, bank, tokenizer, args.max_length, cache_images=cached)
                    rate = pairs_per_s(model, dataset, args.batch_size, device, tokenizer.pad_token_id)
                    rates[cached] = max(rates[cached], rate)
            hours = TEST_PAIRS / rates[True] / 3600
            print(f"{name:5s} {len(dataset.images)} images × {len(dataset.captions)} captions: "
                  f"{rates[False]:.1f} pairs/s reading per pair, {rates[True]:.1f} pairs/s cached "
                  f"(×{rates[True] / rates[False]:.2f}); 1k × 5k test set: {hours:.1f} h")


if __name__ == "__main__":
    main()
