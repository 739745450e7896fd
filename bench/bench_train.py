"""Training throughput through the Trainer at steady state: samples/s, the share of time waiting for
data, and the share of the device's bf16 peak, measured side by side in one run.

    .venv/bin/python bench/bench_train.py                                   # CPU, tiny model, a quick look
    .venv/bin/python bench/bench_train.py --baseline /tmp/base              # ... beside the code at /tmp/base
    python bench/bench_train.py --device cuda --model base --batch-sizes 16,32,64,128,256 --precisions bf16 \\
        --warmup 20 --steps 200 --variable-regions --profile /tmp/profile
    python bench/bench_train.py --device cuda --model base --batch-sizes 64,256 --precisions bf16 \\
        --warmup 10 --steps 200 --feature-dtypes float16,q8 --tasks pretrain,refexp

The demo world gives the annotations (VQA questions) and vocabulary; the FeatureStore holds
BUTD-sized synthetic records for its images (2048-d float16 features, 100 boxes, top-10 class
probabilities), so batches move what real training moves. `--feature-dtypes float16,q8` trains each
configuration on such a store of q8 features too (their 8-bit codes copied to the device and decoded
there); the bytes a batch copies to the device from each store are printed first (measured on the
host: bytes, not time). `--variable-regions` adds a store with BUTD's 10–100 regions per image,
trained with length-aware batches off and on; `--end2end` the end-to-end stage (the butd-vg
detector's trunk and res5, random weights, on the world's images at its 600-pixel short side) and the
ratio of the cached stage's samples/s to it. `--tasks pretrain,refexp` adds stages of those tasks at
the first configuration's settings (pre-training masks RoIs by feature: the stores have no
masked-pixel variants), whose steps read nothing on the host.

Each configuration trains one VQA stage of --warmup + --steps steps in a fresh run folder, in a
child process that imports the code under test (this tree, or --baseline: a checkout of another
commit, e.g. `git worktree add /tmp/base HEAD~1`). Its figures come from inside the training loop:
the stage's eval.json times the steps between the end of its first logging interval (the warm-up:
start-up, first batches, compilation) and its last step, at points where the host has waited for
the device (`train.engine.stage_progress`); "stage" is the old figure, the stage's wall time. MFU
is 6 × parameters (embedding tables left out) × real tokens/s over the device's dense bf16 peak
(PEAK_BF16; unknown for other devices and the CPU). Configurations alternate over --repeats and
the best of each is kept, so a change of load on a shared machine falls on all of them.

--loader measures the data loader alone, without training: the CPU time per sample to make and collate
a stage's batches in one process on one thread (`num_workers: 0`), VQA and pre-training (captions with
the cached pixel-masked variants, as many text-only samples beside them: a sample is either), from a
BUTD-size store (100 RoIs, 2048-d) and a demo-size one (20 RoIs, 256-d), each with 2 masked variants
per image (and top-10 of 1601 class probabilities), read as the trainer reads them (`encoded`), with the
bytes a sample's batch entries copy to the device; the best of --loader-epochs epochs after a first,
whose figure (caches filling) is printed beside it, under fixed malloc thresholds (LOADER_MALLOC):

    .venv/bin/python bench/bench_train.py --loader --baseline /tmp/base --repeats 3

--profile DIR saves a torch.profiler trace of the warm-up's last steps of the first configuration, or
of the one --profile-index names in the order they run (a compiled one, say), as trace.json.gz (for
chrome://tracing or Perfetto), and prints where a step's time goes: the trainer's ranges (data
wait, host to device, forward, backward, optimiser, losses to host), on the host and on the device,
the device's busy share, and the host's waits for the device (synchronisations, copies to the host).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from checkouts import ROOT, checkout, run_child

MODELS = {
    "tiny": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                 max_position_embeddings=128, geometry_frequencies=16),
    "base": {},  # VLBertConfig's defaults: VL-BERT-base
}
BOXES, DIM = 100, 2048
# --loader's stores, name → (boxes, feature dimension), each with LOADER_VARIANTS masked-pixel variants
# per image (every row changed, as BUTD's receptive fields make them), and its tasks' stage options
LOADER_STORES = {"butd": (BOXES, DIM), "demo": (20, 256)}
LOADER_VARIANTS = 2
LOADER_TASKS = ("vqa", "pretrain")
LOADER_OPTIONS = {"pretrain": {"roi_masking": "pixel"}}  # the cached variants; text-only samples beside captions
# glibc's malloc settings for --loader's children: a BUTD-size sample's arrays (0.4-1.2 MB) and batches
# (6.6 MB) are otherwise given back to the system and faulted in again, or not, as the heap's layout
# falls (by the hash seed): ~140 page faults and +0.35 ms a sample in either checkout, at random.
LOADER_MALLOC = "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=134217728"
FEWEST_BOXES = 10  # BUTD keeps 10 to 100 boxes per image
EVAL_IMAGES = 8
# Dense bf16 peaks (TFLOP/s, without sparsity) by a part of the device's name, most specific first.
PEAK_BF16 = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0),
             ("GH200", 989.0), ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0),
             ("L4", 121.0), ("A10", 125.0)]
PHASES = ("data wait", "host to device", "forward", "backward", "optimiser", "losses to host")
PROFILED_STEPS = 3
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::_local_scalar_dense")


def peak_bf16(device_name: str) -> float | None:
    """The device's dense bf16 peak in FLOP/s, None when the table does not know it."""
    return next((tflops * 1e12 for part, tflops in PEAK_BF16 if part in device_name), None)


def make_world(work: Path, images: int) -> list[str]:
    """The demo world (annotations, vocabulary) in `work`; its image ids."""
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from pipelines.world.generate import generate_world
    from train.data.annotations import read_annotations
    from train.data.vocabulary import write_world_vocabulary

    world = work / "world"
    generate_world(world, num_images=images, seed=3)
    # Evaluation is no part of the figures: a few images of the split keep its time short.
    lines = (world / "val.jsonl").read_text().splitlines(keepends=True)
    (world / "val-few.jsonl").write_text("".join(lines[:EVAL_IMAGES]))
    write_world_vocabulary(world, work / "vocab")
    return sorted({a.image_id for split in ("train", "val") for a in read_annotations(world / f"{split}.jsonl")})


def write_store(root: Path, ids: list[str], boxes, rng: np.random.Generator, dim: int = DIM, variants: int = 0,
                **settings) -> None:
    """A store of synthetic BUTD-like records (`bench_store.synthetic_record`, top-10 of 1601 classes) for
    `ids`, `boxes()` boxes each, with `variants` masked-pixel variants whose every row changed."""
    from bench_store import synthetic_record
    from extract.store import FeatureStoreWriter, build_meta

    meta = build_meta(feature_dim=dim, mode="imported", num_classes=1601, top_k_classes=10, mask_variants=variants,
                      **settings)
    with FeatureStoreWriter(root, meta) as writer:
        for start in range(0, len(ids), 50):
            writer.commit({i: synthetic_record(rng, boxes(), dim, variants) for i in ids[start:start + 50]})


def make_data(work: Path, images: int, end2end: bool) -> Path:
    """The demo world (annotations, vocabulary), a store of its images with 100 boxes each
    (`store`), the same of q8 features (`store-q8`), one with BUTD's 10–100 (`store-variable`), and with
    `end2end` one of 100 boxes that names the butd-vg detector (random weights) and the world's images
    (`store-e2e`)."""
    ids = make_world(work, images)
    from extract.presets import PRESETS

    rng = np.random.default_rng(0)
    stores = [("store", lambda: BOXES, {}), ("store-q8", lambda: BOXES, dict(feature_dtype="q8")),
              ("store-variable", lambda: int(rng.integers(FEWEST_BOXES, BOXES + 1)), {})]
    if end2end:
        stores.append(("store-e2e", lambda: BOXES, dict(images_root=str(work / "world"), detector={
            "source": "preset:butd-vg", "config": PRESETS["butd-vg"].to_dict(), "checkpoint": None})))
    for store, boxes, settings in stores:
        write_store(work / store, ids, boxes, rng, **settings)
    return work


def transfer_lines(work: Path, batch_sizes: list[int], max_length: int) -> list[str]:
    """The bytes that one VQA batch of each size copies from the host to the device, from the float16
    store and the q8 one (its codes, or float32 decoded in the loader's workers), by this tree's code."""
    from train.data.annotations import AnnotationFile
    from train.data.collate import transfer_bytes
    from train.data.regions import RegionBank
    from train.engine.batches import Collate
    from train.tasks import TASKS
    from train.tasks.base import TaskData
    from vlbert.tokenization import load_tokenizer

    tokenizer = load_tokenizer(work / "vocab")
    lines = []
    for size in batch_sizes:
        sent = {}
        for name, store, on_host in (("float16", "store", False), ("q8 codes", "store-q8", False),
                                     ("q8 decoded in the workers (float32)", "store-q8", True)):
            bank = RegionBank(str(work / store), encoded=True)
            data = TaskData(bank, tokenizer, max_length, AnnotationFile(work / "world" / "train.jsonl"))
            dataset = TASKS["vqa"].dataset(data, TASKS["vqa"].options(), data.train, 0, True)
            samples = [dataset[i] for i in range(size)]
            sent[name] = transfer_bytes(Collate(tokenizer.pad_token_id, decode_on_host=on_host)(samples).inputs)
        lines.append(f"  host to device, a VQA batch of {size} ({BOXES} RoIs + the image, {DIM}-d): "
                     + ", ".join(f"{name} {count / 2**20:.2f} MiB ({count / sent['float16']:.2f}x)"
                                 for name, count in sent.items()))
    return lines


def make_loader_data(work: Path, images: int) -> list[str]:
    """The demo world and a store of each LOADER_STORES size for its images; the stores' names."""
    ids = make_world(work, images)
    rng = np.random.default_rng(0)
    for name, (boxes, dim) in LOADER_STORES.items():
        write_store(work / name, ids, lambda: boxes, rng, dim=dim, variants=LOADER_VARIANTS)
    return list(LOADER_STORES)


def loader_times(spec: dict) -> None:
    """In the child process: for each store and task, the process's CPU time per sample to make and
    collate a stage's batches (as `num_workers: 0` makes them, on one thread, without training), best
    of the epochs after a first (which fills caches); a JSON line each."""
    sys.path.insert(0, str(checkout()))
    import torch

    from train.data.annotations import AnnotationFile
    from train.data.collate import transfer_bytes
    from train.data.regions import RegionBank
    from train.engine.batches import Collate
    from train.tasks import TASKS
    from train.tasks.base import TaskData
    from vlbert.tokenization import load_tokenizer

    torch.set_num_threads(1)
    work = Path(spec["work"])
    tokenizer = load_tokenizer(work / "vocab")
    collate = Collate(tokenizer.pad_token_id)
    for store in spec["stores"]:
        for task in spec["tasks"]:
            data = TaskData(RegionBank(str(work / store), encoded=True), tokenizer, spec["max_length"],
                            AnnotationFile(work / "world" / "train.jsonl"))
            options = TASKS[task].options(**LOADER_OPTIONS.get(task, {}), **(
                {"corpus": str(work / "world" / "corpus.txt")} if task == "pretrain" else {}))
            dataset = TASKS[task].dataset(data, options, data.train, 0, True)
            streams = [dataset, *TASKS[task].extra_streams(data, options, 0)]
            order = np.random.default_rng(0).permutation(len(dataset)).tolist()
            size, seconds, faults, copied = spec["batch_size"], [], [], 0
            for epoch in range(spec["epochs"] + 1):
                for stream in streams:
                    stream.set_epoch(epoch)
                start, faulted = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                for first in range(0, len(order), size):
                    indices = order[first : first + size]
                    batch = collate([stream[index % len(stream)] for stream in streams for index in indices])
                    copied += transfer_bytes(batch.inputs) if epoch == 0 else 0
                seconds.append(time.process_time() - start)
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faulted)
            samples, best = len(order) * len(streams), 1 + int(np.argmin(seconds[1:]))
            print(json.dumps({"store": store, "task": task, "samples": samples, "first_epoch": seconds[0] / samples,
                              "per_sample": seconds[best] / samples, "faults": faults[best] / samples,
                              "copied": copied / samples}), flush=True)


def show_loader(code: str, result: dict) -> str:
    return (f"  {code:9s} {loader_label(result)}: {result['per_sample'] * 1e6:7.1f} us a sample, "
            f"{result['faults']:5.1f} page faults, {result['copied'] / 1024:6.1f} KiB to the device "
            f"(first epoch {result['first_epoch'] * 1e6:7.1f} us)")


def loader_label(result: dict) -> str:
    boxes, dim = LOADER_STORES[result["store"]]
    return f"{result['task']:8s} {result['store']}-size store ({boxes} RoIs, {dim}-d, {LOADER_VARIANTS} variants)"


def measure_loader(args, codes: dict[str, Path]) -> None:
    """--loader: each checkout's CPU time per sample made and collated, the best of --repeats, and the ratios."""
    os.environ.setdefault("GLIBC_TUNABLES", LOADER_MALLOC)  # for the children
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"loader": dict(work=tmp, stores=make_loader_data(Path(tmp), args.images), tasks=LOADER_TASKS,
                               epochs=args.loader_epochs, batch_size=int(args.batch_sizes.split(",")[0]),
                               max_length=args.max_length)}
        print(f"loader CPU time per sample (made and collated, one thread, no training), batch "
              f"{spec['loader']['batch_size']}, best of {args.loader_epochs} epochs after a first, GLIBC_TUNABLES="
              f"{os.environ['GLIBC_TUNABLES']}; as each ends:", flush=True)
        best: dict[tuple[str, str, str], dict] = {}
        for _ in range(args.repeats):
            for code, path in codes.items():
                for result in run_child(__file__, path, spec, each=lambda result, code=code: print(
                        show_loader(code, result), flush=True)):
                    key = (code, result["store"], result["task"])
                    if key not in best or result["per_sample"] < best[key]["per_sample"]:
                        best[key] = result
    print(f"best of {args.repeats}:")
    for (code, *_), result in best.items():
        print(show_loader(code, result))
    if args.baseline:
        for (code, store, task), result in best.items():
            if code == "baseline":
                ratio = result["per_sample"] / best[("this tree", store, task)]["per_sample"]
                print(f"  {loader_label(result)}: baseline / this tree {ratio:.2f}x the CPU time")


# Stage switches of the model's speed paths (train/engine/speed.py), each an option off, on or "first",
# and how a configuration's label shows it on.
MODEL_SWITCHES = {"skip_unread_pooler": "unread pooler skipped", "fused_encoder_layers": "fused encoder layers"}


def run_spec(work: Path, out: str, args, config: dict) -> dict:
    end2end = config["store"] == "store-e2e"
    steps = args.warmup + (args.end2end_steps if end2end else args.steps)
    task = config["task"]
    stage = dict(name=task, task=task, steps=steps, batch_size=config["batch_size"], base_lr=1e-5,
                 num_workers=config["workers"], checkpoint_minutes=0, visual="end2end" if end2end else "cached")
    if task == "pretrain":
        stage["options"] = {"roi_masking": "feature"}  # the stores hold no masked-pixel variants
    if config["precision"] != "fp32":  # code from before the field ran fp32 on the CPU and has no such field
        stage["precision"] = config["precision"]
    # Fields that code from before them lacks are given only where they are not their default.
    mode = config["compile"]  # torch.compile's mode, or False
    stage.update({k: v for k, v in (("log_every", args.warmup), ("length_buckets", config["buckets"]),
                                    ("compile", bool(mode)), ("compile_mode", mode != "default" and mode),
                                    *((name, config[name]) for name in MODEL_SWITCHES)) if v})
    if args.prefetch == "off":
        stage["prefetch"] = False
    return dict(out=str(work / out), store=str(work / config["store"]), vocabulary=str(work / "vocab"),
                train_annotations=str(work / "world" / "train.jsonl"),
                eval_annotations=str(work / "world" / "val-few.jsonl"), model=MODELS[args.model],
                max_length=args.max_length, eval_batch_size=config["batch_size"], device=args.device, stages=[stage])


def train(specs: list[dict], profile: str | None, profiled_index: int = 0) -> None:
    """In the child process: each spec trained by the checkout's code; prints each stage's evaluation
    with the trained parameters (embedding tables left out) and the device's name, a line each."""
    sys.path.insert(0, str(checkout()))
    import torch

    from train.engine.config import RunConfig, StageConfig
    from train.engine.run_folder import RunFolder
    from train.engine.trainer import Trainer
    from vlbert.modeling import load_pretrained

    known = {field.name for field in dataclasses.fields(StageConfig)}
    for index, spec in enumerate(specs):
        # Code from before a speed field trains without it; the result names what it left out.
        ignored = sorted(set(spec["stages"][0]) - known)
        spec["stages"][0] = {k: v for k, v in spec["stages"][0].items() if k in known}
        run = RunConfig.from_dict(spec)
        try:
            trainer = Trainer(run, log=lambda message: None)
            if profile and index == profiled_index:
                result = profiled(trainer, run.stages[0].log_every, Path(profile))
            else:
                result = trainer.fit()[0]
        except Exception as exc:  # one configuration's failure is its line; the next still runs
            print(json.dumps({"failed": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}), flush=True)
            continue
        model = load_pretrained(RunFolder(run.out_dir).stage(0, run.stages[0].name).final)
        embeddings = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
        device = torch.cuda.get_device_name() if run.device.startswith("cuda") else "cpu"
        print(json.dumps({**result, "parameters": sum(p.numel() for p in model.parameters()) - embeddings,
                          "device_name": device, "ignored_fields": ignored}), flush=True)


def profiled(trainer, warmup: int, folder: Path) -> dict:
    """`trainer.fit()` with a torch.profiler trace of the last PROFILED_STEPS steps of the warm-up (of
    `warmup` steps), and its summary, in `folder`."""
    from torch.profiler import ProfilerActivity, profile, schedule

    folder.mkdir(parents=True, exist_ok=True)
    cuda = trainer.device.type == "cuda"

    def written(profiler) -> None:
        profiler.export_chrome_trace(str(folder / "trace.json.gz"))
        (folder / "summary.txt").write_text(profile_summary(profiler, PROFILED_STEPS, cuda) + "\n")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # The profiled steps end with the warm-up, so that the profiler's cost stays out of the steady figures.
    waited = max(0, warmup - PROFILED_STEPS - 2)
    with profile(activities=activities, schedule=schedule(wait=waited, warmup=2, active=PROFILED_STEPS, repeat=1),
                 on_trace_ready=written) as profiler:
        original = trainer._optimiser_step

        def stepped(*args, **kwargs):
            losses = original(*args, **kwargs)
            profiler.step()
            return losses

        trainer._optimiser_step = stepped
        return trainer.fit()[0]


def profile_summary(profiler, steps: int, cuda: bool) -> str:
    """Per step: each of the trainer's ranges on the host and the device, the device's busy time, and
    the host's waits for the device."""
    events = profiler.key_averages()
    by_name = {event.key: event for event in events}

    def device_us(event) -> float:
        return getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0))

    lines = [f"profile, per step (mean of the warm-up's last {steps} steps): host ms, device ms"]
    for phase in PHASES:
        event = by_name.get(phase)
        if event is not None:
            lines.append(f"  {phase:15s} host {event.cpu_time_total / 1e3 / steps:8.2f} ms   "
                         f"device {device_us(event) / 1e3 / steps:8.2f} ms   ({event.count // steps} per step)")
    if cuda:
        kernels = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) for e in events)
        lines.append(f"  device kernels and copies: {kernels / 1e3 / steps:.2f} ms per step")
    waits = [(name, by_name[name].count / steps) for name in HOST_WAITS if name in by_name]
    lines.append("  synchronisations and reads of a tensor's value by the host per step (on CUDA, each waits for "
                 "the device): "
                 + (", ".join(f"{name} {count:g}" for name, count in waits) if waits else "none"))
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    lines.append("  top host operators (self ms per step): "
                 + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e3 / steps:.2f}" for e in top))
    return "\n".join(lines)


def configurations(args) -> list[dict]:
    """In the order they run (a time limit cuts the last): the first configuration (the first of each
    list), it compiled in each of --compile-modes (--compile first), its runs on the store of 10-100
    regions, the end-to-end stage, the other configurations, the other tasks at the first
    configuration's settings, then the first with each of MODEL_SWITCHES on whose option says "first"
    (--skip-unread-pooler first, ...). A configuration's `compile` is torch.compile's mode, or False."""
    workers = [None if w == "auto" else int(w) for w in args.workers.split(",")]
    stores = {"float16": "store", "q8": "store-q8"}
    modes = args.compile_modes.split(",")
    fixed = [dict(store=stores[d], batch_size=b, precision=p, workers=w, buckets=False,
                  compile=args.compile == "on" and modes[0], task="vqa",
                  **{name: getattr(args, name) == "on" for name in MODEL_SWITCHES})
             for b in map(int, args.batch_sizes.split(",")) for d in args.feature_dtypes.split(",")
             for p in args.precisions.split(",") for w in workers]
    compiled = [dict(fixed[0], compile=mode) for mode in modes] if args.compile == "first" else []
    variable = [dict(fixed[0], store="store-variable", buckets=buckets) for buckets in (False, True)]
    end2end = dict(fixed[0], store="store-e2e", batch_size=args.end2end_batch_size, compile=False)
    tasks = [dict(fixed[0], task=task) for task in args.tasks.split(",") if task != "vqa"]
    switched = [dict(fixed[0], **{name: True}) for name in MODEL_SWITCHES if getattr(args, name) == "first"]
    return [fixed[0], *compiled, *(variable if args.variable_regions else []), *([end2end] if args.end2end else []),
            *fixed[1:], *tasks, *switched]


def label(config: dict) -> str:
    store = {"store-variable": "10-100 RoIs", "store-e2e": "end-to-end",
             "store-q8": f"{BOXES} RoIs q8"}.get(config["store"], f"{BOXES} RoIs")
    return (f"{config['task']:8s} {store:14s} {config['precision']:5s} batch {config['batch_size']:3d}, "
            f"{'auto' if config['workers'] is None else config['workers']} workers"
            + (", buckets" if config["buckets"] else "")
            + (f", compiled ({config['compile']})" if config["compile"] else "")
            + "".join(f", {shown}" for name, shown in MODEL_SWITCHES.items() if config[name]))


def show(code: str, config: dict, result: dict) -> str:
    if "failed" in result:
        return f"  {code:9s} {label(config)}: failed: {result['failed']}"
    steady = result.get("steady_samples_per_s")
    peak = peak_bf16(result.get("device_name", "cpu"))
    tokens = result.get("steady_tokens_per_s")
    mfu = f"{6 * result['parameters'] * tokens / peak:6.1%}" if peak and tokens else "unknown"
    wait = result.get("steady_data_wait_share", result.get("data_wait_share"))
    steady_text = f"{steady:8.1f} samples/s steady" if steady else "  steady n/a"
    return (f"  {code:9s} {label(config)}: {steady_text} ({result.get('steady_steps', 0)} steps), "
            f"stage {result['samples_per_s']:7.1f}, waiting for data {'n/a' if wait is None else f'{wait:5.1%}'}, "
            f"MFU {mfu}" + (f" (this code lacks {', '.join(result['ignored_fields'])})"
                            if result.get("ignored_fields") else ""))


def rate(result: dict) -> float:
    """A result's steady samples/s (its stage's where the code has none); 0 for a failed or no result."""
    return result.get("steady_samples_per_s") or result.get("samples_per_s", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out: the first logging interval")
    parser.add_argument("--steps", type=int, default=20, help="steps measured after the warm-up (200 on a GPU)")
    parser.add_argument("--batch-sizes", default="16", help="comma-separated")
    parser.add_argument("--max-length", type=int, default=140, help="text + RoIs + [END]: 100 RoIs fit")
    parser.add_argument("--workers", default="auto", help="comma-separated DataLoader worker counts, or auto")
    parser.add_argument("--precisions", default="fp32", help="comma-separated, of fp32, tf32, bf16, fp16")
    parser.add_argument("--feature-dtypes", default="float16",
                        help="comma-separated, of float16 and q8 (8-bit codes decoded on the device)")
    parser.add_argument("--tasks", default="vqa", help="comma-separated; tasks beside vqa (pretrain, refexp) train "
                        "at the first configuration's settings")
    parser.add_argument("--compile", default="off", choices=("off", "on", "first"),
                        help="torch.compile every configuration (in the first of --compile-modes), or also the "
                        "first one compiled in each mode")
    parser.add_argument("--compile-modes", default="default",
                        help="comma-separated torch.compile modes (the stage's compile_mode): default, "
                        "reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs")
    parser.add_argument("--prefetch", default="on", choices=("off", "on"), help="batches copied to CUDA a step ahead")
    for name in MODEL_SWITCHES:
        parser.add_argument(f"--{name.replace('_', '-')}", default="off", choices=("off", "on", "first"),
                            help=f"the stages' {name} in every configuration, or also the first one with it")
    parser.add_argument("--variable-regions", action="store_true",
                        help="also a store of 10-100 RoIs per image, length-aware batches off and on")
    parser.add_argument("--end2end", action="store_true", help="also the end-to-end stage (the butd-vg trunk and res5, "
                        "random weights, on the world's images) at the first configuration's precision")
    parser.add_argument("--end2end-batch-size", type=int, default=8)
    parser.add_argument("--end2end-steps", type=int, default=10, help="its steps measured after the warm-up")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", type=Path, help="a folder for the trace of the first configuration")
    parser.add_argument("--profile-index", type=int, default=0,
                        help="profile this configuration instead (0: the first; in the order they run, as printed)")
    parser.add_argument("--baseline", type=Path, help="another checkout of the project to time beside this one")
    parser.add_argument("--loader", action="store_true", help="measure the loader alone instead: CPU time per sample "
                        "made and collated (VQA and pre-training, stores with masked variants), no training")
    parser.add_argument("--loader-epochs", type=int, default=3, help="--loader's measured epochs (after a first)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        return (loader_times(spec["loader"]) if "loader" in spec
                else train(spec["runs"], spec.get("profile"), spec.get("profile_index", 0)))
    print("command:", shlex.join(["python", "bench/bench_train.py", *sys.argv[1:]]), flush=True)
    codes = {"this tree": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    if args.loader:
        return measure_loader(args, codes)
    configs = configurations(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = make_data(Path(tmp), args.images, args.end2end)
        print("\n".join(transfer_lines(work, list(map(int, args.batch_sizes.split(","))), args.max_length)),
              flush=True)
        best: dict[tuple[str, int], dict] = {}
        print(f"{args.device}, model {args.model}, {args.warmup} warm-up + {args.steps} measured steps, {DIM}-d "
              f"features ({args.feature_dtypes}); each configuration as it ends, then the best of {args.repeats}",
              flush=True)
        for repeat in range(args.repeats):
            for code, path in codes.items():
                profile = str(args.profile.resolve()) if args.profile and repeat == 0 and code == "this tree" else None
                runs = [run_spec(work, f"run-{code}-{repeat}-{index}", args, config)
                        for index, config in enumerate(configs)]
                ended = iter(range(len(runs)))

                def kept(result: dict, code: str = code) -> None:
                    index = next(ended)
                    print(show(code, configs[index], result), flush=True)
                    if rate(result) > rate(best.get((code, index), {})):
                        best[(code, index)] = result

                run_child(__file__, path, {"runs": runs, "profile": profile, "profile_index": args.profile_index},
                          each=kept)
        print(f"best of {args.repeats}:")
        for (code, index), result in sorted(best.items(), key=lambda item: item[0][1]):
            print(show(code, configs[index], result))
        if args.baseline:
            for index, config in enumerate(configs):
                new, old = (rate(best.get((code, index), {})) for code in codes)
                if new and old:
                    print(f"  {label(config)}: this tree / baseline {new / old:.2f}x")
        index = next((i for i, config in enumerate(configs) if config["store"] == "store-e2e"), None)
        cached, end2end = rate(best.get(("this tree", 0), {})), rate(best.get(("this tree", index), {}))
        if cached and end2end:
            print(f"  cached / end-to-end samples/s: {cached / end2end:.1f}x ({label(configs[0])} against "
                  f"{label(configs[index])})")
        if args.profile:
            print(f"profiled: {label(configs[args.profile_index])}")
            print((args.profile / "summary.txt").read_text().rstrip())
            print(f"  trace: {args.profile / 'trace.json.gz'}")

if __name__ == "__main__":
    main()
