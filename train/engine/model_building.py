"""A stage's model, built as its task has it (`Task.model`, its heads' sizes from the data), from what
the stage starts from: the model before it (the previous stage's final one, or `init_from`), a BERT
checkpoint for the text side (which fixes the sizes it has: `vlbert.modeling.BERT_SIZES`), or random
weights at the run's `model:` size. The vocabulary and feature sizes are the tokenizer's and the store's.
A stage that cannot start from these weights is refused (RunConfigError) before it trains.
"""

from __future__ import annotations

from pathlib import Path

from train.engine.config import RunConfig, RunConfigError, StageConfig
from train.tasks import TASKS
from train.tasks.base import TaskData
from vlbert import VLBertConfig
from vlbert.modeling import VLBertPreTrainedModel


def stage_model(run: RunConfig, stage: StageConfig, data: TaskData, previous: Path | None) -> VLBertPreTrainedModel:
    """`stage`'s model of `run`, from `previous` (a model folder; None: BERT or random weights)."""
    task = TASKS[stage.task]
    heads = task.model_overrides(data, stage.options)
    _check_start_weights(run, stage, previous)
    if previous is not None:
        model = task.model.from_pretrained(previous, **heads)
        _check_fresh_weights(stage, previous, model.fresh_weights)
        return model
    overrides = {k: v for k, v in run.model.items() if k != "size"}
    overrides.update(vocab_size=len(data.tokenizer), visual_feature_size=data.regions.feature_dim,
                     num_detector_classes=data.regions.num_classes or 1, **heads)
    if run.bert:
        return task.model.from_bert(run.bert, **overrides)
    return task.model(VLBertConfig.sized(run.model.get("size", "base"), **overrides))


def _check_start_weights(run: RunConfig, stage: StageConfig, previous: Path | None) -> None:
    """A stage whose task needs pre-trained heads (`Task.pretrained_heads`) cannot start from BERT or
    random weights (an evaluation-only stage never does: RunConfig refuses it)."""
    needed = TASKS[stage.task].pretrained_heads(stage.options)
    if previous is None and needed:
        start = "BERT" if run.bert else "random weights"
        raise RunConfigError(f"stage {stage.name!r}: {next(iter(needed.values()))}; the run starts from {start}: "
                             "give init_from (a VL-BERT checkpoint that has it)")


def _check_fresh_weights(stage: StageConfig, previous: Path, fresh: tuple[str, ...]) -> None:
    """RunConfigError when the checkpoint lacks weights the stage cannot start without: any, for an
    evaluation-only stage (they would be random); its task's pre-trained heads, for any stage."""
    needed = TASKS[stage.task].pretrained_heads(stage.options)
    for prefix, why in needed.items():
        if any(name.startswith(prefix) for name in fresh):
            raise RunConfigError(f"stage {stage.name!r}: {why}; {previous} has no {prefix.rstrip('.')}")
    if stage.steps == 0 and fresh:
        modules = ", ".join(dict.fromkeys(name.rsplit(".", 1)[0] for name in fresh))
        raise RunConfigError(f"stage {stage.name!r}: steps: 0 evaluates the model as {previous} has it, but it has "
                             f"no weights for {modules} (they would be random): train the stage (steps ≥ 1) or "
                             "start from a checkpoint of this task's model")
