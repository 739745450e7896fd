"""Training's device logic, tested where no GPU is: each rank's device, optimizer state that follows
the parameters, random states per rank and on a smaller world, precision as a recorded choice,
batches collated in workers, gradient accumulation that resumes in step, and evaluation sharded
over ranks and merged."""

import json
from dataclasses import replace

import pytest
import torch
import yaml
from click.testing import CliRunner

from extract.store.reader import FeatureStore
from extract.store.schema import DamagedRecordError
from pipelines.cli import main
from tests.helpers.worlds import copy_world, interrupt_optimiser_step, run_config
from train.data.annotations import AnnotationFile
from train.data.collate import collate, to_device
from train.data.collate import model_inputs
from train.data.datasets import published_id
from train.data.regions import RegionBank
from train.data.sources.text import TextCorpus
from train.engine.batches import EpochBatches, StageStreams
from train.engine.checkpoint import load_training_state, random_state, save_checkpoint
from train.engine.config import RunConfigError, RunMismatchError, StageConfig, run_differences
from train.engine.distributed import World
from train.engine.evaluate import EvaluationSetting, evaluate, shard
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer, graph_parameters
from train.evaluation.item_scores import ItemGroups, ItemScores
from train.tasks import TASKS
from train.tasks.base import TaskData
from train.tasks.pretrain import TextOnlyCorpus
from vlbert import VLBertConfig
from vlbert.modeling import VLBertForQuestionAnswering
from vlbert.tokenization import load_tokenizer
from vlbert.utils.precision import PRECISIONS, resolved_precision
from vlbert.utils.typed_config import from_mapping

VQA = StageConfig("vqa", "vqa", steps=3, batch_size=2, base_lr=5e-4)


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("devices"))


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in RunFolder(out).metrics_file.read_text().splitlines()]


# ---- which device each rank trains on --------------------------------------------------------


def test_the_ranks_of_a_launcher_are_read_from_its_variables():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert World.from_env(env) == World(rank=5, size=8, local_rank=1, local_size=4) and World.from_env(env).distributed
    assert World.from_env({}) == World() and not World().distributed


def test_an_explicit_gpu_for_several_local_ranks_is_refused_before_anything_runs(world, tmp_path, monkeypatch):
    """Every rank would train on the one GPU (NCCL refuses that, deep in the first collective)."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(world, "one-gpu", [VQA], device="cuda:0").to_dict()))
    result = CliRunner().invoke(main, ["train", str(config)])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "Error: device 'cuda:0' under a launcher with 2 processes on this node (LOCAL_RANK=1): every rank would run "
        "on cuda:0; use device cuda, which gives each rank cuda:LOCAL_RANK (CUDA_VISIBLE_DEVICES chooses the GPUs)"]
    assert not (world / "one-gpu").exists()


# ---- resuming: optimizer state and random states -------------------------------------------


def _stepped(dtype=torch.float32):
    model = torch.nn.Linear(3, 2).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.ones(1, 3, dtype=dtype)).sum().backward()
    optimizer.step()
    model.save_pretrained = lambda path: path.mkdir(parents=True, exist_ok=True)  # only the training state matters here
    return model, optimizer, scheduler


def test_optimizer_state_follows_the_parameters_it_is_loaded_onto(tmp_path):
    """A model moved after its optimizer state was loaded leaves the state behind (CUDA: "expected all
    tensors on the same device"); loaded after the move, the state takes each parameter's place."""
    model, optimizer, scheduler = _stepped()
    save_checkpoint(tmp_path / "saved", model, optimizer, scheduler, 1)
    moved, fresh, fresh_scheduler = _stepped(torch.float64)  # float64 stands in for another device here
    load_training_state(tmp_path / "saved", fresh, fresh_scheduler)
    for parameter in moved.parameters():
        state = fresh.state[parameter]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float64
    moved(torch.ones(1, 3, dtype=torch.float64)).sum().backward()
    fresh.step()  # no dtype or device mismatch


def test_each_ranks_random_state_is_restored_when_the_world_matches_and_not_otherwise(tmp_path):
    model, optimizer, scheduler = _stepped()
    states = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        states.append(random_state(None))
    save_checkpoint(tmp_path / "saved", model, optimizer, scheduler, 1, random_states=states)

    torch.manual_seed(9)
    restored = load_training_state(tmp_path / "saved", optimizer, scheduler, rank=1, world_size=2)
    assert restored.random_state_note is None and torch.equal(torch.get_rng_state(), states[1]["cpu"])

    torch.manual_seed(9)
    untouched = torch.get_rng_state()
    smaller = load_training_state(tmp_path / "saved", optimizer, scheduler, rank=0, world_size=1)
    assert torch.equal(torch.get_rng_state(), untouched) and smaller.step == 1
    assert smaller.random_state_note == (f"{tmp_path / 'saved'} was written by 2 process(es), this run has 1: "
                                         "random states start afresh, so dropout draws differ from an "
                                         "uninterrupted run")


def test_a_checkpoint_from_before_per_rank_random_states_still_resumes(tmp_path):
    model, optimizer, scheduler = _stepped()
    save_checkpoint(tmp_path / "saved", model, optimizer, scheduler, 1)
    state_file = tmp_path / "saved" / "training_state.json"
    tensors_file = tmp_path / "saved" / "training_state.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(tensors_file)
    tensors["rng.cpu"] = tensors.pop("rng.0.cpu")  # the earlier layout: one process, rng.cpu
    save_file(tensors, tensors_file)
    state_file.write_text(json.dumps({k: v for k, v in json.loads(state_file.read_text()).items()
                                      if k not in ("world_size", "scaler")}))
    torch.manual_seed(9)
    assert load_training_state(tmp_path / "saved", optimizer, scheduler).random_state_note is None
    assert torch.equal(torch.get_rng_state(), tensors["rng.cpu"])


# ---- precision: a stage field, checked, recorded, and part of the run's identity ---------------


def test_precision_is_checked_when_the_config_loads():
    with pytest.raises(RunConfigError, match=r"^precision: 'fp8' is not one of fp32, tf32, bf16, fp16, auto$"):
        from_mapping(StageConfig, {"name": "vqa", "task": "vqa", "steps": 1, "precision": "fp8"}, error=RunConfigError)
    assert StageConfig("vqa", "vqa", steps=1).precision == "fp32"


@pytest.mark.parametrize("device, capability, resolved", [("cpu", None, "fp32"), ("cuda", (7, 5), "fp32"),
                                                        ("cuda", (8, 0), "bf16"), ("cuda", (9, 0), "bf16")])
def test_auto_precision_is_bf16_where_the_gpu_computes_it_natively_and_fp32_elsewhere(monkeypatch, device, capability,
                                                                                    resolved):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    assert resolved_precision("auto", torch.device(device)) == resolved
    assert resolved_precision("tf32", torch.device(device)) == "tf32"  # a named precision is as it is


def test_auto_precision_is_recorded_as_resolved_and_a_resume_that_resolves_otherwise_is_refused(world, monkeypatch):
    stage = StageConfig("vqa", "vqa", steps=1, batch_size=2, precision="auto", num_workers=0)
    Trainer(run_config(world, "auto", [stage])).fit()
    folder = RunFolder(world / "auto")
    assert folder.precisions() == {"vqa": "fp32"} and folder.config()["stages"][0]["precision"] == "auto"
    assert "precision" not in folder.config()  # a record beside the config, not a field of it

    folder.write_config(folder.config(), folder.world(), {"vqa": "bf16"})  # as if it had run on an Ampere GPU
    with pytest.raises(RunMismatchError, match=r"stages\[0\].precision: the run folder's stage 'vqa' ran in bf16, "
                                               r"auto is fp32 on cpu"):
        Trainer(run_config(world, "auto", [stage])).fit(resume=True)


def test_the_cpu_kernel_families_that_trained_a_run_are_recorded_and_a_run_from_before_gets_none(world,
                                                                                                  monkeypatch):
    stage = StageConfig("vqa", "vqa", steps=1, batch_size=2, num_workers=0)
    Trainer(run_config(world, "kernels", [stage])).fit()
    folder = RunFolder(world / "kernels")
    native = torch.backends.cpu.get_cpu_capability()
    assert folder.cpu_capabilities() == [native] and "cpu_capabilities" not in folder.config()
    other = "AVX2" if native != "AVX2" else "DEFAULT"
    monkeypatch.setattr("train.engine.run_folder.cpu_capability", lambda: other)  # a resume on another CPU
    for _ in range(2):
        Trainer(run_config(world, "kernels", [stage])).fit(resume=True)
        assert folder.cpu_capabilities() == [native, other]
    folder.write_config(folder.config(), folder.world(), folder.precisions())  # as written before the record
    Trainer(run_config(world, "kernels", [stage])).fit(resume=True)
    assert folder.cpu_capabilities() is None


@pytest.mark.parametrize("precision, message", [
    ("fp16", "precision fp16: float16 autocast runs on CUDA devices only, not on cpu; use fp32 or bf16"),
    ("tf32", "precision tf32: TensorFloat-32 exists on CUDA devices only, not on cpu; use fp32 or bf16"),
])
def test_a_precision_the_device_lacks_is_one_line_before_anything_runs(world, tmp_path, precision, message):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(world, "no-fp16", [replace(VQA, precision=precision)]).to_dict()))
    result = CliRunner().invoke(main, ["train", str(config)])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [f"Error: {message}"]
    assert not (world / "no-fp16").exists()


@pytest.mark.parametrize("device, message", [
    ("cuda", "CUDA is not available on this machine"), ("cuda:7", "CUDA is not available on this machine"),
    ("tpu", "not a device name"),
])
def test_a_device_this_machine_lacks_is_one_line_before_anything_runs(world, tmp_path, device, message):
    if torch.cuda.is_available() and device.startswith("cuda"):
        pytest.skip("this machine has CUDA")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(world, "no-device", [VQA], device=device).to_dict()))
    result = CliRunner().invoke(main, ["train", str(config)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    assert not (world / "no-device").exists()


def test_precision_is_recorded_in_run_and_eval_json_and_a_resume_in_another_is_refused(world):
    run = run_config(world, "precision", [VQA])
    Trainer(run).fit()
    out = world / "precision"
    assert json.loads(RunFolder(out).config_file.read_text())["stages"][0]["precision"] == "fp32"
    assert json.loads(RunFolder(out).stage(0, "vqa").evaluation_file.read_text())["precision"] == "fp32"
    assert run_differences(RunFolder(out).config(), replace(run, stages=[replace(VQA, precision="bf16")])) \
        == ['stages[0].precision: the run folder has "fp32", this config has "bf16"']


def test_the_device_type_is_part_of_a_runs_identity_and_its_index_is_not(world):
    run = run_config(world, "identity", [VQA], device="cuda:1")
    recorded = {**run.to_dict(), "device": "cuda:0"}
    assert run_differences(recorded, run) == []
    assert run_differences(recorded, replace(run, device="cpu")) == [
        'device: the run folder has "cuda:0", this config has "cpu"']


def test_a_run_folder_from_before_precision_counts_as_the_arithmetic_it_ran_in(world):
    """Before the field, stages ran bf16 autocast on CUDA and fp32 elsewhere."""
    run = run_config(world, "older", [VQA])
    older = run.to_dict()
    del older["stages"][0]["precision"]
    assert run_differences(older, run) == []
    on_gpu = {**older, "device": "cuda"}
    assert run_differences(on_gpu, replace(run, device="cuda")) == [
        'stages[0].precision: the run folder has "bf16", this config has "fp32"']


def test_a_run_folder_from_before_fused_encoder_layers_ran_transformers_layers(world):
    """A stage recorded before the field ran transformers' layers: resumed so, no mismatch; fused, refused."""
    run = run_config(world, "older", [VQA])
    older = run.to_dict()
    del older["stages"][0]["fused_encoder_layers"]
    assert run_differences(older, run) == []
    assert run_differences(older, replace(run, stages=[replace(VQA, fused_encoder_layers=True)])) == [
        "stages[0].fused_encoder_layers: the run folder has false, this config has true"]


def test_a_run_folder_from_before_stage_options_compares_its_flat_settings_as_options(world):
    """Before `options:`, every stage recorded every task's settings flat; a stage's own are its
    options now, the other tasks' are dropped."""
    pretrain = StageConfig("pretrain", "pretrain", steps=1, options={"masked_roi": False})
    choice = StageConfig("choice", "choice", steps=1, options={"num_choices": 3})
    run = run_config(world, "flat", [pretrain, choice, VQA])
    flat = {"masked_lm": True, "masked_roi": True, "roi_masking": "pixel", "relationship": False, "text_only": True,
            "num_choices": 4}
    older = run.to_dict()
    for stage in older["stages"]:
        stage.update({**flat, **stage.pop("options")})
    assert older["stages"][0]["masked_roi"] is False and older["stages"][1]["num_choices"] == 3
    assert run_differences(older, run) == []
    with_every_loss = replace(run.stages[0], options=replace(run.stages[0].options, masked_roi=True))
    assert run_differences(older, replace(run, stages=[with_every_loss, *run.stages[1:]])) == [
        "stages[0].options.masked_roi: the run folder has false, this config has true"]

# ---- batches: collated in workers, the same as in one process ----------------------------------


def _training_streams(world):
    tokenizer = load_tokenizer(world / "vocab")
    bank = RegionBank(str(world / "cache"))
    data = TaskData(bank, tokenizer, 48, AnnotationFile(world / "world" / "train.jsonl", keep=bank.__contains__))
    pretrain = StageConfig("pretrain", "pretrain", steps=1, batch_size=3)
    dataset = TASKS["pretrain"].dataset(data, pretrain.options, data.train, 7, True)
    text = TextOnlyCorpus(TextCorpus(str(world / "world" / "corpus.txt")), tokenizer, 48, 8)
    return [(dataset, EpochBatches(len(dataset), 3, 7, World())), (text, EpochBatches(len(text), 3, 8, World()))], \
        tokenizer


def test_batches_collated_by_workers_equal_those_made_in_one_process(world):
    streams, tokenizer = _training_streams(world)
    in_process = StageStreams.at(streams, 5).collated(0, tokenizer.pad_token_id, pin_memory=False)
    by_workers = StageStreams.at(streams, 5).collated(2, tokenizer.pad_token_id, pin_memory=False)
    for _ in range(6):  # across an epoch's end
        one, other = next(in_process), next(by_workers)
        assert one.usable == other.usable == 6 and one.with_images == 3 and not one.damaged
        assert one.inputs.keys() == other.inputs.keys()
        for name, value in one.inputs.items():
            assert torch.equal(value, other.inputs[name]) if torch.is_tensor(value) else value == other.inputs[name]
        assert one.inputs["appearance"].dtype == torch.float16  # widened only on the device
        assert to_device(one.inputs, torch.device("cpu"))["appearance"].dtype == torch.float32


def test_stage_batches_start_where_a_resumed_stage_left_off(world):
    """Batch b of a stage is the same whether the stage starts at 0 or resumes at b."""
    streams, tokenizer = _training_streams(world)
    from_start = StageStreams.at(streams, 0).batches(0, tokenizer.pad_token_id, torch.device("cpu"), prefetch=True)
    batches = [next(from_start) for _ in range(5)]
    resumed = next(StageStreams.at(streams, 4).batches(0, tokenizer.pad_token_id, torch.device("cpu"), prefetch=True))
    assert torch.equal(resumed.inputs["input_ids"], batches[4].inputs["input_ids"])


def test_a_resumed_stage_with_gradient_accumulation_continues_the_same_batches(world, monkeypatch):
    stage = replace(VQA, steps=4, grad_accumulation=2, checkpoint_every=2, num_workers=0)
    Trainer(run_config(world, "accumulated", [stage])).fit()
    interrupt_optimiser_step(monkeypatch, call=3)
    with pytest.raises(KeyboardInterrupt):
        Trainer(run_config(world, "accumulated-resumed", [stage])).fit()
    monkeypatch.undo()
    Trainer(run_config(world, "accumulated-resumed", [stage])).fit(resume=True)
    losses = [[r["loss"] for r in metrics(world / out) if "step" in r] for out in ("accumulated", "accumulated-resumed")]
    assert len(losses[0]) == 4 and losses[0] == losses[1]


def test_damaged_records_are_counted_the_same_when_workers_collate(world, monkeypatch):
    damaged = AnnotationFile(world / "world" / "train.jsonl")[0].image_id
    original = FeatureStore.decoded

    def read(self, image_id, *args, **kwargs):  # every read of a record, whole or some fields
        if image_id == damaged:
            raise DamagedRecordError(f"{self.root}: record {image_id!r}: checksum mismatch", image_id)
        return original(self, image_id, *args, **kwargs)

    monkeypatch.setattr(FeatureStore, "decoded", read)  # forked workers inherit it
    results = [Trainer(run_config(world, f"damaged-{workers}", [replace(VQA, steps=8, batch_size=4, num_workers=workers)],
                                  damaged_records="skip")).fit()[0] for workers in (0, 2)]
    assert results[0]["damaged_skipped"] == results[1]["damaged_skipped"] > 0
    skipped = [[r.get("damaged_skipped", 0) for r in metrics(world / f"damaged-{w}") if "step" in r] for w in (0, 2)]
    assert skipped[0] == skipped[1]


# ---- evaluation in slices, merged ----------------------------------------------------------------


@pytest.mark.parametrize("task", ["vqa", "choice", "refexp", "retrieval", "pretrain"])
def test_evaluation_in_rank_slices_merges_into_the_single_process_result(world, tmp_path, task):
    tokenizer = load_tokenizer(world / "vocab")
    bank = RegionBank(str(world / "cache"))
    keep = bank.__contains__
    data = TaskData(bank, tokenizer, 48, AnnotationFile(world / "world" / "train.jsonl", keep=keep))
    stage = StageConfig(task, task, steps=1, options={"num_choices": 3} if task == "choice" else {})
    dataset = TASKS[task].dataset(data, stage.options, AnnotationFile(world / "world" / "val.jsonl", keep=keep), 0, False)
    config = VLBertConfig(**run_config(world, "x", [stage]).model, vocab_size=len(tokenizer),
                          visual_feature_size=bank.feature_dim, num_detector_classes=bank.num_classes,
                          **TASKS[task].model_overrides(data, stage.options),
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = TASKS[task].model(config).eval()
    precision = PRECISIONS["fp32"]

    def evaluated(part, out):
        # One item a batch: an item's numbers then do not depend on which slice batches it with
        # whom (padding to another length rounds differently, which flips near-ties).
        evaluator = TASKS[task].evaluator(data, dataset)
        setting = EvaluationSetting(1, torch.device("cpu"), tokenizer.pad_token_id, precision)
        result = evaluate(evaluator, model, None, part, setting, lambda batch: None,
                          predictions=out / "predictions", items=out / "items.json")
        return evaluator, result

    whole, expected = evaluated(dataset, tmp_path / "whole")
    slices = [evaluated(shard(dataset, World(rank, 3)), tmp_path / f"slice-{rank}")[0] for rank in range(3)]
    assert sum(len(shard(dataset, World(rank, 3))) for rank in range(3)) == len(dataset)
    merged = TASKS[task].evaluator(data, dataset)
    merged.merge([evaluator.state() for evaluator in slices])
    result = {**merged.result(), "precision": "fp32"}
    for volatile in ("pairs_per_s",):
        expected.pop(volatile, None), result.pop(volatile, None)
    assert result == expected
    assert merged.item_scores() == whole.item_scores() and merged.item_groups() == whole.item_groups()
    if whole.item_scores():  # pre-training scores no items and writes no file
        written = ItemScores.read(tmp_path / "whole" / "items.json")
        assert written == ItemScores(expected["metric"], whole.item_scores(), whole.item_groups())
    if task == "vqa":  # the demo world's questions each have an answer type: every scored item its group
        types = {str(published_id(q.question_id, i)): q.answer_type for i in range(len(dataset))
                 for _, q in [dataset.item(i)]}
        assert written.groups == ItemGroups("answer type", {item: types[item] for item in written.items})
    merged.write(tmp_path / "merged-predictions")
    if (tmp_path / "whole" / "predictions").exists():
        assert (tmp_path / "merged-predictions").read_bytes() == (tmp_path / "whole" / "predictions").read_bytes()


# ---- DDP's unused-parameter search ------------------------------------------------------------


def test_the_graph_names_exactly_the_parameters_a_loss_reaches(world):
    """What decides whether DDP must search for unused parameters every step: VQA leaves the
    pooler and the masked-RoI embedding without a gradient, and the graph walk finds exactly the
    parameters autograd reaches."""
    tokenizer = load_tokenizer(world / "vocab")
    bank = RegionBank(str(world / "cache"))
    data = TaskData(bank, tokenizer, 48, AnnotationFile(world / "world" / "train.jsonl", keep=bank.__contains__))
    dataset = TASKS["vqa"].dataset(data, VQA.options, data.train, 0, True)
    config = VLBertConfig(**run_config(world, "x", [VQA]).model, vocab_size=len(tokenizer),
                          visual_feature_size=bank.feature_dim, num_answers=len(dataset.answers))
    model = VLBertForQuestionAnswering(config)
    inputs = to_device(collate([dataset[0], dataset[1]], tokenizer.pad_token_id), torch.device("cpu"))
    loss = model(**model_inputs(model, inputs)).loss
    reached = graph_parameters(loss)
    loss.backward()
    without_gradient = {name for name, p in model.named_parameters() if p.grad is None}
    assert {name for name, p in model.named_parameters() if id(p) not in reached} == without_gradient
    assert without_gradient == {"vlbert.pooler.dense.weight", "vlbert.pooler.dense.bias",
                                "vlbert.embeddings.masked_appearance"}
