"""A run resumed by another number of processes (DDP with gloo on the CPU, 1 → 2, and 2 → 1 behind -m slow): the
learning rate follows the new total batch (base_lr × total batch), which the log and run.json say;
the samples continue in the same order; and the evaluation that 2 ranks share equals one process's.
Under torchrun, rank 0 holds the run folder's lock and every rank stops when another process holds it."""

import itertools
import json
import os
import socket
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.resumable_run import STAGE
from tests.helpers.worlds import copy_world, run_config
from tests.train.test_run_lock import hold_lock
from train.engine.batches import EpochBatches
from train.engine.distributed import World
from train.engine.evaluate import EvaluationSetting, evaluate
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from train.tasks import TASKS
from vlbert.modeling import VLBertForImageTextMatching
from vlbert.utils.locks import take_lock
from vlbert.utils.precision import PRECISIONS

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    return copy_world(tiny_world, tmp_path_factory.mktemp("world-size"))


def launch(world: Path, out: str, processes: int, stop: int = 0) -> subprocess.CompletedProcess:
    """tests.helpers.resumable_run in `processes` processes (torchrun with a free port for 2)."""
    module = ["tests.helpers.resumable_run", str(world), out, str(stop)]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                "--module"] if processes > 1 else [sys.executable, "-m"]
    return subprocess.run(launcher + module, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))


def learning_rates(folder: RunFolder) -> dict[int, float]:
    return {record["step"]: record["lr"] for record in folder.metrics() if "step" in record}


@pytest.fixture(scope="module")
def uninterrupted(world) -> dict[int, float]:
    """The learning rate of each step of one process, uninterrupted."""
    run = run_config(world, "one-process", [STAGE])
    Trainer(run).fit()
    return learning_rates(RunFolder(world / "one-process"))


def single_process_evaluation(world: Path, final: Path) -> tuple[dict, dict]:
    trainer = Trainer(run_config(world, "evaluation", [STAGE]))  # its data, tokenizer and split
    dataset = TASKS["retrieval"].dataset(trainer.data, STAGE.options, trainer.eval_annotations, 0, False)
    evaluator = TASKS["retrieval"].evaluator(trainer.data, dataset)
    setting = EvaluationSetting(1, torch.device("cpu"), trainer.tokenizer.pad_token_id, PRECISIONS["fp32"])
    result = evaluate(evaluator, VLBertForImageTextMatching.from_pretrained(final).eval(), None, dataset, setting,
                      lambda batch: None)
    return result, evaluator.item_scores()


def without_rates(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("pairs_per_s", "stage", "task", "visual", "steps", "wall_s",
                                                         "samples_per_s", "data_wait_share", "damaged_skipped",
                                                         "evaluation_only", "zero_shot")}


def test_one_to_two_processes_doubles_the_learning_rate_says_so_and_evaluates_as_one(world, uninterrupted):
    folder = RunFolder(world / "grow")
    assert launch(world, "grow", 1, stop=3).returncode == 3
    stage = folder.stage(0, "retrieval")
    assert json.loads((stage.checkpoint(2) / "training_state.json").read_text())["progress"]["positions"] == [[0, 4]]

    resumed = launch(world, "grow", 2)
    assert resumed.returncode == 0, resumed.stderr
    before, after = uninterrupted[3], 2 * uninterrupted[3]
    assert (f"stage retrieval: the checkpoint of step 2 was written by 1 process(es), this run has 2: the total batch "
            f"goes from 2 to 4 samples and the learning rate with it (base_lr × total batch), {before:.4g} → "
            f"{after:.4g}; the samples continue in the same order") in resumed.stdout.splitlines()
    assert folder.world() == {"size": 2, "ranks": [{"host": socket.gethostname()}] * 2,  # where each rank ran
                              "changes": [{"stage": "retrieval", "step": 2, "from": 1, "to": 2,
                                           "learning_rate_scale": 2.0}]}
    rates = learning_rates(folder)
    assert rates[3] == pytest.approx(2 * uninterrupted[3]) and rates[4] == pytest.approx(2 * uninterrupted[4])

    expected, items = single_process_evaluation(world, stage.final)
    assert without_rates(stage.evaluation()) == without_rates({**expected, "precision": "fp32"})
    assert json.loads(stage.item_scores("val").read_text())["items"] == items


@pytest.mark.slow  # the rule of 1 → 2 the other way; 1 → 2 runs in every suite
def test_two_to_one_process_halves_the_learning_rate_and_says_so(world, uninterrupted):
    folder = RunFolder(world / "shrink")
    assert launch(world, "shrink", 2, stop=3).returncode != 0
    stage = folder.stage(0, "retrieval")
    assert json.loads((stage.checkpoint(2) / "training_state.json").read_text())["world_size"] == 2

    resumed = launch(world, "shrink", 1)
    assert resumed.returncode == 0, resumed.stderr
    assert any("written by 2 process(es), this run has 1: the total batch goes from 4 to 2 samples" in line
               for line in resumed.stdout.splitlines())
    assert folder.world()["changes"] == [{"stage": "retrieval", "step": 2, "from": 2, "to": 1,
                                          "learning_rate_scale": 0.5}]
    rates = learning_rates(folder)
    assert rates[3] == pytest.approx(uninterrupted[3]) and rates[4] == pytest.approx(uninterrupted[4])
    assert rates[1] == pytest.approx(2 * uninterrupted[1])  # trained by 2 before
    assert all(torch.isfinite(t).all() for t in load_file(stage.final / "model.safetensors").values())


def test_every_rank_stops_when_another_process_holds_the_run_folder(world):
    out = world / "busy"
    out.mkdir()
    holder = hold_lock(RunFolder(out).lock_file)
    try:
        refused = launch(world, "busy", 2)
    finally:
        holder.kill()
        holder.wait()
    assert refused.returncode != 0
    assert refused.stderr.count(f"{out}: another process is training this run (pid {holder.pid} on host ") == 2
    assert not RunFolder(out).is_run
    lock = take_lock(RunFolder(out).lock_file)
    assert lock is not None
    lock.close()


# ---- where the samples continue -------------------------------------------------------------


def test_a_step_takes_the_next_samples_of_the_permutation_whatever_the_world_size():
    """Each step takes the next batch_size × world size samples of the epoch's permutation, so a run
    resumed by 2 processes after 3 steps of 1 reads what the one process would have read next, in
    other groups; the epoch's tail that fills no whole batch is dropped."""
    size, batch_size = 11, 2
    one = EpochBatches(size, batch_size, 5, World())
    sequence = [index for keys in itertools.islice(one.keys_from(0, (0, 0)), one.per_epoch) for _, _, index in keys]
    position = one.position(3)
    assert position == (0, 6)
    two = [EpochBatches(size, batch_size, 5, World(rank, 2)) for rank in range(2)]
    step = [next(order.keys_from(0, position)) for order in two]
    assert sorted(index for keys in step for _, _, index in keys) == sorted(sequence[6:10])
    assert two[0].position(1, position) == (1, 0)  # 1 sample left: the next epoch begins
    assert [epoch for keys in itertools.islice(two[0].keys_from(0, position), 2) for epoch in {k[1] for k in keys}] == [0, 1]


# ---- the process's device and its process group ----------------------------------------------


def test_a_single_process_on_a_gpu_makes_it_the_current_device(world, monkeypatch):
    """Without a launcher too: else CUDA puts the context and pinned memory's on cuda:0."""
    import train.engine.trainer as trainer_module

    chosen = []
    monkeypatch.setattr(trainer_module, "check_device", lambda name: torch.device("cuda:1"))
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    Trainer(run_config(world, "on-gpu-1", [STAGE], device="cuda:1"))
    assert chosen == [torch.device("cuda:1")]


@pytest.mark.parametrize("fails", [False, True])
def test_the_process_group_a_run_started_is_destroyed_after_it_even_on_an_error(monkeypatch, fails):
    import torch.distributed as dist

    from train.engine.distributed import process_group

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: calls.append(f"init {backend}"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append("destroy"))
    with pytest.raises(RuntimeError) if fails else nullcontext():
        with process_group(World(0, 2), torch.device("cpu")):
            calls.append("train")
            if fails:
                raise RuntimeError("a rank failed")
    assert calls == ["init gloo", "train", "destroy"]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # started by the caller: left to it
    with process_group(World(0, 2), torch.device("cpu")):
        pass
    assert calls == ["init gloo", "train", "destroy"]
