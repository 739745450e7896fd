"""Runs the stages of a training run from the FeatureStore: data, optimisation, checkpoints, evaluation.

The run folder `run.out` (its layout: `train.engine.run_folder`) holds this run or none, and one
process trains in it at a time (it holds the folder's lock).
Before anything trains, the config's paths, the device, every stage's precision on it, and the
store's arrays for every stage are checked. Resuming finds the first unfinished stage and its
latest checkpoint (or starts it again at step 0, and says which); data order and dropout continue
exactly, so a resumed run logs the same losses as an uninterrupted one, each step once.

Under torchrun each rank trains on cuda:LOCAL_RANK (`train.engine.distributed`), evaluates a slice
of each split, and saves its random state into rank 0's checkpoints.
"""

from __future__ import annotations

import os
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from train.data.annotations import AnnotationFile, MixedAnnotations
from train.data.files import read_json
from train.data.regions import RegionBank
from train.end2end import EndToEndVisual, with_appearance
from train.engine.batches import Batch, EpochBatches, LengthBuckets, StageStreams
from train.engine.checkpoint import CheckpointSchedule, load_training_state, prune_checkpoints, random_state, save_checkpoint
from train.engine.compiled import compile_problem
from train.engine.config import RunConfig, RunConfigError, StageConfig
from train.engine.distributed import NO_BUFFER_BROADCASTS, World, any_rank, barrier, gathered, process_group
from train.engine.evaluate import EvaluationSetting, evaluate
from train.engine.model_building import stage_model
from train.engine.optimization import OPTIMIZERS, learning_rate_factor, parameter_groups
from train.engine.run_folder import RunFolder, StageFolder
from train.engine.speed import StageSpeed
from train.engine.stage_log import MutedStageLog, StageLog
from train.engine.stage_progress import StageProgress
from train.engine.step_losses import PendingLosses, StepLosses
from train.engine.stopping import StopSignals
from train.engine.tracking import check_installed
from train.tasks import TASKS
from train.tasks.base import TaskData
from vlbert.model_folder import architecture_of
from vlbert.modeling import CONFIG_NAME, DETECTOR_WEIGHTS, WEIGHTS_NAME
from vlbert.tokenization import check_vocabulary_size, load_tokenizer
from vlbert.utils.atomic import folder_written_whole
from vlbert.utils.device import check_device, rank_device, use_device
from vlbert.utils.errors import FAILED, UserError
from vlbert.utils.precision import TRAINING_PRECISIONS, Precision, precision, resolved_precision
from vlbert.utils.progress import progress_bar


class NonFiniteLossError(UserError):
    """A stage's loss became NaN or infinite: the stage stopped, saving nothing after it."""

    exit_status = FAILED


@dataclass
class StageParts:
    """What a stage trains and how: the model, the end-to-end visual side (or None), the optimiser."""

    model: nn.Module
    visual: EndToEndVisual | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    parameters: list[nn.Parameter]  # the trained ones, for gradient clipping
    precision: Precision
    scaler: torch.amp.GradScaler  # fp16's loss scaling; disabled (a no-op) in the other precisions


@dataclass
class StageRun:
    """What the steps, checkpoints and evaluation of one stage share."""

    stage: StageConfig
    folder: StageFolder
    parts: StageParts
    progress: StageProgress
    log: StageLog | MutedStageLog
    streams: StageStreams | None = None  # None for an evaluation-only stage


class Trainer:
    def __init__(self, run: RunConfig, log: Callable[[str], None] = print) -> None:
        """Checks what would otherwise fail later: the config's paths (RunConfigError), the device
        (DeviceError), each stage's precision on it (PrecisionError), the store (StoreError when it
        is none) and that it can feed every stage."""
        self.run = run
        self.world = World.from_env()
        self.log = log if self.world.rank == 0 else _silent
        run.check_paths()
        # This rank's GPU under a launcher (cuda:LOCAL_RANK), then checked: one line for a typo or a
        # GPU this machine lacks.
        self.device = use_device(check_device(rank_device(run.device, os.environ)))
        # Each stage's arithmetic on this device (`auto` resolved), checked.
        self.precisions = {stage.name: precision(resolved_precision(stage.precision, self.device), TRAINING_PRECISIONS)
                           for stage in run.stages}
        for chosen in self.precisions.values():
            chosen.check(self.device)
        self._check_compile()
        check_installed(run.tracking)
        self.folder = RunFolder(run.out_dir)
        # Encoded features (q8) as their parts: the stages decode them on the device or in their workers.
        self.regions = RegionBank(run.store, run.max_regions, encoded=True)
        self._check_store_feeds_every_stage()
        feature_dtype = self.regions.store.meta["features"]["dtype"]
        self.speed = {stage.name: StageSpeed.on(stage, self.device, self.world, feature_dtype) for stage in run.stages}
        self.tokenizer = load_tokenizer(run.vocabulary)
        self._check_tokenizer_fits_model()
        train_annotations, self.mixture = self._train_annotations()
        self.data = TaskData(self.regions, self.tokenizer, run.max_length, train_annotations)
        for stage in run.stages:
            TASKS[stage.task].read_inputs(self.data, stage.options)
        self.eval_annotations = self._annotations(run.eval_annotations, required=True)
        self.predict_annotations = [self._annotations(path, required=True) for path in run.predict]

    def _check_compile(self) -> None:
        """`compile: true` where torch cannot compile on this device: RunConfigError, in one line."""
        compiled = [index for index, stage in enumerate(self.run.stages) if stage.compile]
        problem = compile_problem(self.device) if compiled else None
        if problem is not None:
            raise RunConfigError(f"stages[{compiled[0]}].compile: {problem}; set compile: false")

    def _check_store_feeds_every_stage(self) -> None:
        meta = self.regions.store.meta  # opening the store: StoreError when `store` is no FeatureStore
        self.regions.store.check_agreement()  # StoreError for records that disagree with meta.json
        for stage in self.run.stages:
            problem = self._store_problem(stage, meta)
            if problem is not None:
                raise RunConfigError(f"stage {stage.name!r}: {problem}")

    def _store_problem(self, stage: StageConfig, meta: dict) -> str | None:
        """Why the store cannot feed `stage`, or None."""
        problems = [TASKS[stage.task].store_problem(self.regions, stage.options)]
        if stage.visual == "end2end":
            problems.append(EndToEndVisual.store_problem(meta, self.run.images))
        return next((problem for problem in problems if problem), None)

    def _check_tokenizer_fits_model(self) -> None:
        """A checkpoint to start from fixes the vocabulary size; the tokenizer must have that many
        word pieces (from random weights, the model takes the tokenizer's)."""
        config = self.run.start_config()
        if config is not None and isinstance(config.get("vocab_size"), int):
            check_vocabulary_size(self.tokenizer, config["vocab_size"], self.run.vocabulary)

    def _train_annotations(self) -> tuple[AnnotationFile | MixedAnnotations, list[dict[str, Any]] | None]:
        """The training annotations: one file, or several mixed by their numbers of items; and their
        `mixture` (None for one file), logged here and recorded in run.json."""
        if isinstance(self.run.train_annotations, str):
            return self._annotations(self.run.train_annotations), None
        mixed = MixedAnnotations([self._annotations(path) for path in self.run.train_annotations])
        mixture = mixed.mixture()
        for part in mixture:
            self.log(f"training mixture: {part['file']}: {part['images']} images, "
                     + ", ".join(f"{n} {kind} ({part['share'][kind]:.1%})" for kind, n in part["items"].items()))
        return mixed, mixture

    def _annotations(self, path: str, required: bool = False) -> AnnotationFile:
        """The annotations of `path` whose images the store holds (says how many it lacks);
        `required`: RunConfigError when that is none, before anything trains."""
        annotations = AnnotationFile(path, keep=self.regions.__contains__)
        if required and not len(annotations):
            held = f"none of its {annotations.dropped} images is in the store {self.run.store}" \
                if annotations.dropped else "it holds no annotation"
            raise RunConfigError(f"{path}: {held}: nothing to evaluate on")
        if annotations.dropped:
            self.log(f"{path}: {annotations.dropped} of {annotations.dropped + len(annotations)} images are not in "
                     f"the store {self.run.store}; their items are left out")
        return annotations

    def fit(self, resume: bool = False, restart: bool = False) -> list[dict]:
        """Runs (or, with `resume`, continues) every stage not done yet; returns each stage's evaluation.

        `out` must hold this run or none: a recorded config that differs beyond RESULT_NEUTRAL_FIELDS is
        refused (RunMismatchError) unless `restart`, which removes the previous run's outputs first.
        One process at a time trains in `out`: another is refused (RunFolderBusyError). SIGTERM or
        SIGUSR2 stops training after the optimiser step in progress, with a checkpoint of it
        (TrainingInterrupted; train.engine.stopping)."""
        with process_group(self.world, self.device), self.folder.locked(self.world), StopSignals() as self.stop:
            return self._fit(resume, restart)

    def _fit(self, resume: bool, restart: bool) -> list[dict]:
        self.folder.claim(self.run, self.world, restart, self.log,
                          precisions={name: chosen.name for name, chosen in self.precisions.items()},
                          device=self.device, mixture=self.mixture,
                          speed={name: speed.record() for name, speed in self.speed.items()})
        results = []
        previous: Path | None = Path(self.run.init_from) if self.run.init_from else None
        for index, stage in enumerate(self.run.stages):
            stage_dir = self.folder.stage(index, stage.name)
            if stage_dir.done:
                self.log(f"stage {stage.name}: done ({stage_dir.final}), nothing to train")
            else:
                if not resume and stage_dir.latest_checkpoint() is not None:
                    raise FileExistsError(f"{stage_dir.path} holds checkpoints of an earlier run: pass resume=True "
                                          "(--resume) to continue it, restart=True (--restart) to start over, "
                                          "or use another output folder")
                if index == 0:
                    self.log(f"model: {self._model_origin()}")
                self._train_stage(stage, stage_dir, previous)
            results.append(stage_dir.evaluation())
            previous = stage_dir.final
        return results

    def _model_origin(self) -> str:
        if self.run.init_from:
            return f"{self.run.init_from} (its sizes and weights)"
        if self.run.bert:
            return f"BERT {self.run.bert} for the text side; the visual side from random weights"
        size = self.run.model.get("size", "base")
        fields = sorted(k for k in self.run.model if k != "size")
        if self.run.model:
            return f"VL-BERT-{size}" + (f" with {', '.join(fields)} of `model:`" if fields else "") + ", every weight random"
        return ("VL-BERT-base (no `model:` given), every weight random; `model:` picks a size (base, large, tiny) "
                "or fields, `bert:` or `init_from:` starts from a checkpoint")

    def _train_stage(self, stage: StageConfig, stage_dir: StageFolder, previous: Path | None) -> None:
        torch.manual_seed(self.run.seed)
        parts = self._parts(stage, previous)
        if stage.steps == 0:
            self._evaluate_only(stage, stage_dir, parts, previous)
            return
        step, saved, saved_world = self._start(stage, stage_dir, parts)
        progress = StageProgress.from_saved(saved, skip_damaged=self.run.damaged_records == "skip")
        streams = self._streams(stage, step, parts.visual, saved.get("positions"), saved_world)
        speed = self.speed[stage.name]
        batches = PeekedBatches(streams.batches(speed.workers, self.tokenizer.pad_token_id, self.device, stage.prefetch,
                                                stage.decode_on_device, speed.batch_length_multiple))
        # Closed when the stage stops or fails too: the traceback would keep its DataLoader's workers running.
        with closing(batches):
            objective = self._objective(stage, parts, batches)
            with self._stage_log(stage, stage_dir, step) as log:
                run = StageRun(stage, stage_dir, parts, progress, log, streams)
                with self.stop.deferred(f"{self.folder.root}: stage {stage.name}"):
                    self._optimise(run, objective, batches, step)
                    seconds = progress.seconds
                    batches.close()  # its DataLoader workers stop before evaluation starts its own
                    self._save(run, stage.steps)
                if any_rank(self.stop.requested, self.world, self.device):  # it came after the last step
                    raise self.stop.interrupted(f"{self.folder.root}: stage {stage.name}, its last step written")
                self._finish(run, seconds)
        barrier(self.world)

    def _parts(self, stage: StageConfig, previous: Path | None) -> StageParts:
        """The stage's model (changed by its speed paths) and end-to-end detector on the device, and its optimiser."""
        model = stage_model(self.run, stage, self.data, previous).to(self.device).train()
        self.speed[stage.name].shape(model)
        model.tokenizer_source = Path(self.run.vocabulary)  # its folders carry the tokenizer (vlbert.model_folder)
        visual = self._visual(stage, previous)
        if visual is not None:
            visual.to(self.device).train()
        parameters = [p for m in (model, visual) if m is not None for p in m.parameters() if p.requires_grad]
        total_batch = stage.batch_size * self.world.size * stage.grad_accumulation
        optimizer = OPTIMIZERS[stage.optimizer](parameter_groups(model, visual, stage.weight_decay),
                                                stage.base_lr * total_batch, self.speed[stage.name].optimizer_kernel)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor(stage))
        stage_precision = self.precisions[stage.name]
        scaler = torch.amp.GradScaler(self.device.type, enabled=stage_precision.loss_scaling)
        return StageParts(model, visual, optimizer, scheduler, parameters, stage_precision, scaler)

    def _visual(self, stage: StageConfig, previous: Path | None) -> EndToEndVisual | None:
        if stage.visual != "end2end":
            return None
        visual = EndToEndVisual.from_store_meta(self.regions.store.meta, self.run.images, self.run.detector_weights)
        if previous is not None and (previous / DETECTOR_WEIGHTS).is_file():
            # A stage's own, or a converted official checkpoint's under its names (the key map reads them).
            visual.detector.load_checkpoint(previous / DETECTOR_WEIGHTS, trunk_only=True)
        return visual

    def _evaluate_only(self, stage: StageConfig, stage_dir: StageFolder, parts: StageParts, previous: Path) -> None:
        """`steps: 0`: the stage's evaluation of the model as it starts, with no optimiser step and no
        checkpoint; its final model is that model, so later stages start from it as from any stage's.
        Zero-shot when that model is another task's (a pre-trained one): never trained on this task."""
        self.log(f"stage {stage.name}: steps: 0, evaluating the model it starts from without training it")
        progress = StageProgress.from_saved({}, skip_damaged=self.run.damaged_records == "skip")
        architecture = architecture_of(read_json(previous / CONFIG_NAME))
        with self._stage_log(stage, stage_dir, 0) as log:
            self._finish(StageRun(stage, stage_dir, parts, progress, log), 0.0,
                         zero_shot=architecture != TASKS[stage.task].model.__name__)
        barrier(self.world)

    def _stage_log(self, stage: StageConfig, stage_dir: StageFolder, start: int) -> StageLog | MutedStageLog:
        if self.world.rank != 0:
            return MutedStageLog()
        return StageLog(self.folder, stage_dir, stage.name, start, self.run.tracking, self.run.to_dict())

    def _finish(self, run: StageRun, seconds: float, zero_shot: bool = False) -> None:
        """Evaluates the stage on every rank (writing its predictions); rank 0 logs the result and
        writes the final model. `zero_shot`: the stage evaluated another task's model without training."""
        stage, progress = run.stage, run.progress
        run.parts.model.eval()
        scores = self._evaluate(run, self.eval_annotations)
        for predicted in self.predict_annotations:
            self._evaluate(run, predicted)
        if self.world.rank != 0:
            return
        # data_wait_share: the share of training time spent waiting for batches (rank 0's): near 0
        # when the workers keep up with the device. The steady_ figures leave the stage's start-up and
        # first logging interval out (train.engine.stage_progress).
        # evaluation_only: the stage trained nothing (`steps: 0`); zero_shot: nor had its model been
        # trained on this task (it started from another task's, e.g. pre-training's)
        result = {"stage": stage.name, "task": stage.task, "visual": stage.visual, "steps": stage.steps,
                  "evaluation_only": stage.steps == 0, "zero_shot": zero_shot, "wall_s": round(seconds, 2),
                  "samples_per_s": round(progress.samples * self.world.size / seconds, 2) if seconds else 0.0,
                  "data_wait_share": round(progress.data_wait / seconds, 4) if seconds else 0.0,
                  **progress.steady(self.world.size), **scores, "damaged_skipped": progress.damaged.skipped}
        # Logged before the final model marks the stage done: a crash in between evaluates again.
        run.log.evaluation(result, stage.steps)
        self._save_final(run.folder, run.parts, result)
        self.log(f"stage {stage.name}: " + ", ".join(f"{k} {v}" for k, v in result.items()))
        if progress.damaged.skipped:
            self.log(f"stage {stage.name}: {progress.damaged.summary()}")

    def _evaluate(self, run: StageRun, annotations: AnnotationFile) -> dict | None:
        """The split's evaluation on rank 0, None on the other ranks."""
        task = TASKS[run.stage.task]
        dataset = task.dataset(self.data, run.stage.options, annotations, self.run.seed, False)
        split = annotations.path.stem
        predictions = None
        if task.prediction_suffix is not None:
            predictions = run.folder.predictions(split, task.prediction_suffix)
        setting = EvaluationSetting(self.run.eval_batch_size, self.device, self.tokenizer.pad_token_id,
                                    run.parts.precision, self.speed[run.stage.name].workers, self.world)
        return evaluate(task.evaluator(self.data, dataset), run.parts.model, run.parts.visual, dataset, setting,
                        lambda batch: run.progress.damaged.check(batch.damaged, batch.with_images),
                        predictions=predictions, items=run.folder.item_scores(split),
                        desc=f"{run.stage.name} on {split}")

    def _save_final(self, stage_dir: StageFolder, parts: StageParts, result: dict) -> None:
        with folder_written_whole(stage_dir.final, stage_dir.final_staging) as tmp:
            parts.model.save_pretrained(tmp)
            if parts.visual is not None:
                save_file(_detector_state(parts.visual), tmp / DETECTOR_WEIGHTS)
            stage_dir.write_evaluation(result)

    def _start(self, stage: StageConfig, stage_dir: StageFolder, parts: StageParts) -> tuple[int, dict, int]:
        """Loads the stage's latest checkpoint, if any: (the step to start from, the saved progress,
        the number of processes that saved it). The model is on its device already, so the optimizer
        state loads onto it too."""
        checkpoint = stage_dir.latest_checkpoint()
        if checkpoint is None:
            attempted = self.folder.tensorboard(stage_dir).exists()  # an interrupted attempt logged there
            self.log(f"stage {stage.name}: " + ("no checkpoint, starting again at step 0" if attempted
                                               else "starting at step 0"))
            return 0, {}, self.world.size
        parts.model.load_state_dict(load_file(checkpoint / WEIGHTS_NAME))
        if parts.visual is not None:
            parts.visual.detector.load_state_dict(load_file(checkpoint / DETECTOR_WEIGHTS))
        learning_rates = list(parts.scheduler.base_lrs)  # this world's: base_lr × its total batch
        state = load_training_state(checkpoint, parts.optimizer, parts.scheduler, self.world.rank, self.world.size,
                                    self.device)
        if state.scaler is not None and parts.scaler.is_enabled():
            parts.scaler.load_state_dict(state.scaler)
        self.log(f"stage {stage.name}: resuming from {checkpoint} (step {state.step})")
        if state.world_size != self.world.size:
            self._rescale_learning_rate(stage, parts, learning_rates, state.step, state.world_size)
        if state.random_state_note is not None:
            self.log(f"stage {stage.name}: {state.random_state_note}")
        return state.step, state.progress, state.world_size

    def _rescale_learning_rate(self, stage: StageConfig, parts: StageParts, learning_rates: list[float], step: int,
                               saved_world: int) -> None:
        """A checkpoint of another number of processes: its optimizer and scheduler hold the learning
        rate of its total batch; the stage goes on with this world's (base_lr × total batch, as it
        would have started with), which the log and run.json say."""
        before = parts.scheduler.get_last_lr()[0]
        for group, learning_rate in zip(parts.optimizer.param_groups, learning_rates):
            group["initial_lr"] = learning_rate
        # A scheduler resumed at the checkpoint's step from the base rates set above.
        parts.scheduler = torch.optim.lr_scheduler.LambdaLR(parts.optimizer, learning_rate_factor(stage),
                                                            last_epoch=parts.scheduler.last_epoch - 1)
        per_process = stage.batch_size * stage.grad_accumulation
        scale = self.world.size / saved_world
        self.log(f"stage {stage.name}: the checkpoint of step {step} was written by {saved_world} process(es), this run "
                 f"has {self.world.size}: the total batch goes from {per_process * saved_world} to "
                 f"{per_process * self.world.size} samples and the learning rate with it (base_lr × total batch), "
                 f"{before:.4g} → {parts.scheduler.get_last_lr()[0]:.4g}; the samples continue in the same order")
        if self.world.rank == 0:
            world = self.folder.world()
            world["changes"].append({"stage": stage.name, "step": step, "from": saved_world, "to": self.world.size,
                                     "learning_rate_scale": scale})
            self.folder.write_world(world)

    def _streams(self, stage: StageConfig, step: int, visual: EndToEndVisual | None, positions: list | None,
                 saved_world: int) -> StageStreams:
        """The stage's streams from optimiser step `step` on: the task's samples, and as many of each
        of its extra streams (text-only ones), made and collated by `num_workers` processes. They
        start at the checkpoint's `positions`; a checkpoint from before positions were saved gives
        them by its step and its number of processes."""
        seed = self.run.seed * 1000 + self.run.stages.index(stage)
        task = TASKS[stage.task]
        main = task.dataset(self.data, stage.options, self.data.train, seed, True)
        # Length-aware batches for the task's samples; the extra streams are text only, short alike.
        orders = [LengthBuckets(main.sample_lengths(), stage.batch_size, seed, self.world) if stage.length_buckets
                  else EpochBatches(len(main), stage.batch_size, seed, self.world)]
        if visual is not None:
            main = visual.with_images(main)  # decoded by the DataLoader's workers
        extra = task.extra_streams(self.data, stage.options, seed)
        orders += [EpochBatches(len(data), stage.batch_size, seed + offset, self.world)
                   for offset, data in enumerate(extra, 1)]
        batch = step * stage.grad_accumulation
        if positions is None and saved_world != self.world.size:
            saved = World(size=saved_world)
            positions = [EpochBatches(len(data), stage.batch_size, seed, saved).position(batch)
                         for data in [main, *extra]]
        return StageStreams.at(list(zip([main, *extra], orders)), batch, positions)

    def _objective(self, stage: StageConfig, parts: StageParts, batches: PeekedBatches) -> nn.Module:
        objective = Objective(parts.model, parts.visual, stage, self.speed[stage.name])
        if not self.world.distributed:
            return objective
        # DDP searches the graph for parameters without a gradient every step only where a stage
        # leaves some unused (the pooler in VQA, say): where it does not, the search is wasted.
        unused = any_rank(self._leaves_parameters_unused(objective, parts, batches.peek()), self.world, self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # No buffer changes in training (frozen norms, anchors), and every rank loaded the same ones:
        # broadcasting them before each forward would only cost time and undo the folded norms.
        return DistributedDataParallel(objective, device_ids=device_ids, find_unused_parameters=unused,
                                       **NO_BUFFER_BROADCASTS)

    def _leaves_parameters_unused(self, objective: nn.Module, parts: StageParts, batch: Batch) -> bool:
        """Whether the loss of `batch` reaches some trained parameter not at all. A forward pass
        whose random draws are undone, so training continues as if it never ran."""
        if batch.inputs is None:
            return True
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), parts.precision.applied(self.device):
            loss = objective(batch.inputs, batch.pixels)["loss"]
        reached = graph_parameters(loss)
        return any(id(p) not in reached for p in parts.parameters)

    def _optimise(self, run: StageRun, objective: nn.Module, batches: Iterator[Batch], step: int) -> None:
        """Optimiser steps from `step` to the stage's end, checkpointing on the stage's schedule, and
        when a stop signal came, then stopping.

        The losses stay on the device until the end of each logging interval (`log_every` steps), of
        the stage, or a checkpoint: then they come to the host, are logged and checked finite
        (`_logged`), so no checkpoint holds a step after a NaN. Ranks agree on a stop signal and on
        the time trigger of checkpoints at those points only (a single process, after any step)."""
        stage = run.stage
        schedule = CheckpointSchedule(stage.checkpoint_every, stage.checkpoint_minutes)
        pending = PendingLosses()
        interval = run.progress.now(step)  # where the first logging interval starts
        with progress_bar(stage.steps, stage.name, "step", initial=step, enabled=self.world.rank == 0) as bar:
            while step < stage.steps:
                skipped_before = run.progress.damaged.skipped
                lr = run.parts.scheduler.get_last_lr()[0]  # the rate this step applies; the step then advances it
                losses = self._optimiser_step(run, objective, batches)
                step += 1
                pending.add(step, lr, losses, run.progress.damaged.skipped - skipped_before)
                bar.update(1)
                interval_end = step % stage.log_every == 0 or step == stage.steps
                agreed = interval_end or not self.world.distributed
                stopping = agreed and any_rank(self.stop.requested, self.world, self.device)
                saving = stopping or (step < stage.steps and self._checkpoint_due(schedule, step, agreed))
                if interval_end or saving:
                    self._logged(run, pending.to_host(), bar)
                    run.progress.mark(step)
                    run.log.interval(interval, run.progress.marks[-1], self.world.size, self.device)
                    interval = run.progress.marks[-1]
                if saving:
                    self._save(run, step)
                    schedule.written()
                if stopping:
                    raise self.stop.interrupted(f"{self.folder.root}: stage {stage.name}, step {step} "
                                                f"({run.folder.checkpoint(step).name} written)")

    def _optimiser_step(self, run: StageRun, objective: nn.Module, batches: Iterator[Batch]) -> dict[str, torch.Tensor]:
        """One step over `grad_accumulation` micro-batches; returns the losses averaged over them, and
        the gradient norm before clipping where the stage clips, on the device. Gradients are all-reduced
        once, on the last micro-batch."""
        stage, parts, progress = run.stage, run.parts, run.progress
        parts.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, torch.Tensor] = {}
        for micro in range(stage.grad_accumulation):
            batch = progress.next_batch(batches)  # its tensors on the device already (StageStreams.batches)
            progress.damaged.check(batch.damaged, batch.with_images)
            last = micro == stage.grad_accumulation - 1
            with nullcontext() if last or not isinstance(objective, DistributedDataParallel) else objective.no_sync():
                with record_function("forward"), parts.precision.applied(self.device):
                    losses = objective(batch.inputs, batch.pixels)
                with record_function("backward"), parts.precision.float32_math(self.device):
                    parts.scaler.scale(losses["loss"] / stage.grad_accumulation).backward()
            for name, value in losses.items():
                totals[name] = totals.get(name, 0) + value.detach() / stage.grad_accumulation
        with record_function("optimiser"):
            if stage.clip_grad_norm > 0:
                parts.scaler.unscale_(parts.optimizer)
                # The total norm and the scaling stay on the device: no per-parameter sync. The norm
                # goes to the host with the losses, at the logging interval.
                totals["grad_norm"] = torch.nn.utils.clip_grad_norm_(parts.parameters, stage.clip_grad_norm)
            parts.scaler.step(parts.optimizer)
            parts.scaler.update()
            parts.scheduler.step()
        return totals

    def _checkpoint_due(self, schedule: CheckpointSchedule, step: int, agreed: bool) -> bool:
        """The schedule's decision, the same on every rank: each rank keeps its own clock, and saving
        is collective (every rank's random state goes into the checkpoint), so ranks agree on the
        time trigger where `agreed` (the end of a logging interval), counting only steps elsewhere."""
        if not (self.world.distributed and schedule.seconds > 0):
            return schedule.due(step)
        return any_rank(schedule.due(step), self.world, self.device) if agreed else schedule.due(step, clock=False)

    def _logged(self, run: StageRun, steps: list[StepLosses], bar) -> None:
        """Logs the steps' losses; stops the stage (every rank) at a NaN or infinite loss, logging
        only the steps before it: the parameters it updated are lost, the last checkpoint is kept, and
        no final model is written."""
        diverged = next((losses for losses in steps if not losses.finite), None)
        if any_rank(diverged is not None, self.world, self.device):
            shown = diverged or steps[-1]  # another rank's loss diverged
            self._log_steps(run, [losses for losses in steps if losses.step < shown.step], bar)
            kept = run.folder.latest_checkpoint()
            keeping = f" (its last checkpoint, {kept.name}, is kept)" if kept else ""
            raise NonFiniteLossError(
                f"{self.folder.root}: stage {run.stage.name}: the loss is {shown.losses['loss']} at step {shown.step}; "
                f"training stopped, saving nothing of it{keeping}: a lower base_lr or clip_grad_norm may avoid it (a "
                "changed config needs --restart)")
        self._log_steps(run, steps, bar)

    @staticmethod
    def _log_steps(run: StageRun, steps: list[StepLosses], bar) -> None:
        for losses in steps:
            run.log.step(losses.step, losses.lr, losses.losses, losses.damaged_skipped)
        if steps:
            bar.set_postfix(loss=f"{steps[-1].losses['loss']:.3f}")

    def _save(self, run: StageRun, step: int) -> None:
        """A checkpoint, with every rank's random state and where each stream's next batch begins,
        written by rank 0; then the stage's oldest beyond `keep_checkpoints` removed."""
        random_states = gathered(random_state(self.device), self.world)
        if random_states is None:
            return
        parts = run.parts
        extra = {DETECTOR_WEIGHTS: _detector_state(parts.visual)} if parts.visual is not None else None
        scaler = parts.scaler.state_dict() if parts.scaler.is_enabled() else None
        saved = {**run.progress.saved(), "positions": run.streams.positions(step * run.stage.grad_accumulation)}
        save_checkpoint(run.folder.checkpoint(step), parts.model, parts.optimizer, parts.scheduler, step, saved, extra,
                        random_states, scaler)
        prune_checkpoints(run.folder, run.stage.keep_checkpoints)


class PeekedBatches:
    """An iterator of batches whose first can be looked at before it is consumed."""

    def __init__(self, batches: Iterator[Batch]) -> None:
        self.batches, self.first = batches, None

    def peek(self) -> Batch:
        if self.first is None:
            self.first = next(self.batches)
        return self.first

    def __iter__(self) -> PeekedBatches:
        return self

    def __next__(self) -> Batch:
        if self.first is not None:
            batch, self.first = self.first, None
            return batch
        return next(self.batches)

    def close(self) -> None:
        """Ends the batches' generator, and with it their DataLoader and its worker processes."""
        self.first = None
        self.batches.close()


def graph_parameters(loss: torch.Tensor) -> set[int]:
    """The ids of the parameters that `loss`'s autograd graph accumulates gradients into."""
    reached, seen, pending = set(), set(), [loss.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # AccumulateGrad: a leaf tensor
            reached.add(id(node.variable))
        pending.extend(next_node for next_node, _ in node.next_functions)
    return reached


class Objective(nn.Module):
    """The stage's losses as one module, so DDP sees every trained parameter (VL-BERT and, for
    end-to-end stages, the detector) and only the loss tensors among the outputs."""

    def __init__(self, model: nn.Module, visual: EndToEndVisual | None, stage: StageConfig, speed: StageSpeed) -> None:
        super().__init__()
        self.model, self.visual, self.stage = model, visual, stage
        self.task = TASKS[stage.task]
        self.losses = speed.step(self._losses)

    def forward(self, inputs: dict[str, torch.Tensor], pixels: dict[str, list]) -> dict[str, torch.Tensor]:
        """`pixels`: the batch's PIXELS entries, which the end-to-end visual side reads (eager, before
        a compiled stage's graph)."""
        return self.losses(dict(with_appearance(self.visual, inputs, pixels)))

    def _losses(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.task.loss(self.model, inputs, self.stage.options)


def _detector_state(visual: EndToEndVisual) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in visual.detector.state_dict().items()}


def _silent(message: str) -> None:
    """The log of processes other than rank 0."""

