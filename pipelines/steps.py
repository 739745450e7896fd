"""The kinds of pipeline step, a registry of `StepKind` records.

A kind's `run(params, folder, resume, log)` does the step into its own folder. When the pipeline
loads, before any step runs, its `check(params)` validates the parameters (reading no file; it
raises RunConfigError naming the key at fault), then its `verify(params, folder, known)` lists
every problem with what the step would read: input paths that do not exist (those inside an
earlier step's folder excepted), the device and precision, the detector, a vocabulary that does
not fit the model it starts from, a store whose feature size is not the model's. `verify` also
records in `known` what its folder will hold (an extract step's feature size). `check` and `run`
go through one parsing function per kind (vlbert.typed_config's loader, as every config: known names,
required ones, types, `1e-5` read as the number it spells), so what was checked is what runs;
`fields(params)` names what `--set STEP.FIELD` may set, `stage_fields` what `STEP.STAGE.FIELD` may.
`layout(params)` says how many processes a step runs as (an extraction's shards, a training's DDP
ranks and nodes) and whether each takes a GPU; a sharded kind's `close` checks, after every shard,
that the step is complete.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import json
import operator
import shutil
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from train.engine.config import SEEDS, RunConfig, RunConfigError, StageConfig
from train.engine.run_folder import RunFolder
from vlbert.typed_config import at_least, describe, did_you_mean, from_mapping

Log = Callable[[str], None]

# Stands for the step's folder where parameters are checked without running the step.
CHECKED_OUT = "(the step's folder)"


@dataclass
class Foreknown:
    """What the pipeline knows at load about the folders its steps will write, and which values wait
    for an input without a value yet (the load checks leave both out)."""

    step_folders: list[Path] = dataclasses.field(default_factory=list)  # the earlier steps'
    feature_sizes: dict[Path, int] = dataclasses.field(default_factory=dict)  # store folder → its detector's
    vocabularies: dict[Path, Path] = dataclasses.field(default_factory=dict)  # vocabulary step → the folder it copies
    unset: tuple[str, ...] = ()  # `${inputs.NAME}` of inputs without a value

    def checkable(self, value: Any) -> bool:
        """Whether `value` is a given value that names no earlier step's output."""
        if not isinstance(value, str) or any(marker in value for marker in self.unset):
            return False
        path = Path(value).absolute()
        return not any(path.is_relative_to(folder.absolute()) for folder in self.step_folders)


Verify = Callable[[dict[str, Any], Path, Foreknown], list[str]]


def _nothing_to_verify(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    return []


def _no_outputs(params: dict[str, Any], folder: Path) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Layout:
    """The processes a step runs as: `shards` independent ones (each `shard=(i, shards)`), or one run of
    `ranks` processes on each of `nodes` machines (DDP); `gpu`: each process takes a GPU where the
    machine has some (device cuda, or auto)."""

    shards: int = 1
    ranks: int = 1
    nodes: int = 1
    gpu: bool = False

    @property
    def processes(self) -> int:
        return self.shards * self.ranks * self.nodes


def _single_process(params: dict[str, Any]) -> Layout:
    return Layout()


def _takes_gpu(device: Any) -> bool:
    return isinstance(device, str) and (device == "auto" or device.startswith("cuda"))


@dataclass(frozen=True)
class StepKind:
    # (params, folder, resume, log) and, for a kind whose layout has shards, shard=(i, n)
    run: Callable[..., None]
    check: Callable[[dict[str, Any]], object]  # its value is unused: it raises RunConfigError or nothing
    fields: Callable[[dict[str, Any]], list[str]]  # the parameters a step of this kind takes
    verify: Verify = _nothing_to_verify
    stage_fields: tuple[str, ...] = ()  # a train step's stages: what STEP.STAGE.FIELD may set
    # What later steps may name beyond the step's folder: `${STEP.NAME}` → a path in it.
    outputs: Callable[[dict[str, Any], Path], dict[str, str]] = _no_outputs
    layout: Callable[[dict[str, Any]], Layout] = _single_process
    # (params, folder, log): after every shard of a sharded step, a problem with the whole is an error
    close: Callable[[dict[str, Any], Path, Log], None] | None = None
    # Seconds of one thread's work (a world, a vocabulary, a report): such a step runs beside the others
    # with one thread and leaves the cores to the heavy steps that start with it.
    light: bool = False
    # (params, folder) → what the step's step.json records once it is done (a train step: each stage's
    # precision as its device resolved it)
    outcome: Callable[[dict[str, Any], Path], dict[str, Any]] = lambda params, folder: {}


def _parse(cls: type, params: dict[str, Any]) -> Any:
    """`params` as an instance of dataclass `cls`, checked field by field."""
    return from_mapping(cls, params, error=RunConfigError)


def _registered(params: dict[str, Any], key: str, registry: Iterable[str]) -> str:
    """`params[key]`, a name in `registry` (a step's source or benchmark), else RunConfigError naming it."""
    name, known = params.get(key), sorted(registry)
    if not isinstance(name, str):
        raise RunConfigError(f"{key}: expected one of {', '.join(known)}, found {describe(name)}")
    if name not in known:
        raise RunConfigError(f"{key}: {name!r} is not one of {', '.join(known)}{did_you_mean(name, known)}")
    return name


def _field_names(cls: type, *extra: str, leaving_out: tuple[str, ...] = ()) -> Callable[[dict[str, Any]], list[str]]:
    """The `fields` of a kind whose parameters are dataclass `cls`'s fields (and `extra`)."""
    return lambda params: [f.name for f in dataclasses.fields(cls) if f.name not in leaving_out] + list(extra)


def missing_paths(named: Iterable[tuple[str, Any]], known: Foreknown) -> list[str]:
    """A problem for each (field, path) whose given path does not exist."""
    return [f"{name}: {path} does not exist" for name, path in named
            if path is not None and known.checkable(path) and not Path(path).exists()]


def _device_problems(device: str, precisions: Iterable[str], known: Foreknown,
                     allowed: dict[str, Any] | None = None) -> list[str]:
    """The device's problem on this machine, else those of the precisions run on it."""
    from extract.device import DeviceError, check_device
    from extract.modeling.precision import PRECISIONS, PrecisionError, precision, resolved_precision

    if not known.checkable(device):
        return []
    try:
        checked = check_device(device)
    except DeviceError as exc:
        return [str(exc)]
    problems = []
    for name in dict.fromkeys(precisions):
        try:
            precision(resolved_precision(name, checked), allowed or PRECISIONS).check(checked)
        except PrecisionError as exc:
            problems.append(str(exc))
    return problems


# ---- world ---------------------------------------------------------------------------------------

@dataclass
class WorldParams:
    images: int = dataclasses.field(default=1000, metadata=at_least(1))
    seed: int = dataclasses.field(default=0, metadata=SEEDS)


def world(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """The synthetic demo world: images, train/val annotations, corpus.txt."""
    from pipelines.world import generate_world

    chosen = _parse(WorldParams, params)
    generate_world(folder, chosen.images, chosen.seed)


# ---- extract -------------------------------------------------------------------------------------

# How a pipeline file (YAML) spells the types of run_extraction's parameters.
_YAML_TYPES: dict[Any, type] = {Path: str, collections.abc.Mapping: dict, tuple: list}


def _yaml_type(hint: Any) -> Any:
    """`hint` with every member spelled as YAML gives it: `str | Path | None` → `str | None`."""
    union = typing.get_origin(hint) in (types.UnionType, typing.Union)
    members = [typing.get_origin(arg) or arg for arg in (typing.get_args(hint) if union else (hint,))]
    return functools.reduce(operator.or_, dict.fromkeys(_YAML_TYPES.get(m, m) for m in members))


@dataclass
class ExtractExtras:
    """An extract step's keys beyond run_extraction's parameters."""

    # processes (array jobs under Slurm), each extracting `shard=(i, shards)` into the store
    shards: int = dataclasses.field(default=1, metadata=at_least(1))


EXTRACT_EXTRAS = tuple(spec.name for spec in dataclasses.fields(ExtractExtras))


@functools.cache
def _extraction_params() -> type:
    """A dataclass of run_extraction's parameters but `out` (the step's folder), and ExtractExtras, so
    that a new option of the job is a step option without a change here."""
    from extract.job import run_extraction

    hints = typing.get_type_hints(run_extraction)
    fields = [(p.name, _yaml_type(hints[p.name]))
              + (() if p.default is inspect.Parameter.empty else (dataclasses.field(default=p.default),))
              for p in inspect.signature(run_extraction).parameters.values() if p.name != "out"]
    fields += [(spec.name, spec.type, dataclasses.field(default=spec.default, metadata=spec.metadata))
               for spec in dataclasses.fields(ExtractExtras)]
    return dataclasses.make_dataclass("ExtractParams", fields)


def _extraction_options(params: dict[str, Any]) -> dict[str, Any]:
    """run_extraction's arguments (without ExtractExtras), typed and in range (as run_extraction checks them)."""
    from extract.job import JobError, check_arguments

    chosen = dataclasses.asdict(_parse(_extraction_params(), params))
    if chosen["shards"] > 1 and chosen["shard"] is not None:
        raise RunConfigError("shard and shards: give one (shards runs every shard, each in a process of its own)")
    options = {name: value for name, value in chosen.items() if name not in EXTRACT_EXTRAS}
    try:
        check_arguments(options)
    except JobError as exc:
        raise RunConfigError(str(exc)) from None
    return options


def _extract_layout(params: dict[str, Any]) -> Layout:
    shards = params.get("shards", 1)
    return Layout(shards=shards if isinstance(shards, int) else 1, gpu=_takes_gpu(params.get("device", "cpu")))


def extract(params: dict[str, Any], folder: Path, resume: bool, log: Log, shard: tuple[int, int] | None = None) -> None:
    """A FeatureStore of every image under `images` (resumes by itself); with `shard`, that shard's."""
    from extract.job import run_extraction

    options = _extraction_options(params)
    if shard is not None:
        options["shard"] = shard
    log(run_extraction(out=folder, **options).report())


def _close_extract(params: dict[str, Any], folder: Path, log: Log) -> None:
    """After every shard: each image of the job is in the store or among its failures."""
    from extract.job import ExtractionIncomplete, images_not_in_store

    options = _extraction_options(params)
    missing = images_not_in_store(options["images"], folder, options["boxes"], options["image_list"])
    if missing:
        raise ExtractionIncomplete(f"{folder}: {len(missing)} image(s) of the job are neither stored nor failures "
                                   f"(e.g. {missing[0]!r}): a shard stopped early; run the step again to finish them")
    log(f"{folder}: every shard complete")


def _verify_extract(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    """Paths, device and precision, and the detector: a preset or a YAML file of ours (whose feature
    size the store will have), or another backend's config file (`d2:CONFIG.yaml`)."""
    from extract.backends import BACKENDS
    from extract.config import ConfigError
    from extract.presets import load_config

    options = _extraction_options(params)
    problems = missing_paths([(name, options[name]) for name in ("images", "weights", "boxes", "image_list")], known)
    problems += _device_problems(options["device"], [options["precision"]], known)
    detector = options["detector"]
    prefix = next(backend.prefix for backend in BACKENDS if detector.startswith(backend.prefix))
    if prefix:
        return problems + missing_paths([("detector", detector[len(prefix):])], known)
    if known.checkable(detector):
        try:
            known.feature_sizes[folder] = load_config(detector, options["overrides"]).feature_dim
        except ConfigError as exc:
            problems.append(str(exc))  # it names the detector
    return problems


# ---- vocabulary ----------------------------------------------------------------------------------

# What a tokenizer folder may hold (BertTokenizerFast.from_pretrained reads them); vocab.txt is needed.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json")


@dataclass
class VocabularyParams:
    """One of: `world`, a demo world's words; `given`, a tokenizer folder (a BERT checkpoint's) copied
    as it is; `texts`, annotation .jsonl and plain text files from which a WordPiece vocabulary of at
    most `size` pieces is built (when `given` is null, so that one file serves both)."""

    world: str | None = None
    given: str | None = None
    texts: list[str] = dataclasses.field(default_factory=list)
    size: int = dataclasses.field(default=30522, metadata=at_least(1))
    min_frequency: int = dataclasses.field(default=2, metadata=at_least(1))
    lowercase: bool = True


def _vocabulary_params(params: dict[str, Any]) -> VocabularyParams:
    chosen = _parse(VocabularyParams, params)
    if chosen.world is not None and (chosen.given is not None or chosen.texts):
        raise RunConfigError("world: a world's vocabulary is its words; give `world` without `given` and `texts`")
    if chosen.world is None and chosen.given is None and not chosen.texts:
        raise RunConfigError("give `world` (a demo world), `given` (a tokenizer folder) or `texts` "
                             "(annotation or text files to build a WordPiece vocabulary from)")
    return chosen


def vocabulary(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A world's words, a given tokenizer's files, or a WordPiece vocabulary built from `texts`."""
    chosen = _vocabulary_params(params)
    if chosen.world is not None:
        from train.data.vocabulary import write_world_vocabulary

        write_world_vocabulary(chosen.world, folder)
    elif chosen.given is not None:
        for name in TOKENIZER_FILES:
            if (Path(chosen.given) / name).is_file():
                shutil.copyfile(Path(chosen.given) / name, folder / name)
        log(f"vocabulary: {chosen.given}'s tokenizer")
    else:
        from train.data.wordpiece import build_vocabulary

        build_vocabulary([Path(text) for text in chosen.texts], folder, chosen.size, chosen.min_frequency,
                         chosen.lowercase, log)


def _verify_vocabulary(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    chosen = _vocabulary_params(params)
    problems = missing_paths([("world", chosen.world), ("given", chosen.given),
                              *((f"texts[{i}]", text) for i, text in enumerate(chosen.texts))], known)
    if chosen.given is not None and known.checkable(chosen.given) and not problems:
        if not (Path(chosen.given) / "vocab.txt").is_file():
            problems.append(f"given: {chosen.given} holds no vocab.txt (a tokenizer folder, e.g. a BERT checkpoint's)")
        known.vocabularies[folder] = Path(chosen.given)
    return problems


# ---- train ---------------------------------------------------------------------------------------

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
    return _parse(TrainExtras, {k: v for k, v in params.items() if k in TRAIN_EXTRAS})


def _train_layout(params: dict[str, Any]) -> Layout:
    extras = _train_extras(params)
    return Layout(ranks=extras.devices, nodes=extras.nodes, gpu=_takes_gpu(params.get("device", "cpu")))


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
    """Each stage's precision as it ran (`auto` resolved); with `seeds`, for each seed's run."""
    runs = RunFolder(folder).runs()
    if len(runs) == 1 and runs[0].seed is None:
        return {"precision": runs[0].precisions()}
    return {"precision": {str(run.seed): run.precisions() for run in runs}}


def _verify_train(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    """Every input path, the device and the stages' precisions on it, and whether the model it starts
    from fits the vocabulary and the store."""
    from extract.modeling.precision import TRAINING_PRECISIONS

    run = _run_config(params, CHECKED_OUT)
    problems = missing_paths(run.input_paths(), known)
    problems += _device_problems(run.device, [stage.precision for stage in run.stages], known, TRAINING_PRECISIONS)
    return problems + _model_problems(run, known)


def _model_problems(run: RunConfig, known: Foreknown) -> list[str]:
    """The checkpoint the model starts from (init_from, else bert) against the vocabulary's size and
    the store's feature size, where all are known at load; a model built from scratch takes both."""
    start = run.start
    if start is None or not known.checkable(start[1]) or not Path(start[1]).is_dir():
        return []  # a missing one is named as such
    config, problem = _checkpoint_config(*start)
    if problem is not None:
        return [problem]
    problems = []
    vocabulary = known.vocabularies.get(Path(run.vocabulary), Path(run.vocabulary))
    if "vocab_size" in config and known.checkable(str(vocabulary)) and vocabulary.is_dir():
        problems += _vocabulary_problems(vocabulary, config["vocab_size"], start)
    feature_size = _store_feature_size(run.store, known)
    if start[0] == "init_from" and feature_size not in (None, config.get("visual_feature_size", feature_size)):
        problems.append(f"store: {run.store} holds {feature_size}-d features, the model of init_from {start[1]} "
                        f"takes visual_feature_size {config['visual_feature_size']}")
    return problems


def _checkpoint_config(field_name: str, folder: str) -> tuple[dict[str, Any], str | None]:
    """The config.json of a VL-BERT (save_pretrained) or BERT (transformers) checkpoint, or its problem."""
    from vlbert.modeling import CONFIG_NAME

    path = Path(folder) / CONFIG_NAME
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, f"{field_name}: {folder} holds no {CONFIG_NAME}; expected a checkpoint folder"
    except (OSError, ValueError) as exc:
        return {}, f"{field_name}: {path} is not readable JSON ({exc})"
    if not isinstance(config, dict):
        return {}, f"{field_name}: {path} is not a JSON object"
    return config, None


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


# ---- prepare -------------------------------------------------------------------------------------

@dataclass
class PrepareParams:
    """`vlbert data prepare`'s arguments; a prepare step's other keys are its source's options."""

    source: str
    root: str
    images: str | None = None
    max_missing: float | None = None


def _preparation(params: dict[str, Any]) -> tuple[PrepareParams, dict[str, Any]]:
    """The checked arguments and the source's options given, checked as train/data/sources declares them."""
    from train.data.sources import SOURCES

    declared = SOURCES[_registered(params, "source", SOURCES)].options
    fields = [(option.name, (str if option.type is Path else option.type) | None, dataclasses.field(default=None))
              for option in declared]
    chosen = _parse(dataclasses.make_dataclass("SourceParams", fields, bases=(PrepareParams,)), params)
    options = {option.name: getattr(chosen, option.name) for option in declared
               if getattr(chosen, option.name) is not None}
    for option in declared:
        if option.minimum is not None and options.get(option.name, option.minimum) < option.minimum:
            raise RunConfigError(f"{option.name}: expected at least {option.minimum}, found {options[option.name]}")
    return chosen, options


def _prepare_fields(params: dict[str, Any]) -> list[str]:
    from train.data.sources import SOURCES

    source = SOURCES.get(params["source"]) if isinstance(params.get("source"), str) else None
    return [spec.name for spec in dataclasses.fields(PrepareParams)] + [o.name for o in (source.options if source else ())]


def _verify_prepare(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    chosen, _ = _preparation(params)
    return missing_paths([("root", chosen.root), ("images", chosen.images)], known)


def prepare(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """A published dataset prepared into the project's annotation files (starts again when resumed)."""
    from train.data.prepare import prepare_dataset
    from train.data.sources import SOURCES

    chosen, options = _preparation(params)
    prepare_dataset(SOURCES[chosen.source], chosen.root, folder, chosen.images, chosen.max_missing, log, **options)


# ---- evaluate ------------------------------------------------------------------------------------

@functools.cache
def _evaluation_params(benchmark: str) -> type:
    """The dataclass of an evaluate step's parameters for `benchmark`: its name and the record's inputs
    (strings, as YAML spells paths)."""
    from train.evaluation.benchmarks import BENCHMARKS

    fields = [("benchmark", str)]
    for spec in sorted(BENCHMARKS[benchmark].inputs, key=lambda spec: not spec.required):  # defaults last
        kind = list[str] if spec.multiple else str
        fields.append((spec.name, kind) if spec.required else (spec.name, kind | None, dataclasses.field(default=None)))
    return dataclasses.make_dataclass("EvaluateParams", fields)


def _evaluation(params: dict[str, Any]) -> Any:
    """`vlbert evaluate BENCHMARK`'s inputs, as train/evaluation/benchmarks.py declares them."""
    from train.evaluation.benchmarks import BENCHMARKS

    name = _registered(params, "benchmark", BENCHMARKS)
    chosen = _parse(_evaluation_params(name), params)
    empty = [spec.name for spec in BENCHMARKS[name].inputs if spec.multiple and getattr(chosen, spec.name) == []]
    if empty:
        raise RunConfigError(f"benchmark {name}: needs {', '.join(empty)}")
    return chosen


def _evaluate_fields(params: dict[str, Any]) -> list[str]:
    from train.evaluation.benchmarks import BENCHMARKS

    benchmark = BENCHMARKS.get(params["benchmark"]) if isinstance(params.get("benchmark"), str) else None
    return ["benchmark", *(spec.name for spec in (benchmark.inputs if benchmark else ()))]


def _input_paths(chosen: Any) -> list[tuple[str, Any]]:
    """(name, path) of each file and folder input given."""
    from train.evaluation.benchmarks import BENCHMARKS

    named = []
    for spec in BENCHMARKS[chosen.benchmark].inputs:
        value = getattr(chosen, spec.name)
        if spec.kind != "text":
            named += [(f"{spec.name}[{i}]", v) for i, v in enumerate(value)] if spec.multiple else [(spec.name, value)]
    return named


def _verify_evaluate(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    return missing_paths(_input_paths(_evaluation(params)), known)


def evaluate(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """Predictions scored as `vlbert evaluate` scores them, into scores.json."""
    from extract.atomic import write_atomically
    from train.evaluation.benchmarks import BENCHMARKS

    chosen = _evaluation(params)
    scores = BENCHMARKS[chosen.benchmark].score(dataclasses.asdict(chosen), folder)
    write_atomically(folder / "scores.json", json.dumps(scores, indent=1))
    log(f"{chosen.benchmark}: {json.dumps(scores)}")


# ---- report --------------------------------------------------------------------------------------

@dataclass
class ReportParams:
    runs: list[str]
    compare: list[list[str]] = dataclasses.field(default_factory=list)  # pairs [A, B]: B − A
    baseline: str | None = None  # every other run against it

    def pairs(self) -> list[tuple[str, str]]:
        against = [(self.baseline, run) for run in self.runs if run != self.baseline] if self.baseline else []
        return list(dict.fromkeys([*(tuple(pair) for pair in self.compare), *against]))


def report_params(params: dict[str, Any]) -> ReportParams:
    """The report's parameters; the runs that `compare` and `baseline` name must be among `runs`."""
    chosen = _parse(ReportParams, params)
    for index, pair in enumerate(chosen.compare):
        if len(pair) != 2:  # the loader checked that it is a list of strings
            raise RunConfigError(f"compare[{index}]: expected a pair [RUN_A, RUN_B] of run folders, found {pair!r}")
    named = [(f"compare[{i}][{j}]", run) for i, pair in enumerate(chosen.compare) for j, run in enumerate(pair)]
    for where, run in named + ([("baseline", chosen.baseline)] if chosen.baseline else []):
        if run not in chosen.runs:
            raise RunConfigError(f"{where}: {run} is not one of `runs`")
    return chosen


def report(params: dict[str, Any], folder: Path, resume: bool, log: Log) -> None:
    """report.json, report.md and the loss curves of `runs`, with paired comparisons (`compare`, `baseline`)."""
    from pipelines.report import write_report

    chosen = report_params(params)
    for path in write_report(chosen.runs, folder, chosen.pairs()):
        log(f"wrote {path.resolve()}")


def _verify_report(params: dict[str, Any], folder: Path, known: Foreknown) -> list[str]:
    return missing_paths([(f"runs[{i}]", run) for i, run in enumerate(report_params(params).runs)], known)


KINDS: dict[str, StepKind] = {
    "world": StepKind(world, functools.partial(_parse, WorldParams), _field_names(WorldParams), light=True),
    "prepare": StepKind(prepare, _preparation, _prepare_fields, _verify_prepare, light=True),
    "extract": StepKind(extract, _extraction_options, lambda params: _field_names(_extraction_params())(params),
                        _verify_extract, layout=_extract_layout, close=_close_extract),
    "vocabulary": StepKind(vocabulary, _vocabulary_params, _field_names(VocabularyParams), _verify_vocabulary,
                           light=True),
    "train": StepKind(train, functools.partial(_run_config, out=CHECKED_OUT),
                      _field_names(RunConfig, *TRAIN_EXTRAS, leaving_out=("out",)), _verify_train,
                      tuple(spec.name for spec in dataclasses.fields(StageConfig)), _run_outputs, _train_layout,
                      outcome=_train_outcome),
    "evaluate": StepKind(evaluate, _evaluation, _evaluate_fields, _verify_evaluate, light=True),
    "report": StepKind(report, report_params, _field_names(ReportParams), _verify_report, light=True),
}
