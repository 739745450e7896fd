"""The speed paths of training (docs/training.md, "Training fast") give the plain path's numbers on
the CPU: the step that keeps its losses on the device, with a multi-tensor optimiser, trains the
weights of the step that read its loss every step with a for-loop one; length-aware batches are a
seeded order that resumes exactly after a kill; the optimiser kernels agree; a compiled step is one
graph that trains as the eager one, and `compile: true` is refused in one line where torch cannot
compile."""

import copy
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from extract.store import FeatureStore
from tests.helpers.models import NO_DROPOUT
from tests.helpers.worlds import copy_world, run_config
from train.data.annotations import AnnotationFile
from train.data.regions import RegionBank
from train.engine.batches import Collate, EpochBatches, LengthBuckets
from train.engine.compiled import LENGTH_MULTIPLE
from train.engine.config import RunConfigError, StageConfig
from train.engine.distributed import World
from train.engine.optimization import KERNELS, OPTIMIZERS, parameter_groups
from train.engine.run_folder import RunFolder
from train.engine.speed import CORES_VARIABLE, StageSpeed, available_cores, worker_count
from train.engine.trainer import Trainer
from train.tasks import TASKS
from train.tasks.base import TaskData
from vlbert import VLBertConfig
from vlbert.modeling import VLBertEncoder
from vlbert.tokenization import load_tokenizer

VQA = StageConfig("vqa", "vqa", steps=6, batch_size=2, base_lr=5e-4, num_workers=0)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("speed"))


def trained(world: Path, out: str, stage: StageConfig) -> tuple[list[float], dict[str, torch.Tensor], dict]:
    """The stage trained without dropout: its logged losses, final weights and evaluation."""
    run = run_config(world, out, [stage])
    run.model.update(NO_DROPOUT)
    result = Trainer(run).fit()[0]
    folder = RunFolder(world / out)
    losses = [record["loss"] for record in folder.metrics() if "step" in record]
    return losses, load_file(folder.stage(0, stage.name).final / "model.safetensors"), result


def test_the_optimised_step_trains_the_weights_of_the_plain_one(world):
    """50 steps: losses on the device until every 10th step and AdamW's foreach kernel, against a loss
    read every step and a for-loop AdamW; every step is logged either way."""
    plain_losses, plain, _ = trained(world, "plain", replace(VQA, steps=50, log_every=1, fused_optimizer=False))
    fast_losses, fast, result = trained(world, "fast", replace(VQA, steps=50))
    assert len(fast_losses) == 50 and fast_losses == pytest.approx(plain_losses, rel=1e-5)
    for name in plain:
        assert torch.allclose(fast[name], plain[name], atol=1e-6, rtol=1e-5), name
    # Steady figures: from the end of the first logging interval (step 10) to the last step.
    assert result["steady_steps"] == 40 and result["steady_samples_per_s"] > 0
    assert 0 <= result["steady_data_wait_share"] < 1 and result["steady_tokens_per_s"] > result["steady_samples_per_s"]
    assert RunFolder(world / "fast").speed()["vqa"] == {
        "workers": 0, "optimizer_kernel": "foreach", "prefetch": False, "compile": False, "length_buckets": False,
        "log_every": 10, "features_sent_as": "float16", "skip_unread_pooler": False, "fused_encoder_layers": False}


@pytest.fixture(scope="module")
def plain_vqa(world):
    """20 VQA steps on the plain path, each loss logged: the losses, final weights and evaluation."""
    return trained(world, "pooled", replace(VQA, steps=20, log_every=1))


def test_skipping_the_unread_pooler_trains_the_weights_of_the_stage_that_computes_it(world, plain_vqa):
    """VQA's heads never read the pooled [CLS]: with `skip_unread_pooler` its losses, final weights (the
    pooler's included, as they were) and evaluation are those of the stage that computes it, bit for bit."""
    pooled_losses, pooled, pooled_result = plain_vqa
    skipped_losses, skipped, skipped_result = trained(
        world, "pooler-skipped", replace(VQA, steps=20, log_every=1, skip_unread_pooler=True))
    assert skipped_losses == pooled_losses and skipped.keys() == pooled.keys()
    assert any(name.startswith("vlbert.pooler.") for name in skipped)
    assert all(torch.equal(skipped[name], pooled[name]) for name in pooled)
    assert skipped_result["metric"] == "vqa_accuracy" and skipped_result["value"] == pooled_result["value"]
    assert RunFolder(world / "pooler-skipped").speed()["vqa"]["skip_unread_pooler"] is True


def test_fused_encoder_layers_train_the_weights_of_transformers_layers(world, plain_vqa):
    """`fused_encoder_layers`: 20 steps' losses and final weights within float rounding of the plain stage's,
    under the same names (its model folder is what transformers' layers save), recorded in run.json."""
    plain_losses, plain, plain_result = plain_vqa
    fused_losses, fused, fused_result = trained(
        world, "fused-layers", replace(VQA, steps=20, log_every=1, fused_encoder_layers=True))
    assert fused_losses == pytest.approx(plain_losses, rel=1e-5) and fused.keys() == plain.keys()
    for name in plain:
        assert torch.allclose(fused[name], plain[name], atol=1e-6, rtol=1e-5), name
    assert fused_result["value"] == pytest.approx(plain_result["value"], abs=1e-6)
    assert RunFolder(world / "fused-layers").speed()["vqa"]["fused_encoder_layers"] is True


def test_default_workers_fit_in_the_cores_the_process_is_given(monkeypatch):
    """The cores less one per rank's own process: on the CPU none where a rank has one core, on a GPU
    one at least; the executor's grant (VLBERT_CORES) narrows the affinity, never widens it, and a
    grant that is not a positive number is refused in one line."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.delenv(CORES_VARIABLE, raising=False)
    one, two = World(), World(rank=0, size=2, local_rank=0, local_size=2)
    assert [worker_count(None, one, False), worker_count(None, two, False), worker_count(None, two, True)] == [3, 1, 1]
    monkeypatch.setenv(CORES_VARIABLE, "1")
    assert [worker_count(None, one, False), worker_count(None, one, True), worker_count(2, one, False)] == [0, 1, 2]
    monkeypatch.setenv(CORES_VARIABLE, "16")
    assert available_cores() == 4
    for value in ("0", "two", "-1"):
        monkeypatch.setenv(CORES_VARIABLE, value)
        with pytest.raises(RunConfigError, match=f"^VLBERT_CORES='{value}': expected a positive number of cores$"):
            worker_count(None, one, False)


def test_fused_and_foreach_optimisers_follow_the_for_loop_one():
    """AdamW (with weight decay groups) and SGD, 20 steps of the same gradients: within 1e-6."""
    torch.manual_seed(0)
    template = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    gradients = [[torch.randn_like(p) for p in template.parameters()] for _ in range(20)]
    for name in OPTIMIZERS:
        trained_by = {}
        for kernel in KERNELS:
            model = copy.deepcopy(template)
            optimizer = OPTIMIZERS[name](parameter_groups(model, None, 1e-2), 1e-2, kernel)
            for step in gradients:
                for parameter, gradient in zip(model.parameters(), step):
                    parameter.grad = gradient.clone()
                optimizer.step()
            trained_by[kernel] = torch.cat([p.detach().flatten() for p in model.parameters()])
        for kernel in ("fused", "foreach"):
            assert (trained_by[kernel] - trained_by["for-loop"]).abs().max() <= 1e-6, (name, kernel)
        assert not torch.equal(trained_by["for-loop"], torch.cat([p.flatten() for p in template.parameters()]))


def test_length_buckets_are_a_seeded_order_of_similar_lengths_that_resumes_anywhere():
    lengths = np.random.default_rng(0).integers(10, 141, 1000)
    buckets = LengthBuckets(lengths, 8, seed=5, world=World())
    keys = buckets.keys_from(0, (0, 0))
    batches = [[index for _, _, index in next(keys)] for _ in range(300)]  # 125 a epoch: into the third
    again = buckets.keys_from(0, (0, 0))
    assert batches == [[index for _, _, index in next(again)] for _ in range(300)]
    first_epoch = [index for batch in batches[:125] for index in batch]
    assert len(first_epoch) == len(set(first_epoch)) == 1000  # every sample once (8 × 125 = 1000)
    assert batches[:125] != batches[125:250]  # each epoch its own order
    for start in (1, 37, 124, 125, 200):
        resumed = buckets.keys_from(0, buckets.position(start))
        assert [[index for _, _, index in next(resumed)] for _ in range(300 - start)] == batches[start:], start
    spread = np.mean([np.ptp(lengths[batch]) for batch in batches])
    plain = EpochBatches(1000, 8, 5, World()).keys_from(0, (0, 0))
    random_spread = np.mean([np.ptp(lengths[[index for _, _, index in next(plain)]]) for _ in range(300)])
    assert spread < random_spread / 10
    # Two ranks of 4 share out the single process's batches of 8.
    ranks = [LengthBuckets(lengths, 4, 5, World(rank, 2)).keys_from(0, (0, 0)) for rank in range(2)]
    for batch in batches[:50]:
        assert sorted(index for rank in ranks for _, _, index in next(rank)) == sorted(batch)


def test_the_store_counts_regions_from_record_headers(world):
    store, bank = FeatureStore(world / "cache"), RegionBank(str(world / "cache"), max_regions=5)
    for image_id in store.keys():
        assert store.box_count(image_id) == len(store[image_id]["boxes"])
        assert bank.count(image_id) == len(bank.get(image_id))


KILLED_RUN = """
import os, signal, sys, torch
from pathlib import Path
from dataclasses import replace
sys.path.insert(0, {root!r})
from tests.helpers.models import NO_DROPOUT
from tests.helpers.worlds import run_config
from train.engine.config import StageConfig
from train.engine.trainer import Trainer
torch.set_num_threads({threads})  # as this process: the same rounding
original, calls = torch.optim.AdamW.step, {{"n": 0}}
def step(self, *args, **kwargs):
    calls["n"] += 1
    if calls["n"] == {kill_at}:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, *args, **kwargs)
torch.optim.AdamW.step = step
run = run_config(Path({world!r}), {out!r}, [StageConfig(**{stage!r})])
run.model.update(NO_DROPOUT)
Trainer(run, log=print).fit(resume=True)
"""


def test_length_aware_batches_resume_exactly_after_a_kill(world):
    """Killed (SIGKILL) in step 5, after the checkpoint of step 4, then resumed: the losses and final
    weights of an uninterrupted run, bitwise."""
    stage = replace(VQA, steps=7, checkpoint_every=2, length_buckets=True)
    straight_losses, straight, _ = trained(world, "buckets", stage)
    fields = {k: v for k, v in vars(stage).items() if k != "options"}
    script = KILLED_RUN.format(root=str(ROOT), world=str(world), out="buckets-killed", stage=fields, kill_at=5,
                               threads=torch.get_num_threads())
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    folder = RunFolder(world / "buckets-killed")
    assert [path.name for path in folder.stage(0, "vqa").checkpoints()] == ["checkpoint-2", "checkpoint-4"]
    run = run_config(world, "buckets-killed", [stage])
    run.model.update(NO_DROPOUT)
    Trainer(run).fit(resume=True)
    assert [record["loss"] for record in folder.metrics() if "step" in record] == straight_losses
    resumed = load_file(folder.stage(0, "vqa").final / "model.safetensors")
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)
    assert json.loads(folder.config_file.read_text())["speed"]["vqa"]["length_buckets"] is True


def test_compile_is_refused_in_one_line_where_torch_cannot_compile(world, monkeypatch):
    def unsupported(*args, **kwargs):
        raise RuntimeError("Dynamo is not supported on Python 3.14+\nsee the torch.compile docs")

    monkeypatch.setattr(torch, "compile", unsupported)
    with pytest.raises(RunConfigError) as refused:
        Trainer(run_config(world, "compiled", [VQA, replace(VQA, name="again", compile=True)]))
    assert str(refused.value) == (f"stages[1].compile: torch {torch.__version__} cannot compile on cpu here (Dynamo "
                                  "is not supported on Python 3.14+); set compile: false")
    assert not (world / "compiled").exists()


def test_an_encoder_rounding_its_lengths_gives_its_real_elements_the_same_outputs():
    """`compile` and `length_buckets` pad sequences to a multiple of 16 elements (few shapes): masked
    out of attention and cut off the output."""
    torch.manual_seed(0)
    encoder = VLBertEncoder(VLBertConfig.sized("tiny", **NO_DROPOUT)).train()
    embeddings = torch.randn(3, 37, encoder.bert.config.hidden_size)
    mask = torch.ones(3, 37, dtype=torch.bool)
    mask[1, 20:] = False
    exact, _ = encoder(embeddings, mask)
    encoder.pad_sequences_to(LENGTH_MULTIPLE)
    rounded, _ = encoder(embeddings, mask)
    assert encoder.length_multiple == 16 and rounded.shape == exact.shape
    assert torch.allclose(rounded[mask], exact[mask], atol=1e-6)


def test_a_compiled_stages_batches_pad_text_and_regions_to_a_multiple_of_eight(world):
    """Few input shapes for the compiled graph; the padding is masked and empty (that the losses stay
    the same is the next test's: its compiled stages pad, the eager ones do not)."""
    tokenizer = load_tokenizer(world / "vocab")
    bank = RegionBank(str(world / "cache"))
    data = TaskData(bank, tokenizer, 32, AnnotationFile(world / "world" / "train.jsonl", keep=bank.__contains__))
    dataset = TASKS["vqa"].dataset(data, VQA.options, data.train, 7, True)
    samples = [dataset[i] for i in range(5)]
    exact = Collate(tokenizer.pad_token_id)(samples).inputs
    compiled, eager = (StageSpeed.on(replace(VQA, compile=on), torch.device("cpu"), World(), "float32")
                       for on in (True, False))
    padded = Collate(tokenizer.pad_token_id, length_multiple=compiled.batch_length_multiple)(samples).inputs
    text, regions = exact["text_mask"].shape[1], exact["box_mask"].shape[1]
    assert text % 8 and regions % 8  # both get padding here
    assert padded["text_mask"].shape[1] == text + -text % 8 and padded["box_mask"].shape[1] == regions + -regions % 8
    assert eager.batch_length_multiple == 1
    assert padded["image_files"] == exact["image_files"]
    for name, value in ((k, v) for k, v in exact.items() if torch.is_tensor(v)):
        if value.dim() < 2 or value.shape == padded[name].shape:
            assert torch.equal(padded[name], value), name
            continue
        width = text if value.shape[1] == text else regions
        assert torch.equal(padded[name][:, :width], value), name
        fill = {"input_ids": tokenizer.pad_token_id, "mlm_labels": -100}.get(name, 0)
        assert (padded[name][:, width:] == fill).all(), name


@pytest.mark.parametrize("task, mode", [("vqa", "default"), ("refexp", "reduce-overhead"), ("pretrain", "default"),
                                        ("retrieval", "default")])
def test_a_compiled_step_is_one_graph_and_trains_like_the_eager_one(world, monkeypatch, task, mode):
    """The model's forward and the task's losses traced whole by dynamo (fullgraph: a graph break
    fails), run as traced without generating code (seconds on a CPU; the cuda tests run torch's
    compiler): the eager stage's losses on its unpadded batches, each step's reading the weights of the
    step before (to the float noise that padding's other shapes bring: 1.3e-5 relative with AVX2
    kernels; weights are not compared: where gradients are near zero, as in retrieval's first steps,
    AdamW turns that noise into whole steps), the mode given to torch.compile and recorded."""
    import train.engine.compiled as compiled

    modes, torch_compile = [], torch.compile

    def traced_whole(function, mode="default", **options):
        modes.append(mode)
        return torch_compile(function, backend="eager", fullgraph=True)

    monkeypatch.setattr(compiled.torch, "compile", traced_whole)
    stage = StageConfig(task, task, steps=4, batch_size=2, base_lr=5e-4, num_workers=0, log_every=2)
    eager_losses, _, _ = trained(world, f"eager-{task}", stage)
    compiled_losses, _, _ = trained(world, f"compiled-{task}", replace(stage, compile=True, compile_mode=mode))
    assert modes == ["default", mode]  # the check that torch compiles here, then the stage's step
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4)
    assert RunFolder(world / f"compiled-{task}").speed()[task]["compile"] == mode


def test_a_compile_mode_without_compile_is_refused():
    with pytest.raises(RunConfigError, match=r"^stage 'vqa': compile_mode 'reduce-overhead' does nothing without "
                                             r"compile: true$"):
        replace(VQA, compile_mode="reduce-overhead")
