"""Forward + backward step time and peak memory of VL-BERT-base against `transformers`' BertModel.

VL-BERT: 64 text elements + 100 RoIs (+ [END]), batch 8, random RoI features and boxes.
BertModel: the same size (BERT-base) over 164 tokens. Both are measured side by side in one run:
each model lives in its own child process (so CPU peak memory, the RSS growth over the steps, is
its own) and they step in turn; the ratios are VL-BERT / BERT. CPU runs take a few steps (a few
minutes on 2 cores).

    python bench/bench_vlbert.py                 # CPU, and CUDA when available
    python bench/bench_vlbert.py --device cuda --amp bf16
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time

import torch


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


def build(kind: str, args) -> tuple[torch.nn.Module, callable]:
    if kind == "vlbert":
        from vlbert import VLBertConfig, VLBertModel

        config = VLBertConfig(with_pooler=False)
        model = VLBertModel(config).to(args.device)
        inputs = vlbert_step_inputs(config, args.batch_size, args.text_length, args.regions, args.device)
        return model, lambda: model(**inputs).last_hidden_state
    from transformers import BertConfig, BertModel

    config = BertConfig(attn_implementation="sdpa")
    model = BertModel(config, add_pooling_layer=False).to(args.device)
    length = args.text_length + args.regions
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, config.vocab_size, (args.batch_size, length), generator=g).to(args.device)
    mask = torch.ones_like(ids)
    return model, lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def worker(kind: str, args, connection) -> None:
    """Build one model, then run a timed step each time the parent says "step"; finally report memory."""
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, forward = build(kind, args)
    model.train()
    amp = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    cuda = args.device == "cuda"

    def step() -> float:
        start = time.perf_counter()
        with torch.autocast(args.device, dtype=amp, enabled=amp is not None):
            loss = forward().float().pow(2).mean()
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


def run_device(args) -> None:
    """Both models live in their own process (own peak memory) and step in turn, so that any
    background load on the machine falls on both alike."""
    context = multiprocessing.get_context("spawn")
    kinds = ("vlbert", "bert")
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
    total = args.text_length + args.regions
    print(f"\n== {args.device} ({where}), batch {args.batch_size}, amp {args.amp}, {args.iterations} timed steps each")
    rows = (
        ("vlbert", f"VL-BERT-base, {args.text_length} text + {args.regions} RoIs + [END] = {total + 1} elements"),
        ("bert", f"BertModel (BERT-base), {total} tokens"),
    )
    for kind, label in rows:
        print(f"{label:<62} step {median(kind) * 1000:9.1f} ms (min {times[kind][0] * 1000:.1f}), "
              f"{memory} {peaks[kind] / 2**20:8.1f} MiB")
    print(f"ratio VL-BERT / BERT: step time {median('vlbert') / median('bert'):.3f}, "
          f"memory {peaks['vlbert'] / max(peaks['bert'], 1):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("all", "cpu", "cuda"), default="all")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--text-length", type=int, default=64)
    parser.add_argument("--regions", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=None, help="timed steps (default: CPU 3, CUDA 20)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none")
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
