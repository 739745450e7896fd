"""DDP decides once, from a stage's first micro-batch, whether to search every step for parameters
without a gradient (`Trainer._leaves_parameters_unused`). A batch that leaves a parameter unused
after a first one that did not would fail the all-reduce, and the opposite only costs time; so the
decision must be the same for every batch of every registered task: told apart here on batches that
differ (other samples, a pre-training batch with no masked word or RoI)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.helpers.worlds import copy_world, run_config
from train.engine.config import StageConfig
from train.engine.trainer import Objective, Trainer
from train.tasks import TASKS
from vlbert.losses import IGNORE_INDEX

# Pre-training's options change which parameters its loss reaches: each variant is checked.
PRETRAIN_VARIANTS = [{"roi_masking": "feature"}, {"relationship": True}, {"text_only": False},
                     {"masked_lm": False}, {"masked_roi": False}]


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    """The tiny world with every item kind on each training image (VCR's, SNLI-VE's and NLVR2's added)."""
    root = copy_world(tiny_world, tmp_path_factory.mktemp("unused"))
    lines = [json.loads(line) for line in (root / "world" / "train.jsonl").read_text().splitlines()]
    for number, line in enumerate(lines):
        line["objects"] = [shape["class"] for shape in line["objects"]]  # VCR's objects are category names
        words = [["the", 0], "shape", "is", "here", "."]
        line["vcr"] = [{"annot_id": f"train-{number}", "question": ["where", "is", ["it", 0], "?"],
                        "answer_choices": [words] * 4, "rationale_choices": [words] * 4,
                        "answer_label": number % 4, "rationale_label": (number + 1) % 4}]
        line["snli_ve"] = [{"pair_id": f"{number}#0", "hypothesis": line["captions"][0],
                            "label": ("entailment", "neutral", "contradiction")[number % 3]}]
        line["nlvr2"] = [{"identifier": f"train-{number}-0-0", "sentence": line["captions"][0],
                          "label": number % 2 == 0, "right": lines[(number + 1) % len(lines)]["file"]}]
    (root / "world" / "every-kind.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


def decisions(world: Path, stage: StageConfig, edit=lambda inputs: None) -> list[bool]:
    """The decision on each of the stage's first three micro-batches, each passed through `edit` first."""
    run = run_config(world, f"unused-{stage.name}", [stage], train_annotations=str(world / "world" / "every-kind.jsonl"))
    stage = run.stages[0]  # pre-training's with the world's corpus
    trainer = Trainer(run)
    parts = trainer._parts(stage, None)
    objective = Objective(parts.model, parts.visual, stage, trainer.speed[stage.name])
    batches = trainer._streams(stage, 0, None, None, 1).batches(0, trainer.tokenizer.pad_token_id, trainer.device, False)
    found = []
    for batch in (next(batches) for _ in range(3)):
        edit(batch.inputs)
        found.append(trainer._leaves_parameters_unused(objective, parts, batch))
    return found


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_tasks_decision_is_the_same_for_every_batch(world, task):
    options = {"num_choices": 3} if task == "choice" else {}
    assert len(set(decisions(world, StageConfig(task, task, steps=1, batch_size=2, options=options)))) == 1


@pytest.mark.parametrize("options", PRETRAIN_VARIANTS, ids=lambda options: ",".join(options))
def test_pretrainings_decision_is_the_same_for_batches_with_and_without_masked_words_and_rois(world, options):
    stage = StageConfig("pretrain", "pretrain", steps=1, batch_size=2, options=options)
    as_drawn = decisions(world, stage)

    def nothing_masked(inputs):
        if "mlm_labels" in inputs:
            inputs["mlm_labels"] = torch.full_like(inputs["mlm_labels"], IGNORE_INDEX)
            inputs["mlm_positions"] = inputs["mlm_positions"][:0]
        for name in ("region_labels", "masked_regions"):
            if name in inputs:
                inputs[name] = torch.zeros_like(inputs[name])

    assert len(set(as_drawn + decisions(world, replace(stage, name="pretrain-unmasked"), nothing_masked))) == 1
