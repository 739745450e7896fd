"""Training throughput: samples/s from the cache vs the end-to-end stage, and data loading's share of a step.

    .venv/bin/python bench/bench_train.py                 # CPU; CUDA too when available
    .venv/bin/python bench/bench_train.py --steps 20 --batch-size 16

Builds a small demo world and its FeatureStore (tiny detector) in a temporary folder, then times
VQA fine-tuning steps of the same model and batch: cached features vs features recomputed by the
detector with gradients; and, for the cached path, how much of each step waits on data with 0, 2
and 4 DataLoader workers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from train.data.annotations import AnnotationFile, AnswerVocabulary  # noqa: E402
from train.data.collate import collate  # noqa: E402
from train.data.datasets import QuestionAnswering  # noqa: E402
from train.data.regions import RegionBank  # noqa: E402
from train.end2end import EndToEndVisual  # noqa: E402
from training_world import make_world  # noqa: E402
from vlbert import VLBertConfig  # noqa: E402
from vlbert.modeling import VLBertForQuestionAnswering  # noqa: E402
from vlbert.tokenization import load_tokenizer  # noqa: E402

MODEL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64, geometry_frequencies=16)


def timed_steps(loader, model, visual, device: str, steps: int) -> tuple[float, float, int]:
    """(seconds in all, seconds waiting for batches, samples) over `steps` steps after one warm-up."""
    parameters = [p for m in (model, visual) if m is not None for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    batches = iter(loader)
    waiting = total = 0.0
    samples = 0
    for step in range(steps + 1):
        start = time.perf_counter()
        batch = next(batches)
        fetched = time.perf_counter()
        inputs = {k: v.to(device) for k, v in batch.items() if torch.is_tensor(v)}
        inputs.pop("mlm_labels")
        if visual is not None:
            inputs["appearance"] = visual({**inputs, "image_files": batch["image_files"]})
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if step:  # the first step warms up
            waiting += fetched - start
            total += time.perf_counter() - start
            samples += len(batch["input_ids"])
    return total, waiting, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = make_world(Path(tmp), images=args.images)
        tokenizer = load_tokenizer(root / "vocab")
        bank = RegionBank(str(root / "cache"))
        annotations = AnnotationFile(root / "world" / "train.jsonl", keep=bank.__contains__)
        dataset = QuestionAnswering(annotations, bank, tokenizer, 40, AnswerVocabulary.from_annotations(annotations))
        config = VLBertConfig(**MODEL, vocab_size=len(tokenizer), visual_feature_size=bank.feature_dim,
                              num_answers=len(dataset.answers))
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for device in devices:
            print(f"\n{device}: VQA steps, batch {args.batch_size}, {args.steps} timed steps, tiny detector")

            def loader(workers: int) -> DataLoader:
                return DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                                  collate_fn=lambda s: collate(s, tokenizer.pad_token_id), drop_last=True,
                                  persistent_workers=workers > 0)

            rates = {}
            for mode in ("cached", "end2end"):
                torch.manual_seed(0)
                model = VLBertForQuestionAnswering(config).to(device).train()
                visual = None
                if mode == "end2end":
                    visual = EndToEndVisual.from_store_meta(bank.store.meta, str(root / "world"), None).to(device)
                total, _, samples = timed_steps(loader(0), model, visual, device, args.steps)
                rates[mode] = samples / total
                print(f"  {mode:8s} {rates[mode]:8.1f} samples/s")
            print(f"  cached / end2end: {rates['cached'] / rates['end2end']:.1f}x")
            for workers in (0, 2, 4):
                torch.manual_seed(0)
                model = VLBertForQuestionAnswering(config).to(device).train()
                total, waiting, samples = timed_steps(loader(workers), model, None, device, args.steps)
                print(f"  cached, {workers} workers: {samples / total:8.1f} samples/s, "
                      f"data loading {100 * waiting / total:5.1f}% of step time")


if __name__ == "__main__":
    main()
