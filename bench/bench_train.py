"""Training throughput through the Trainer: samples/s, and the share of training time spent waiting
for data, measured side by side in one run.

    .venv/bin/python bench/bench_train.py                                  # CPU, tiny model, 0 and 2 workers
    .venv/bin/python bench/bench_train.py --baseline /tmp/base             # ... beside the code at /tmp/base
    python bench/bench_train.py --device cuda --model base --batch-size 32 --precisions fp32,bf16 --workers 4

The demo world gives the annotations (VQA questions) and vocabulary; the FeatureStore holds
BUTD-sized synthetic records for its images (2048-d float16 features, 100 boxes, top-10 class
probabilities), so batches move what real training moves. Each configuration trains one VQA
stage of --steps steps in a fresh run folder, in a subprocess that imports the code under test
(this tree, or --baseline: a checkout of another commit, e.g. `git worktree add /tmp/base HEAD~1`);
its figures are the stage's evaluation: samples/s and data_wait_share (the baseline may lack the
latter). Configurations alternate over --repeats and the best of each is kept, so a change of
load on a shared machine falls on all of them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np

from checkouts import ROOT, checkout, run_child

MODELS = {
    "tiny": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=128, geometry_frequencies=16),
    "base": {},  # VLBertConfig's defaults: VL-BERT-base
}
BOXES, DIM = 100, 2048


def make_data(work: Path, images: int) -> Path:
    """The demo world (annotations, vocabulary) and a BUTD-sized store of its images."""
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from bench_store import synthetic_record
    from extract.store import FeatureStoreWriter, build_meta
    from pipelines.world.generate import generate_world
    from train.data.annotations import read_annotations
    from train.data.vocabulary import write_world_vocabulary

    world = work / "world"
    generate_world(world, num_images=images, seed=3)
    write_world_vocabulary(world, work / "vocab")
    ids = sorted({a.image_id for split in ("train", "val") for a in read_annotations(world / f"{split}.jsonl")})
    rng = np.random.default_rng(0)
    meta = build_meta(feature_dim=DIM, mode="imported", num_classes=1601, top_k_classes=10)
    with FeatureStoreWriter(work / "store", meta) as writer:
        for start in range(0, len(ids), 50):
            writer.commit({i: synthetic_record(rng, BOXES, DIM, 0) for i in ids[start:start + 50]})
    return work


def run_spec(work: Path, out: str, args, workers: int, precision: str) -> dict:
    stage = dict(name="vqa", task="vqa", steps=args.steps, batch_size=args.batch_size, base_lr=1e-5,
                 num_workers=workers, checkpoint_minutes=0)
    if precision != "fp32":  # code from before the field ran fp32 on the CPU and has no such field
        stage["precision"] = precision
    return dict(out=str(work / out), store=str(work / "store"), train_annotations=str(work / "world" / "train.jsonl"),
                eval_annotations=str(work / "world" / "val.jsonl"), vocabulary=str(work / "vocab"),
                model=MODELS[args.model], max_length=args.max_length, eval_batch_size=args.batch_size,
                device=args.device, stages=[stage])


def train(spec: dict) -> None:
    """In the child process: `spec` trained by the checkout's code; prints the stage's evaluation."""
    sys.path.insert(0, str(checkout()))
    from train.engine.config import RunConfig
    from train.engine.trainer import Trainer

    print(json.dumps(Trainer(RunConfig.from_dict(spec), log=lambda message: None).fit()[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=140, help="text + RoIs + [END]: 100 RoIs fit")
    parser.add_argument("--workers", default="0,2", help="comma-separated DataLoader worker counts")
    parser.add_argument("--precisions", default="fp32", help="comma-separated, of fp32, tf32, bf16, fp16")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="another checkout of the project to time beside this one")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return train(json.loads(args.child))
    print("command:", shlex.join(["python", "bench/bench_train.py", *sys.argv[1:]]))
    codes = {"this tree": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    configurations = [(code, int(workers), precision) for code in codes for workers in args.workers.split(",")
                      for precision in args.precisions.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = make_data(Path(tmp), args.images)
        best: dict[tuple, dict] = {}
        for repeat in range(args.repeats):
            for index, (code, workers, precision) in enumerate(configurations):
                spec = run_spec(work, f"run-{repeat}-{index}", args, workers, precision)
                result = run_child(__file__, codes[code], spec)
                key = (code, workers, precision)
                if key not in best or result["samples_per_s"] > best[key]["samples_per_s"]:
                    best[key] = result
        print(f"{args.device}, model {args.model}, batch {args.batch_size}, {args.steps} steps, {BOXES} RoIs x {DIM}-d "
              f"float16, best of {args.repeats}")
        for (code, workers, precision), result in best.items():
            wait = result.get("data_wait_share")
            print(f"  {code:9s} {precision:5s} {workers} workers: {result['samples_per_s']:8.1f} samples/s, "
                  f"waiting for data {'n/a' if wait is None else f'{100 * wait:5.1f}%'} of training time")
        for workers in args.workers.split(","):
            for precision in args.precisions.split(","):
                if args.baseline:
                    new, old = (best[(code, int(workers), precision)]["samples_per_s"] for code in codes)
                    print(f"  {precision} {workers} workers: this tree / baseline {new / old:.2f}x")
        for workers in args.workers.split(","):
            rates = [best[("this tree", int(workers), p)]["samples_per_s"] for p in args.precisions.split(",")]
            if len(rates) > 1:
                print(f"  {workers} workers: " + ", ".join(f"{p} {r / rates[0]:.2f}x of {args.precisions.split(',')[0]}"
                                                        for p, r in zip(args.precisions.split(","), rates)))


if __name__ == "__main__":
    main()
