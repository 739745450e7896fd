"""The fine-tuning and pre-training tasks, one module each: its dataset, its evaluator (which scores
predictions and writes them in the format the benchmark's own tool, `vlbert evaluate`, and its
leaderboard accept) and its `Task` record (`train.tasks.base`), listed in `TASKS` below.

The engine knows no task by name: it asks a stage's Task for its dataset, its model class and the
config fields the model's heads need (`model_config`), whether a store can feed it
(`store_problem`), its own input files read before training (`read_inputs`), further sample streams
beside its dataset (`extra_streams`), its loss (`loss`), and the type of the stage's `options:`
section (`options`).
"""

from __future__ import annotations

from train.tasks import choice, nlvr2, pretrain, refexp, retrieval, snli_ve, vcr, vqa
from train.tasks.base import Task

# Every task by name, in this order; a new task module adds its records here.
TASKS: dict[str, Task] = {task.name: task for task in (pretrain.TASK, vqa.TASK, choice.TASK, *vcr.TASKS, refexp.TASK,
                                                       retrieval.TASK, snli_ve.TASK, nlvr2.TASK)}
