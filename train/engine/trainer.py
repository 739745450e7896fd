"""Runs the stages of a training run from the FeatureStore: data, optimisation, checkpoints, evaluation.

Layout of `run.out`:
    run.json                       the resolved run config
    metrics.jsonl                  one JSON object per optimiser step and per evaluation
    stages/<i>-<name>/checkpoint-<step>/   model (save_pretrained), optimizer, scheduler, RNG state
    stages/<i>-<name>/final/       the stage's model; its presence marks the stage done
    stages/<i>-<name>/eval.json    the stage's evaluation
Resuming finds the first unfinished stage and its latest checkpoint; data order and dropout
continue exactly, so a resumed run logs the same losses as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from train.data.annotations import AnswerVocabulary, answers_by_type, read_annotations
from train.data.collate import collate
from train.data.datasets import (
    CaptionPretraining,
    MultipleChoice,
    QuestionAnswering,
    ReferringExpressions,
    SeededDataset,
    TextOnlyCorpus,
)
from train.data.regions import RegionBank
from train.end2end import EndToEndVisual
from train.engine.checkpoint import latest_checkpoint, load_training_state, save_checkpoint
from train.engine.config import RunConfig, StageConfig
from train.engine.evaluate import evaluate
from vlbert import VLBertConfig
from vlbert.modeling import (
    VLBertForMultipleChoice,
    VLBertForPreTraining,
    VLBertForQuestionAnswering,
    VLBertForReferringExpressions,
)
from vlbert.tokenization import load_tokenizer

TASK_MODELS = {"pretrain": VLBertForPreTraining, "vqa": VLBertForQuestionAnswering,
               "choice": VLBertForMultipleChoice, "refexp": VLBertForReferringExpressions}
DETECTOR_WEIGHTS = "detector.safetensors"


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


class Trainer:
    def __init__(self, run: RunConfig, log: Callable[[str], None] = print) -> None:
        self.run, self.log = run, log
        self.rank, self.world_size = world()
        self.device = torch.device(run.device)
        self.out = run.out_dir
        self.tokenizer = load_tokenizer(run.vocabulary)
        self.regions = RegionBank(run.store, run.max_regions)
        self.train_annotations = read_annotations(run.train_annotations)
        self.eval_annotations = read_annotations(run.eval_annotations)
        self.answers = AnswerVocabulary.from_annotations(self.train_annotations)
        self.corpus = Path(run.corpus).read_text().splitlines() if run.corpus else []

    # ---- public ----------------------------------------------------------------------------

    def fit(self, resume: bool = False) -> list[dict]:
        """Runs (or, with `resume`, continues) every stage; returns each stage's evaluation."""
        if self.world_size > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        self.out.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            (self.out / "run.json").write_text(json.dumps(self.run.to_dict(), indent=1))
        results = []
        previous: Path | None = Path(self.run.init_from) if self.run.init_from else None
        for index, stage in enumerate(self.run.stages):
            stage_dir = self.out / "stages" / f"{index}-{stage.name}"
            if not (stage_dir / "final").is_dir():
                if not resume and latest_checkpoint(stage_dir) is not None:
                    raise FileExistsError(f"{stage_dir} holds checkpoints of an earlier run: pass resume=True "
                                          "(--resume) to continue it, or use another output folder")
                self._train_stage(stage, stage_dir, previous)
            results.append(json.loads((stage_dir / "eval.json").read_text()))
            previous = stage_dir / "final"
        return results

    # ---- one stage -------------------------------------------------------------------------

    def _train_stage(self, stage: StageConfig, stage_dir: Path, previous: Path | None) -> None:
        torch.manual_seed(self.run.seed)
        model = self._model(stage, previous)
        visual = self._visual(stage, previous)
        parameters = [p for m in (model, visual) if m is not None for p in m.parameters() if p.requires_grad]
        total_batch = stage.batch_size * self.world_size * stage.grad_accumulation
        optimizer = torch.optim.AdamW(_parameter_groups(model, visual, stage.weight_decay),
                                      lr=stage.base_lr * total_batch)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_linear_decay(stage))
        step, progress = 0, {"seconds": 0.0, "samples": 0}
        checkpoint = latest_checkpoint(stage_dir)
        if checkpoint is not None:
            model.load_state_dict(load_file(checkpoint / "model.safetensors"))
            if visual is not None:
                visual.detector.load_state_dict(load_file(checkpoint / DETECTOR_WEIGHTS))
            step, progress = load_training_state(checkpoint, optimizer, scheduler)
            self._forget_metrics_after(stage.name, step)
            self.log(f"stage {stage.name}: resuming from {checkpoint} (step {step})")
        model.to(self.device).train()
        if visual is not None:
            visual.to(self.device).train()
        objective = Objective(model, visual, stage)
        if self.world_size > 1:
            # Heads a task leaves unused (the pooler in VQA, say) get no gradient: DDP must allow that.
            objective = DistributedDataParallel(objective, find_unused_parameters=True)

        streams = self._streams(stage, step)
        metrics = (self.out / "metrics.jsonl").open("a") if self.rank == 0 else None
        board = SummaryWriter(str(self.out / "tensorboard")) if self.rank == 0 else None
        bar = tqdm(total=stage.steps, initial=step, desc=stage.name, disable=self.rank != 0, dynamic_ncols=True)
        started, samples = time.perf_counter() - progress["seconds"], progress["samples"]
        while step < stage.steps:
            optimizer.zero_grad(set_to_none=True)
            logged: dict[str, float] = {}
            for _ in range(stage.grad_accumulation):
                batch = collate([s for stream in streams for s in next(stream)], self.tokenizer.pad_token_id)
                samples += len(batch["input_ids"])
                inputs = {k: v.to(self.device) for k, v in batch.items() if torch.is_tensor(v)}
                with _autocast(self.device):
                    losses = objective(inputs, batch["image_files"])
                (losses["loss"] / stage.grad_accumulation).backward()
                for name, value in losses.items():
                    logged[name] = logged.get(name, 0.0) + value.item() / stage.grad_accumulation
            if stage.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(parameters, stage.clip_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{logged['loss']:.3f}")
            if metrics is not None:
                metrics.write(json.dumps({"stage": stage.name, "step": step, "lr": scheduler.get_last_lr()[0],
                                          **logged}) + "\n")
                metrics.flush()
                for name, value in logged.items():
                    board.add_scalar(f"{stage.name}/{name}", value, step)
            if step < stage.steps and stage.checkpoint_every and step % stage.checkpoint_every == 0:
                self._save(stage_dir / f"checkpoint-{step}", model, visual, optimizer, scheduler, step,
                           {"seconds": time.perf_counter() - started, "samples": samples})
        bar.close()
        seconds = time.perf_counter() - started
        self._save(stage_dir / f"checkpoint-{step}", model, visual, optimizer, scheduler, step,
                   {"seconds": seconds, "samples": samples})
        if self.rank == 0:
            eval_data = self._dataset(stage, self.eval_annotations, self.run.seed)
            result = {"stage": stage.name, "task": stage.task, "visual": stage.visual, "steps": stage.steps,
                      "wall_s": round(seconds, 2), "samples_per_s": round(samples * self.world_size / seconds, 2),
                      **evaluate(stage.task, model.eval(), visual, eval_data, self.run.eval_batch_size, self.device,
                                 self.tokenizer.pad_token_id)}
            self._save_final(stage_dir, model, visual, result)
            metrics.write(json.dumps({"stage": stage.name, "eval": result}) + "\n")
            metrics.close()
            board.add_scalar(f"{stage.name}/eval_{result['metric']}", result["value"], step)
            board.close()
            self.log(f"stage {stage.name}: " + ", ".join(f"{k} {v}" for k, v in result.items()))
        if self.world_size > 1:
            dist.barrier()

    # ---- pieces ----------------------------------------------------------------------------

    def _model(self, stage: StageConfig, previous: Path | None):
        overrides = dict(self.run.model)
        overrides.update(vocab_size=len(self.tokenizer), visual_feature_size=self.regions.feature_dim,
                         num_detector_classes=self.regions.num_classes or 1, num_answers=max(len(self.answers), 1),
                         with_relationship_head=stage.relationship)
        cls = TASK_MODELS[stage.task]
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

    def _streams(self, stage: StageConfig, step: int) -> list[Iterator[list]]:
        seed = self.run.seed * 1000 + self.run.stages.index(stage)
        main = self._dataset(stage, self.train_annotations, seed)
        streams = [_loader(main, EpochBatches(len(main), stage.batch_size, seed), step, stage.num_workers)]
        if stage.task == "pretrain" and stage.text_only and stage.masked_lm and self.corpus:
            text = TextOnlyCorpus(self.corpus, self.tokenizer, self.run.max_length, seed)
            streams.append(_loader(text, EpochBatches(len(text), stage.batch_size, seed + 1), step, 0))
        return streams

    def _dataset(self, stage: StageConfig, annotations, seed: int):
        common = (annotations, self.regions, self.tokenizer, self.run.max_length)
        if stage.task == "pretrain":
            return CaptionPretraining(*common, roi_masking=stage.roi_masking, relationship=stage.relationship,
                                      seed=seed)
        if stage.task == "vqa":
            return QuestionAnswering(*common, answers=self.answers, seed=seed)
        if stage.task == "choice":
            return MultipleChoice(*common, answers_by_type(self.train_annotations), num_choices=stage.num_choices,
                                  seed=seed)
        return ReferringExpressions(*common, seed=seed)

    def _forget_metrics_after(self, stage: str, step: int) -> None:
        """Drops what a crashed run logged past the checkpoint it resumes from: those steps run again."""
        path = self.out / "metrics.jsonl"
        if self.rank != 0 or not path.is_file():
            return
        kept = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("stage") != stage or record.get("step", 0) <= step:
                kept.append(line + "\n")
        path.write_text("".join(kept))

    def _save(self, directory: Path, model, visual, optimizer, scheduler, step: int, progress: dict) -> None:
        if self.rank != 0:
            return
        save_checkpoint(directory, model, optimizer, scheduler, step, progress)
        if visual is not None:
            save_file({k: v.contiguous() for k, v in visual.detector.state_dict().items()}, directory / DETECTOR_WEIGHTS)

    def _save_final(self, stage_dir: Path, model, visual, result: dict) -> None:
        final = stage_dir / "final"
        tmp = stage_dir / "final.tmp"
        model.save_pretrained(tmp)
        if visual is not None:
            save_file({k: v.contiguous() for k, v in visual.detector.state_dict().items()}, tmp / DETECTOR_WEIGHTS)
        (stage_dir / "eval.json").write_text(json.dumps(result, indent=1))
        os.replace(tmp, final)


class Objective(nn.Module):
    """The stage's losses as one module, so DDP sees every trained parameter (VL-BERT and, for
    end-to-end stages, the detector) and only the loss tensors among the outputs."""

    def __init__(self, model: nn.Module, visual: EndToEndVisual | None, stage: StageConfig) -> None:
        super().__init__()
        self.model, self.visual, self.stage = model, visual, stage

    def forward(self, inputs: dict[str, torch.Tensor], image_files: list[str | None]) -> dict[str, torch.Tensor]:
        inputs = dict(inputs)
        if self.visual is not None and "appearance" in inputs:
            inputs["appearance"] = self.visual({**inputs, "image_files": image_files})
        stage = self.stage
        if stage.task != "pretrain":
            for name in ("mlm_labels", "masked_regions", "iou"):
                inputs.pop(name, None)
            return {"loss": self.model(**inputs).loss}
        if not stage.masked_lm:
            inputs.pop("mlm_labels")
        if not stage.masked_roi:
            inputs.pop("region_labels", None)
            inputs.pop("masked_regions", None)
        output = self.model(feature_masking=stage.masked_roi and stage.roi_masking == "feature", **inputs)
        return {name: getattr(output, name) for name in ("loss", "mlm_loss", "region_loss", "relationship_loss")
                if getattr(output, name) is not None}


def _parameter_groups(model, visual, weight_decay: float) -> list[dict]:
    """No weight decay on biases and LayerNorm gains, as BERT trains."""
    decay, no_decay = [], []
    for module in (model, visual):
        if module is None:
            continue
        for name, parameter in module.named_parameters():
            if parameter.requires_grad:
                (no_decay if name.endswith("bias") or "norm" in name.lower() else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _warmup_linear_decay(stage: StageConfig) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < stage.warmup_steps:
            return (step + 1) / stage.warmup_steps
        return max(0.0, (stage.steps - step) / max(1, stage.steps - stage.warmup_steps))
    return factor


def _autocast(device: torch.device):
    """bf16 autocast on CUDA; full precision on the CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
