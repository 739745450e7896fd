"""Forward + backward step time and peak memory of two VL-BERT-base steps, side by side.

`--compare bert` (default): VL-BERT (64 text elements + 100 RoIs + [END], batch 8, random RoI
features and boxes) against `transformers`' BertModel of the same size over 164 tokens.
`--compare mlm`: a pre-training step's MLM loss with the 30,522-way head run on every text position
then the 15% labelled ones kept (as before), against the head run on the labelled ones only
(`VLBertForPreTraining` given `mlm_labels`). Each model lives in its own child process (so CPU
peak memory, the RSS growth over the steps, is its own) and they step in turn; the ratios are the
first row / the second. CPU runs take a few steps (a few minutes on 2 cores).

    python bench/bench_vlbert.py                 # CPU, and CUDA when available
    python bench/bench_vlbert.py --device cuda --amp bf16
    python bench/bench_vlbert.py --device cpu --compare mlm
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time

import torch
import torch.nn.functional as F


def vlbert_step_inputs(config, batch: int, text_length: int, regions: int, device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    size = torch.tensor([[640.0, 480.0]]).repeat(batch, 1)
    corners = torch.rand(batch, regions, 2, 2, generator=g).sort(2).values * size.view(batch, 1, 1, 2)
    boxes = corners.flatten(2)[..., [0, 2, 1, 3]].clone()
    boxes[:, 0] = torch.tensor([0.0, 0.0, 639.0, 479.0])
    inputs = dict(
        input_ids=torch.randint(1000, config.vocab_size, (batch, text_length), generator=g),
        token_type_ids=torch.zeros(batch, text_length, dtype=torch.long),
        text_mask=torch.ones(batch, text_length, dtype=torch.bool),
        appearance=torch.rand(batch, regions, config.visual_feature_size, generator=g),
        boxes=boxes,
        box_mask=torch.ones(batch, regions, dtype=torch.bool),
        image_size=size,
    )
    return {name: tensor.to(device) for name, tensor in inputs.items()}


MLM_LABELLED_SHARE = 0.15  # of the text positions, as whole-word masking labels them


def mlm_labels(input_ids: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    chosen = torch.rand(input_ids.shape, generator=g) < MLM_LABELLED_SHARE
    return input_ids.cpu().masked_fill(~chosen, -100).to(input_ids.device)


def build(kind: str, args) -> tuple[torch.nn.Module, callable]:
    """The model of `kind` and its step's loss (a function of nothing)."""
    if kind in ("vlbert", "mlm-every", "mlm-labelled"):
        from vlbert import VLBertConfig, VLBertForPreTraining, VLBertModel

        config = VLBertConfig(with_pooler=False)
        inputs = vlbert_step_inputs(config, args.batch_size, args.text_length, args.regions, args.device)
        if kind == "vlbert":
            model = VLBertModel(config).to(args.device)
            return model, lambda: model(**inputs).last_hidden_state.float().pow(2).mean()
        model = VLBertForPreTraining(config).to(args.device)
        labels = mlm_labels(inputs["input_ids"])
        if kind == "mlm-labelled":
            return model, lambda: model(**inputs, mlm_labels=labels).mlm_loss
        labelled = labels != -100
        return model, lambda: F.cross_entropy(model(**inputs).mlm_logits[labelled].float(), labels[labelled])
    from transformers import BertConfig, BertModel

    config = BertConfig(attn_implementation="sdpa")
    model = BertModel(config, add_pooling_layer=False).to(args.device)
    length = args.text_length + args.regions
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, config.vocab_size, (args.batch_size, length), generator=g).to(args.device)
    mask = torch.ones_like(ids)
    return model, lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state.float().pow(2).mean()


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def worker(kind: str, args, connection) -> None:
    """Build one model, then run a timed step each time the parent says "step"; finally report memory."""
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, step_loss = build(kind, args)
    model.train()
    amp = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    cuda = args.device == "cuda"

    def step() -> float:
        start = time.perf_counter()
        with torch.autocast(args.device, dtype=amp, enabled=amp is not None):
            loss = step_loss()
        loss.backward()
        model.zero_grad(set_to_none=False)  # gradients stay allocated, as across training steps
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    step()  # warm-up: allocator, kernels, the gradients' first allocation
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = current_rss_bytes()
    connection.send("ready")
    while connection.recv() == "step":
        connection.send(step())
    if cuda:
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    connection.send(max(peak, 0))


def compared_rows(args) -> tuple[tuple[str, str], tuple[str, str]]:
    """(kind, label) of the two steps `args.compare` sets side by side; ratios are first / second."""
    total = args.text_length + args.regions
    if args.compare == "bert":
        return (("vlbert", f"VL-BERT-base, {args.text_length} text + {args.regions} RoIs + [END] = {total + 1} elements"),
                ("bert", f"BertModel (BERT-base), {total} tokens"))
    share = f"{MLM_LABELLED_SHARE:.0%} of {args.text_length} text labelled"
    return (("mlm-every", f"VL-BERT-base pre-training, MLM head on every text position ({share})"),
            ("mlm-labelled", "VL-BERT-base pre-training, MLM head on the labelled positions only"))


def run_device(args) -> None:
    """Both models live in their own process (own peak memory) and step in turn, so that any
    background load on the machine falls on both alike."""
    context = multiprocessing.get_context("spawn")
    kinds = tuple(kind for kind, _ in compared_rows(args))
    connections, children = {}, []
    for kind in kinds:
        parent_end, child_end = context.Pipe()
        child = context.Process(target=worker, args=(kind, args, child_end))
        child.start()
        connections[kind] = parent_end
        children.append(child)
    for kind in kinds:
        if connections[kind].recv() != "ready":
            raise SystemExit(f"{kind} benchmark failed to start on {args.device}")
    times = {kind: [] for kind in kinds}
    for _ in range(args.iterations):
        for kind in kinds:
            connections[kind].send("step")
            times[kind].append(connections[kind].recv())
    peaks = {}
    for kind in kinds:
        connections[kind].send("stop")
        peaks[kind] = connections[kind].recv()
    for child in children:
        child.join()
    report(args, {kind: sorted(times[kind]) for kind in kinds}, peaks)


def report(args, times: dict[str, list[float]], peaks: dict[str, int]) -> None:
    def median(kind: str) -> float:
        return times[kind][len(times[kind]) // 2]

    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{args.threads or torch.get_num_threads()} threads"
    memory = "peak allocated over the steps" if args.device == "cuda" else "peak RSS growth over the steps"
    print(f"\n== {args.device} ({where}), batch {args.batch_size}, amp {args.amp}, {args.iterations} timed steps each")
    rows = compared_rows(args)
    for kind, label in rows:
        print(f"{label:<80} step {median(kind) * 1000:9.1f} ms (min {times[kind][0] * 1000:.1f}), "
              f"{memory} {peaks[kind] / 2**20:8.1f} MiB")
    (first, _), (second, _) = rows
    print(f"ratio {first} / {second}: step time {median(first) / median(second):.3f}, "
          f"memory {peaks[first] / max(peaks[second], 1):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("all", "cpu", "cuda"), default="all")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--text-length", type=int, default=64)
    parser.add_argument("--regions", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=None, help="timed steps (default: CPU 3, CUDA 20)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none")
    parser.add_argument("--compare", choices=("bert", "mlm"), default="bert",
                        help="VL-BERT vs BertModel, or the MLM head on every vs the labelled positions")
    args = parser.parse_args()
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        if args.device == "cuda":
            raise SystemExit("CUDA is not available")
        devices.remove("cuda")
        print("CUDA not available: CPU only")
    iterations = args.iterations
    for device in devices:
        args.device = device
        args.iterations = iterations or (3 if device == "cpu" else 20)
        run_device(args)


if __name__ == "__main__":
    main()
