"""Runs the stages of a training run from the FeatureStore: data, optimisation, checkpoints, evaluation.

Layout of `run.out`:
    run.json                       the resolved run config; another config is refused in this folder
    metrics.jsonl                  one JSON object per optimiser step and per evaluation
    tensorboard/<i>-<name>/        the stage's TensorBoard scalars
    stages/<i>-<name>/checkpoint-<step>/   model (save_pretrained), optimizer, scheduler, RNG state
    stages/<i>-<name>/final/       the stage's model; its presence marks the stage done
    stages/<i>-<name>/eval.json    the stage's evaluation
    stages/<i>-<name>/predictions/<split>.<ext>   its predictions on the evaluation split (and on
                                   each `predict` split) in the benchmark's format
    stages/<i>-<name>/item_scores/<split>.json    each evaluated item's score (bootstrap intervals
                                   and paired comparisons resample these)
Before anything trains, the config's paths, the device, and the store's arrays for every stage are
checked. Resuming finds the first unfinished stage and its latest checkpoint (or starts it again
at step 0, and says which); data order and dropout continue exactly, so a resumed run logs the
same losses as an uninterrupted one, each step once.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from extract.device import check_device
from train.data.annotations import AnnotationFile
from train.data.collate import collate
from train.data.datasets import CaptionPretraining, SeededDataset, TextOnlyCorpus
from train.data.regions import RegionBank
from train.data.sources.text import TextCorpus
from train.end2end import PIXELS, EndToEndVisual
from train.engine.checkpoint import (
    CheckpointSchedule,
    latest_checkpoint,
    load_training_state,
    prune_checkpoints,
    save_checkpoint,
)
from train.engine.config import RunConfig, RunConfigError, RunMismatchError, StageConfig, run_differences
from train.engine.damaged import DamagedRecords
from train.engine.evaluate import evaluate
from train.engine.optimization import OPTIMIZERS, learning_rate_factor, parameter_groups
from train.engine.stage_log import METRICS, TENSORBOARD, MutedStageLog, StageLog
from train.tasks import TASKS, TaskData, model_inputs
from vlbert import VLBertConfig
from vlbert.tokenization import load_tokenizer

DETECTOR_WEIGHTS = "detector.safetensors"
RUN_FILE = "run.json"
ITEM_SCORES = "item_scores"
STAGES = "stages"
# What `restart` removes from a run folder; anything else there (a pipeline's step.json) stays.
RUN_OUTPUTS = (STAGES, METRICS, TENSORBOARD, RUN_FILE)


def world() -> tuple[int, int]:
    """(rank, world size) under torchrun or any launcher setting RANK and WORLD_SIZE."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class EpochBatches:
    """Index batches for one process: a seeded permutation per epoch, sliced per rank, drop-last."""

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        self.rank, self.world_size = world()
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.per_epoch = size // (batch_size * self.world_size)
        if self.per_epoch == 0:
            raise ValueError(f"{size} samples cannot fill one batch of {batch_size} on {self.world_size} process(es)")

    def epochs_from(self, step: int) -> Iterator[tuple[int, list[list[int]]]]:
        """(epoch, its remaining index batches) from global step `step` on, forever."""
        epoch, offset = divmod(step, self.per_epoch)
        while True:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 100003 + epoch))
            mine = order[self.rank :: self.world_size].tolist()
            yield epoch, [mine[b * self.batch_size : (b + 1) * self.batch_size] for b in range(offset, self.per_epoch)]
            epoch, offset = epoch + 1, 0


def _loader(dataset: SeededDataset, batches: EpochBatches, step: int, workers: int) -> Iterator[list]:
    """Samples batch by batch; one DataLoader per epoch so that every worker sees the epoch's seed."""
    for epoch, epoch_batches in batches.epochs_from(step):
        dataset.set_epoch(epoch)
        # A generator of its own: a DataLoader draws its workers' base seed from the global RNG
        # otherwise, which would shift dropout after a resume.
        yield from DataLoader(dataset, batch_sampler=epoch_batches, collate_fn=list, num_workers=workers,
                              generator=torch.Generator().manual_seed(epoch))


@dataclass
class StageParts:
    """What a stage trains and how: the model, the end-to-end visual side (or None), the optimiser."""

    model: nn.Module
    visual: EndToEndVisual | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    parameters: list[nn.Parameter]  # the trained ones, for gradient clipping


@dataclass
class StageProgress:
    """Counters a stage carries over a resume in its checkpoints."""

    started: float  # time.perf_counter() at which the stage would have started, had it never stopped
    samples: int
    damaged: DamagedRecords

    @classmethod
    def from_saved(cls, saved: dict, skip_damaged: bool) -> StageProgress:
        """With the counters a checkpoint saved (`saved()`; {} for a stage starting afresh)."""
        return cls(time.perf_counter() - saved.get("seconds", 0.0), saved.get("samples", 0),
                   DamagedRecords.from_saved(skip_damaged, saved))

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def saved(self) -> dict:
        return {"seconds": self.seconds, "samples": self.samples, **self.damaged.saved()}


class Trainer:
    def __init__(self, run: RunConfig, log: Callable[[str], None] = print) -> None:
        """Checks what would otherwise fail later: the config's paths (RunConfigError), the device
        (DeviceError), the store (StoreError when it is none) and that it can feed every stage."""
        self.run = run
        self.rank, self.world_size = world()
        self.log = log if self.rank == 0 else _silent
        run.check_paths()
        self.device = check_device(run.device)
        self.out = run.out_dir
        self.regions = RegionBank(run.store, run.max_regions)
        self._check_store_feeds_every_stage()
        self.tokenizer = load_tokenizer(run.vocabulary)
        self.data = TaskData(self.regions, self.tokenizer, run.max_length, self._annotations(run.train_annotations),
                             run.answers)
        self.eval_annotations = self._annotations(run.eval_annotations)
        self.predict_annotations = [self._annotations(path) for path in run.predict]
        self.corpus = TextCorpus(run.corpus) if run.corpus else None

    # ---- public ----------------------------------------------------------------------------

    def fit(self, resume: bool = False, restart: bool = False) -> list[dict]:
        """Runs (or, with `resume`, continues) every stage not done yet; returns each stage's evaluation.

        `out` must hold this run or none: a run.json that differs beyond RESULT_NEUTRAL_FIELDS is
        refused (RunMismatchError) unless `restart`, which removes the previous run's outputs first."""
        if self.world_size > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        self._claim_run_folder(restart)
        results = []
        previous: Path | None = Path(self.run.init_from) if self.run.init_from else None
        for index, stage in enumerate(self.run.stages):
            stage_dir = self.out / STAGES / f"{index}-{stage.name}"
            if (stage_dir / "final").is_dir():
                self.log(f"stage {stage.name}: done ({stage_dir / 'final'}), nothing to train")
            else:
                if not resume and latest_checkpoint(stage_dir) is not None:
                    raise FileExistsError(f"{stage_dir} holds checkpoints of an earlier run: pass resume=True "
                                          "(--resume) to continue it, restart=True (--restart) to start over, "
                                          "or use another output folder")
                self._train_stage(stage, stage_dir, previous)
            results.append(json.loads((stage_dir / "eval.json").read_text()))
            previous = stage_dir / "final"
        return results

    # ---- before training -------------------------------------------------------------------

    def _check_store_feeds_every_stage(self) -> None:
        meta = self.regions.store.meta  # opening the store: StoreError when `store` is no FeatureStore
        self.regions.store.check_agreement()  # StoreError for records that disagree with meta.json
        for stage in self.run.stages:
            problem = self._store_problem(stage, meta)
            if problem is not None:
                raise RunConfigError(f"stage {stage.name!r}: {problem}")

    def _store_problem(self, stage: StageConfig, meta: dict) -> str | None:
        """Why the store cannot feed `stage`, or None."""
        problems = []
        if stage.task == "pretrain":
            problems.append(CaptionPretraining.store_problem(self.regions, stage.roi_masking))
        if stage.visual == "end2end":
            problems.append(EndToEndVisual.store_problem(meta, self.run.images))
        return next((problem for problem in problems if problem), None)

    def _annotations(self, path: str) -> AnnotationFile:
        """The annotations of `path` whose images the store holds (says how many it lacks)."""
        annotations = AnnotationFile(path, keep=self.regions.__contains__)
        if annotations.dropped:
            self.log(f"{path}: {annotations.dropped} of {annotations.dropped + len(annotations)} images are not in "
                     f"the store {self.run.store}; their items are left out")
        return annotations

    def _claim_run_folder(self, restart: bool) -> None:
        """Refuses a run folder holding a run with another config unless `restart`, then records this
        config in run.json (its result-neutral fields may have changed)."""
        recorded = self.out / RUN_FILE
        differences = run_differences(json.loads(recorded.read_text()), self.run) if recorded.is_file() else []
        if differences and not restart:
            raise RunMismatchError(f"{self.out} holds a run with another config; pass restart=True (--restart) to "
                                   "discard it, or use another output folder:\n"
                                   + "\n".join(f"  {difference}" for difference in differences))
        self._barrier()  # every process has read run.json before rank 0 replaces it
        if self.rank == 0:
            if restart:
                self._remove_outputs()
            self.out.mkdir(parents=True, exist_ok=True)
            recorded.write_text(json.dumps(self.run.to_dict(), indent=1))
        self._barrier()

    def _remove_outputs(self) -> None:
        previous = [self.out / name for name in RUN_OUTPUTS if (self.out / name).exists()]
        for path in previous:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        if previous:
            self.log(f"restart: removed the previous run's {', '.join(p.name for p in previous)} from {self.out}")

    # ---- one stage -------------------------------------------------------------------------

    def _train_stage(self, stage: StageConfig, stage_dir: Path, previous: Path | None) -> None:
        torch.manual_seed(self.run.seed)
        parts = self._parts(stage, previous)
        step, saved = self._start(stage, stage_dir, parts)
        progress = StageProgress.from_saved(saved, skip_damaged=self.run.damaged_records == "skip")
        objective = self._objective(stage, parts)
        with self._stage_log(stage, stage_dir, step) as log:
            self._optimise(stage, stage_dir, parts, objective, step, progress, log)
            seconds = progress.seconds
            self._save(stage, stage_dir / f"checkpoint-{stage.steps}", parts, stage.steps, progress)
            if self.rank == 0:
                self._finish(stage, stage_dir, parts, seconds, progress, log)
        self._barrier()

    def _start(self, stage: StageConfig, stage_dir: Path, parts: StageParts) -> tuple[int, dict]:
        """Loads the stage's latest checkpoint, if any: (the step to start from, the saved progress)."""
        checkpoint = latest_checkpoint(stage_dir)
        if checkpoint is None:
            attempted = (self.out / TENSORBOARD / stage_dir.name).exists()  # an interrupted attempt logged there
            self.log(f"stage {stage.name}: " + ("no checkpoint, starting again at step 0" if attempted
                                               else "starting at step 0"))
            return 0, {}
        parts.model.load_state_dict(load_file(checkpoint / "model.safetensors"))
        if parts.visual is not None:
            parts.visual.detector.load_state_dict(load_file(checkpoint / DETECTOR_WEIGHTS))
        step, saved = load_training_state(checkpoint, parts.optimizer, parts.scheduler)
        self.log(f"stage {stage.name}: resuming from {checkpoint} (step {step})")
        return step, saved

    def _optimise(self, stage: StageConfig, stage_dir: Path, parts: StageParts, objective: nn.Module, step: int,
                  progress: StageProgress, log: StageLog | MutedStageLog) -> None:
        """Optimiser steps from `step` to the stage's end, checkpointing on the stage's schedule."""
        streams = self._streams(stage, step, parts.visual)
        schedule = CheckpointSchedule(stage.checkpoint_every, stage.checkpoint_minutes)
        with tqdm(total=stage.steps, initial=step, desc=stage.name, disable=self.rank != 0, dynamic_ncols=True) as bar:
            while step < stage.steps:
                skipped_before = progress.damaged.skipped
                losses = self._optimiser_step(stage, parts, objective, streams, progress)
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{losses['loss']:.3f}")
                log.step(step, parts.scheduler.get_last_lr()[0], losses, progress.damaged.skipped - skipped_before)
                if step < stage.steps and schedule.due(step):
                    self._save(stage, stage_dir / f"checkpoint-{step}", parts, step, progress)
                    schedule.written()

    def _optimiser_step(self, stage: StageConfig, parts: StageParts, objective: nn.Module,
                        streams: list[Iterator[list]], progress: StageProgress) -> dict[str, float]:
        """One step over `grad_accumulation` batches; returns the losses averaged over them."""
        parts.optimizer.zero_grad(set_to_none=True)
        logged: dict[str, float] = {}
        for _ in range(stage.grad_accumulation):
            samples = [s for stream in streams for s in progress.damaged.usable(next(stream))]
            progress.samples += len(samples)
            batch = collate(samples, self.tokenizer.pad_token_id)
            inputs = {k: v.to(self.device) for k, v in batch.items() if torch.is_tensor(v)}
            with _autocast(self.device):
                losses = objective(inputs, {k: batch[k] for k in PIXELS})
            (losses["loss"] / stage.grad_accumulation).backward()
            for name, value in losses.items():
                logged[name] = logged.get(name, 0.0) + value.item() / stage.grad_accumulation
        if stage.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(parts.parameters, stage.clip_grad_norm)
        parts.optimizer.step()
        parts.scheduler.step()
        return logged

    def _finish(self, stage: StageConfig, stage_dir: Path, parts: StageParts, seconds: float,
                progress: StageProgress, log: StageLog) -> None:
        """Evaluates the stage (writing its predictions), logs the result and writes its final model (rank 0)."""
        parts.model.eval()
        scores = self._evaluate(stage, stage_dir, parts, self.eval_annotations, progress)
        for annotations in self.predict_annotations:
            self._evaluate(stage, stage_dir, parts, annotations, progress)
        result = {"stage": stage.name, "task": stage.task, "visual": stage.visual, "steps": stage.steps,
                  "wall_s": round(seconds, 2), "samples_per_s": round(progress.samples * self.world_size / seconds, 2),
                  **scores, "damaged_skipped": progress.damaged.skipped}
        # Logged before the final model marks the stage done: a crash in between evaluates again.
        log.evaluation(result, stage.steps)
        self._save_final(stage_dir, parts, result)
        self.log(f"stage {stage.name}: " + ", ".join(f"{k} {v}" for k, v in result.items()))
        if progress.damaged.skipped:
            self.log(f"stage {stage.name}: {progress.damaged.summary()}")

    def _evaluate(self, stage: StageConfig, stage_dir: Path, parts: StageParts, annotations: AnnotationFile,
                  progress: StageProgress) -> dict:
        task = TASKS[stage.task]
        dataset = task.dataset(self.data, stage, annotations, self.run.seed, False)
        split = annotations.path.stem
        predictions = None
        if task.prediction_suffix is not None:
            predictions = stage_dir / "predictions" / (split + task.prediction_suffix)
        # Workers decode an end-to-end stage's images; cached features are read in this process.
        workers = stage.num_workers if parts.visual is not None else 0
        return evaluate(task.evaluator(self.data, dataset), parts.model, parts.visual, dataset,
                        self.run.eval_batch_size, self.device, self.tokenizer.pad_token_id, progress.damaged.usable,
                        predictions, stage_dir / ITEM_SCORES / f"{split}.json", workers)

    # ---- pieces ----------------------------------------------------------------------------

    def _parts(self, stage: StageConfig, previous: Path | None) -> StageParts:
        model = self._model(stage, previous)
        visual = self._visual(stage, previous)
        parameters = [p for m in (model, visual) if m is not None for p in m.parameters() if p.requires_grad]
        total_batch = stage.batch_size * self.world_size * stage.grad_accumulation
        optimizer = OPTIMIZERS[stage.optimizer](parameter_groups(model, visual, stage.weight_decay),
                                                stage.base_lr * total_batch)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor(stage))
        return StageParts(model, visual, optimizer, scheduler, parameters)

    def _objective(self, stage: StageConfig, parts: StageParts) -> nn.Module:
        parts.model.to(self.device).train()
        if parts.visual is not None:
            parts.visual.to(self.device).train()
        objective = Objective(parts.model, parts.visual, stage)
        if self.world_size > 1:
            # Heads a task leaves unused (the pooler in VQA, say) get no gradient: DDP must allow that.
            objective = DistributedDataParallel(objective, find_unused_parameters=True)
        return objective

    def _stage_log(self, stage: StageConfig, stage_dir: Path, start: int) -> StageLog | MutedStageLog:
        return StageLog(self.out, stage_dir.name, stage.name, start) if self.rank == 0 else MutedStageLog()

    def _model(self, stage: StageConfig, previous: Path | None):
        task = TASKS[stage.task]
        overrides = dict(self.run.model)
        overrides.update(vocab_size=len(self.tokenizer), visual_feature_size=self.regions.feature_dim,
                         num_detector_classes=self.regions.num_classes or 1,
                         num_answers=len(self.data.answers) if task.uses_answers() else 1,
                         with_relationship_head=stage.relationship)
        cls = task.model
        if previous is not None:
            return cls.from_pretrained(previous, **{k: overrides[k] for k in ("num_answers", "with_relationship_head")})
        if self.run.bert:
            bert_sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                          "max_position_embeddings")
            return cls.from_bert(self.run.bert, **{k: v for k, v in overrides.items() if k not in bert_sizes})
        return cls(VLBertConfig(**overrides))

    def _visual(self, stage: StageConfig, previous: Path | None) -> EndToEndVisual | None:
        if stage.visual != "end2end":
            return None
        visual = EndToEndVisual.from_store_meta(self.regions.store.meta, self.run.images, self.run.detector_weights)
        if previous is not None and (previous / DETECTOR_WEIGHTS).is_file():
            visual.detector.load_state_dict(load_file(previous / DETECTOR_WEIGHTS))
        return visual

    def _streams(self, stage: StageConfig, step: int, visual: EndToEndVisual | None) -> list[Iterator[list]]:
        seed = self.run.seed * 1000 + self.run.stages.index(stage)
        main = TASKS[stage.task].dataset(self.data, stage, self.data.train, seed, True)
        if visual is not None:
            main = visual.with_images(main)  # decoded by the DataLoader's workers
        streams = [_loader(main, EpochBatches(len(main), stage.batch_size, seed), step, stage.num_workers)]
        if stage.task == "pretrain" and stage.text_only and stage.masked_lm and self.corpus is not None:
            text = TextOnlyCorpus(self.corpus, self.tokenizer, self.run.max_length, seed)
            streams.append(_loader(text, EpochBatches(len(text), stage.batch_size, seed + 1), step, 0))
        return streams

    def _save(self, stage: StageConfig, directory: Path, parts: StageParts, step: int,
              progress: StageProgress) -> None:
        """A checkpoint (rank 0 only), then the stage's oldest beyond `keep_checkpoints` removed."""
        if self.rank != 0:
            return
        extra = {DETECTOR_WEIGHTS: _detector_state(parts.visual)} if parts.visual is not None else None
        save_checkpoint(directory, parts.model, parts.optimizer, parts.scheduler, step, progress.saved(), extra)
        prune_checkpoints(directory.parent, stage.keep_checkpoints)

    def _save_final(self, stage_dir: Path, parts: StageParts, result: dict) -> None:
        final = stage_dir / "final"
        tmp = stage_dir / "final.tmp"
        parts.model.save_pretrained(tmp)
        if parts.visual is not None:
            save_file(_detector_state(parts.visual), tmp / DETECTOR_WEIGHTS)
        (stage_dir / "eval.json").write_text(json.dumps(result, indent=1))
        os.replace(tmp, final)

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


class Objective(nn.Module):
    """The stage's losses as one module, so DDP sees every trained parameter (VL-BERT and, for
    end-to-end stages, the detector) and only the loss tensors among the outputs."""

    def __init__(self, model: nn.Module, visual: EndToEndVisual | None, stage: StageConfig) -> None:
        super().__init__()
        self.model, self.visual, self.stage = model, visual, stage

    def forward(self, inputs: dict[str, torch.Tensor], pixels: dict[str, list]) -> dict[str, torch.Tensor]:
        """`pixels`: the batch's PIXELS entries, which the end-to-end visual side reads."""
        inputs = dict(inputs)
        if self.visual is not None and "appearance" in inputs:
            inputs["appearance"] = self.visual({**inputs, **pixels})
        stage = self.stage
        if stage.task != "pretrain":
            return {"loss": self.model(**model_inputs(self.model, inputs)).loss}
        if not stage.masked_lm:
            inputs.pop("mlm_labels")
        if not stage.masked_roi:
            inputs.pop("region_labels", None)
            inputs.pop("masked_regions", None)
        output = self.model(feature_masking=stage.masked_roi and stage.roi_masking == "feature", **inputs)
        return {name: getattr(output, name) for name in ("loss", "mlm_loss", "region_loss", "relationship_loss")
                if getattr(output, name) is not None}


def _detector_state(visual: EndToEndVisual) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in visual.detector.state_dict().items()}


def _silent(message: str) -> None:
    """The log of processes other than rank 0."""


def _autocast(device: torch.device):
    """bf16 autocast on CUDA; full precision on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
