"""The `train` step: a training run (`train.engine.RunConfig` fields), one per seed with `seeds`, as
`devices` × `nodes` DDP processes; later steps name its outputs (`${STEP.final}`, ...)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.steps.base import (CHECKED_OUT, Foreknown, Layout, Log, StepKind, device_problems, field_names,
                                  missing_paths, parse, takes_gpu)
from train.engine.config import RunConfig, RunConfigError, StageConfig
from train.engine.run_folder import RunFolder
from vlbert.utils.typed_config import SEEDS, at_least


@dataclass
class TrainExtras:
    """A train step's keys beyond RunConfig's."""

    detector: str = ""  # a label (frozen, tuned) that reports show
    seeds: list[int] | None = dataclasses.field(default=None, metadata=SEEDS)  # distinct, each the `seed` of one run
    # DDP processes per node, each on a GPU of its own (on the CPU: gloo processes)
    devices: int = dataclasses.field(default=1, metadata=at_least(1))
    nodes: int = dataclasses.field(default=1, metadata=at_least(1))  # machines (Slurm); world size devices × nodes


TRAIN_EXTRAS = tuple(spec.name for spec in dataclasses.fields(TrainExtras))


def _train_extras(params: dict[str, Any]) -> TrainExtras:
    return parse(TrainExtras, {k: v for k, v in params.items() if k in TRAIN_EXTRAS})


def _train_layout(params: dict[str, Any]) -> Layout:
    extras = _train_extras(params)
    return Layout(ranks=extras.devices, nodes=extras.nodes, gpu=takes_gpu(params.get("device", "cpu")))


def _seeds(params: dict[str, Any]) -> list[int] | None:
    """A train step's `seeds`, checked."""
    seeds = _train_extras(params).seeds
    if seeds is None:
        return None
    if not seeds:
        raise RunConfigError("seeds: expected a list of seeds, found an empty one")
    if len(set(seeds)) < len(seeds):
        raise RunConfigError(f"seeds: {seeds!r} repeats a seed")
    if "seed" in params:
        raise RunConfigError("seed and seeds: give one (seeds trains one run per seed)")
    return seeds


def _run_config(params: dict[str, Any], out: str, seed: int | None = None) -> RunConfig:
    """RunConfig fields and TrainExtras, checked here; `seed` replaces the config's."""
    if "out" in params:
        raise RunConfigError("out: a step writes into its own folder under the pipeline's `out`; remove it")
    _seeds(params)
    fields = {k: v for k, v in params.items() if k not in TRAIN_EXTRAS}
    return RunConfig.from_dict({**fields, "out": out, **({} if seed is None else {"seed": seed})})


def _run_outputs(params: dict[str, Any], folder: Path) -> dict[str, str]:
    """`${STEP.STAGE.final}`: the final model of the stage named STAGE, `${STEP.STAGE.predictions}`:
    the folder of its predictions files; `${STEP.final}` and `${STEP.predictions}`: the last stage's.
    A step with `seeds` trains several runs and offers none of them."""
    stages = params.get("stages")
    names = [stage.get("name") for stage in stages if isinstance(stage, dict)] if isinstance(stages, list) else []
    if params.get("seeds") is not None or not names or not all(isinstance(name, str) for name in names):
        return {}
    stages = [RunFolder(folder).stage(index, name) for index, name in enumerate(names)]
    named = {f"{name}.{output}": path for name, stage in zip(names, stages)
             for output, path in (("final", stage.final), ("predictions", stage.predictions_folder))}
    return {**{key: str(path) for key, path in named.items()}, "final": str(stages[-1].final),
            "predictions": str(stages[-1].predictions_folder)}


def train(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A training run (train.engine.RunConfig fields); with `seeds`, one run per seed, each in its
    seed run folder inside the step's folder (`RunFolder.seed_run`)."""
    from train.engine.trainer import Trainer

    seeds = _seeds(params)
    runs = [(folder, None)] if seeds is None else [(RunFolder(folder).seed_run(seed).root, seed) for seed in seeds]
    for out, seed in runs:
        if seed is not None:
            log(f"seed {seed}")
        Trainer(_run_config(params, str(out), seed), log=log).fit(resume=resume)


def _train_outcome(params: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Each stage's precision as it ran (`auto` resolved), with `seeds` for each seed's run; and where
    each rank ran (host, Slurm node) in the last session (RunFolder.world)."""
    runs = RunFolder(folder).runs()
    single = len(runs) == 1 and runs[0].seed is None
    precision = runs[0].precisions() if single else {str(run.seed): run.precisions() for run in runs}
    ranks = runs[-1].world().get("ranks") if runs else None
    return {"precision": precision, **({"ranks": ranks} if ranks else {})}


def _verify_train(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    """Every input path, the device and the stages' precisions on it, and whether the model it starts
    from fits the vocabulary and the store."""
    from vlbert.utils.precision import TRAINING_PRECISIONS

    run = _run_config(params, CHECKED_OUT)
    problems = missing_paths(run.input_paths(), known)
    problems += device_problems(run.device, [stage.precision for stage in run.stages], known, TRAINING_PRECISIONS)
    return problems + _model_problems(run, known)


def _model_problems(run: RunConfig, known: Foreknown) -> list[str]:
    """The checkpoint the model starts from (init_from, else bert) against the vocabulary's size and
    the store's feature size, where all are known at load; a model built from scratch takes both."""
    start = run.start
    if start is None or not known.checkable(start[1]) or not Path(start[1]).is_dir():
        return []  # a missing one is named as such
    try:
        config = run.start_config()
    except RunConfigError as exc:
        return [str(exc)]
    problems = []
    vocabulary = known.vocabularies.get(Path(run.vocabulary), Path(run.vocabulary))
    if "vocab_size" in config and known.checkable(str(vocabulary)) and vocabulary.is_dir():
        problems += _vocabulary_problems(vocabulary, config["vocab_size"], start)
    feature_size = _store_feature_size(run.store, known)
    if start[0] == "init_from" and feature_size not in (None, config.get("visual_feature_size", feature_size)):
        problems.append(f"store: {run.store} holds {feature_size}-d features, the model of init_from {start[1]} "
                        f"takes visual_feature_size {config['visual_feature_size']}")
    return problems


def _vocabulary_problems(vocabulary: Path, vocab_size: Any, start: tuple[str, str]) -> list[str]:
    from vlbert.tokenization import check_vocabulary_size, load_tokenizer

    try:
        check_vocabulary_size(load_tokenizer(vocabulary), vocab_size, vocabulary)
    except (OSError, ValueError) as exc:  # VocabularyError among them
        return [f"vocabulary: {exc} (the model of {start[0]} {start[1]})"]
    return []


def _store_feature_size(store: str, known: Foreknown) -> int | None:
    """The store's feature size: from its extract step's detector, or from an existing store's meta.json."""
    from extract.store.layout import read_meta
    from extract.store.schema import StoreError

    if Path(store) in known.feature_sizes:
        return known.feature_sizes[Path(store)]
    if not known.checkable(store):
        return None
    try:
        return read_meta(Path(store))["features"]["dim"]
    except StoreError:
        return None  # a store that is not one is the trainer's to name, with the reason


KIND = StepKind(train, functools.partial(_run_config, out=CHECKED_OUT),
                field_names(RunConfig, *TRAIN_EXTRAS, leaving_out=("out",)), _verify_train,
                tuple(spec.name for spec in dataclasses.fields(StageConfig)), _run_outputs, _train_layout,
                outcome=_train_outcome)
