"""A training run's folder: the one module that names what a run writes there, for the trainer that
writes it and for the reports, pipeline steps, benches and tests that read it.

    run.json                        the resolved run config (another config is refused in this folder),
                                    under "world" its number of processes and every change of it, and
                                    under "precision" each stage's arithmetic (`auto` resolved), and
                                    under "mixture" (several train_annotations) each file's images,
                                    items and share of them, under "speed" each stage's workers,
                                    optimiser kernel and speed paths as they ran, and under
                                    "cpu_capabilities" the CPU kernel families that trained it
                                    (vlbert/utils/kernels.py), under "versions" the environments (package
                                    versions, CUDA, cuDNN: vlbert/utils/versions.py) that trained it
    train.lock                      held by the process that trains the run (its pid and host inside)
    metrics.jsonl                   one JSON object per optimiser step and per evaluation
    tensorboard/<i>-<name>/         the stage's TensorBoard scalars
    tracking.json                   the ids of the runs W&B and MLflow track it as (a resume continues them)
    stages/<i>-<name>/checkpoint-<step>/   model (save_pretrained), optimizer, scheduler, RNG state
    stages/<i>-<name>/final/        the stage's model; its presence marks the stage done
    stages/<i>-<name>/eval.json     the stage's evaluation
    stages/<i>-<name>/predictions/<split><suffix>  its predictions on each evaluated split, in the
                                    benchmark's format (the task gives the suffix)
    stages/<i>-<name>/item_scores/<split>.json     each evaluated item's score (bootstrap intervals
                                    and paired comparisons resample these)
    seed-<s>/                       a pipeline train step with `seeds`: one run folder per seed

Every file is written whole or not at all (`vlbert.utils.atomic.write_atomically`); model folders are
written beside their name and renamed into it. What a killed writer left of them (`temporaries`)
the next holder of the lock sweeps. A training run claims its folder here: `RunFolder.locked` holds
the lock, `RunFolder.claim` refuses another run's folder and records this one's.
"""

from __future__ import annotations

import json
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from train.engine.errors import RunConfigError, RunMismatchError
from vlbert.utils.atomic import made_folder, remove, temporaries, write_atomically
from vlbert.utils.errors import UserError
from vlbert.utils.kernels import CPU_CAPABILITIES, cpu_capability, with_capabilities
from vlbert.utils.locks import lock_holder, take_lock
from vlbert.utils.records import read_record
from vlbert.utils.versions import VERSIONS, environment_versions, with_environment

if TYPE_CHECKING:  # the reports and the light report step read run folders without torch
    import torch

    from train.engine.config import RunConfig
    from train.engine.distributed import World

_RUN_FILE = "run.json"
_WORLD = "world"  # run.json's record of the processes, beside the config's fields
_PRECISION = "precision"  # run.json's record of each stage's precision as its device resolved it
_MIXTURE = "mixture"  # run.json's record of the training files' items and shares, where there are several
_SPEED = "speed"  # run.json's record of each stage's speed settings on its machine
_LOCK = "train.lock"
_METRICS = "metrics.jsonl"
_TENSORBOARD = "tensorboard"
_TRACKING = "tracking.json"
_STAGES = "stages"
_SEED_RUN = re.compile(r"seed-(\d+)")
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


class RunFolderBusyError(UserError):
    """Another live process trains the run in this folder (it holds the folder's lock)."""


@dataclass(frozen=True)
class StageFolder:
    """stages/<i>-<name>/ of a run."""

    path: Path

    @property
    def key(self) -> str:
        """`<i>-<name>`: the stage's folder name, also its TensorBoard folder's."""
        return self.path.name

    @property
    def index(self) -> int:
        return int(self.key.split("-", 1)[0])

    @property
    def final(self) -> Path:
        return self.path / "final"

    @property
    def final_staging(self) -> Path:
        """Where the final model is written before it is renamed to `final`."""
        return self.path / "final.tmp"

    @property
    def done(self) -> bool:
        return self.final.is_dir()

    @property
    def evaluation_file(self) -> Path:
        return self.path / "eval.json"

    def evaluation(self) -> dict[str, Any]:
        return _record(self.evaluation_file, "a stage's evaluation")

    def write_evaluation(self, result: dict[str, Any]) -> None:
        write_atomically(self.evaluation_file, json.dumps(result, indent=1))

    @property
    def predictions_folder(self) -> Path:
        return self.path / "predictions"

    def predictions(self, split: str, suffix: str) -> Path:
        return self.predictions_folder / (split + suffix)

    def item_scores(self, split: str) -> Path:
        return self.path / "item_scores" / f"{split}.json"

    def checkpoint(self, step: int) -> Path:
        return self.path / f"checkpoint-{step}"

    def temporaries(self) -> list[Path]:
        """What writes killed in this stage's folder left: the final model, checkpoints and files being
        written under temporary names."""
        folders = [self.path, self.path / "item_scores", self.predictions_folder]
        return [*self.path.glob("checkpoint-*.tmp"), *self.path.glob(self.final_staging.name),
                *(path for folder in folders for path in temporaries(folder))]

    def checkpoints(self) -> list[Path]:
        """The stage's complete checkpoints, oldest first (one being written ends in .tmp)."""
        steps = sorted((int(match.group(1)), path) for path in self.path.glob("checkpoint-*")
                       if path.is_dir() and (match := _CHECKPOINT.fullmatch(path.name)))
        return [path for _, path in steps]

    def latest_checkpoint(self) -> Path | None:
        checkpoints = self.checkpoints()
        return checkpoints[-1] if checkpoints else None


@dataclass(frozen=True)
class RunFolder:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config_file(self) -> Path:
        return self.root / _RUN_FILE

    @property
    def is_run(self) -> bool:
        return self.config_file.is_file()

    def config(self) -> dict[str, Any]:
        """The run config recorded in run.json."""
        return {k: v for k, v in self._recorded().items()
                if k not in (_WORLD, _PRECISION, _MIXTURE, _SPEED, CPU_CAPABILITIES, VERSIONS)}

    def world(self) -> dict[str, Any]:
        """run.json's record of the processes: {"size": the latest session's, "ranks": where each of its
        ranks ran ([{"host", "node" (its Slurm node)}, ...], in rank order), "changes": [{"stage", "step",
        "from", "to", "learning_rate_scale"}, ...]}; {} for a run from before the record."""
        return self._recorded().get(_WORLD, {})

    def precisions(self) -> dict[str, str]:
        """run.json's record of each stage's precision as it ran (`auto` resolved: bf16, fp32);
        {} for a run from before the record."""
        return self._recorded().get(_PRECISION, {})

    def mixture(self) -> list[dict[str, Any]]:
        """run.json's record of a run on several training files: [{"file", "images", "items": {kind: n},
        "share": {kind: its share of that kind's items}}, ...]; [] for a run on one file."""
        return self._recorded().get(_MIXTURE, [])

    def cpu_capabilities(self) -> list[str] | None:
        """run.json's record of the CPU kernel families of every process that trained the run, in
        order of first use (torch's names: AVX512, AVX2, ...); None for a run from before the record."""
        return self._recorded().get(CPU_CAPABILITIES)

    def versions(self) -> list[dict[str, Any]]:
        """run.json's record of the environments that trained the run (`vlbert.utils.versions`: the project's,
        torch's, transformers', ... versions, CUDA and cuDNN), in order of first use; [] for a run from
        before the record."""
        return self._recorded().get(VERSIONS, [])

    def _recorded(self) -> dict[str, Any]:
        return _record(self.config_file, "a training run's record")

    def speed(self) -> dict[str, dict[str, Any]]:
        """run.json's record of each stage's speed settings as they ran (`train.engine.speed`): its
        workers, optimiser kernel, prefetch, compile, length_buckets, log_every, features_sent_as; {} for
        a run from before the record."""
        return self._recorded().get(_SPEED, {})

    def write_config(self, config: dict[str, Any], world: dict[str, Any] | None = None,
                     precisions: dict[str, str] | None = None, mixture: list[dict[str, Any]] | None = None,
                     speed: dict[str, dict[str, Any]] | None = None,
                     cpu_capabilities: list[str] | None = None, versions: list[dict[str, Any]] | None = None) -> None:
        """run.json: `config`, and `world` (see `world()`), `precisions`, `mixture`, `speed`,
        `cpu_capabilities` and `versions` (see theirs) when given."""
        made_folder(self.root)
        records = {name: value for name, value in ((_WORLD, world), (_PRECISION, precisions), (_MIXTURE, mixture),
                                                   (_SPEED, speed), (CPU_CAPABILITIES, cpu_capabilities),
                                                   (VERSIONS, versions)) if value}
        write_atomically(self.config_file, json.dumps({**config, **records}, indent=1))

    def write_world(self, world: dict[str, Any]) -> None:
        """run.json with `world` (see `world()`) in place of its record, every other entry kept."""
        write_atomically(self.config_file, json.dumps({**self._recorded(), _WORLD: world}, indent=1))

    @property
    def lock_file(self) -> Path:
        return self.root / _LOCK

    def temporaries(self) -> list[Path]:
        """What writes killed in this run folder left (`StageFolder.temporaries`, run.json's and
        metrics.jsonl's); a pipeline's files here are not the trainer's."""
        stages = [StageFolder(path) for path in sorted((self.root / _STAGES).glob("*")) if path.is_dir()]
        own = tuple(f".{name}." for name in (_RUN_FILE, _METRICS, _TRACKING))
        return [path for path in temporaries(self.root) if path.name.startswith(own)] \
            + [path for stage in stages for path in stage.temporaries()]

    @property
    def metrics_file(self) -> Path:
        return self.root / _METRICS

    def metrics(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.metrics_file.read_text().splitlines()]

    def tensorboard(self, stage: StageFolder) -> Path:
        return self.root / _TENSORBOARD / stage.key

    @property
    def tracking_file(self) -> Path:
        return self.root / _TRACKING

    def outputs(self) -> list[Path]:
        """What a run wrote and a restart removes; anything else here (a pipeline's step.json) stays."""
        return [path for path in (self.root / name for name in (_STAGES, _METRICS, _TENSORBOARD, _TRACKING, _RUN_FILE))
                if path.exists()]

    @contextmanager
    def locked(self, world: World) -> Iterator[None]:
        """Rank 0 holds the folder's lock for the block; every rank stops when another process holds it
        (RunFolderBusyError). The kernel releases it when rank 0 dies, so a requeued run takes it again."""
        from train.engine.distributed import from_rank_zero  # torch: only a training run claims its folder

        lock = None
        if world.rank == 0:
            made_folder(self.root)
            lock = take_lock(self.lock_file)
        busy = lock_holder(self.lock_file) if world.rank == 0 and lock is None else None
        busy = from_rank_zero(busy, world)
        if busy:
            raise RunFolderBusyError(f"{self.root}: another process is training this run ({busy}); it must "
                                     "end (or be stopped) before another can train here")
        try:
            yield
        finally:
            if lock is not None:
                lock.close()

    def claim(self, run: RunConfig, world: World, restart: bool, log: Callable[[str], None], *,
              precisions: dict[str, str], device: torch.device, mixture: list[dict[str, Any]] | None,
              speed: dict[str, dict[str, Any]]) -> None:
        """Refuses a folder holding a run with another config (or another precision of a stage:
        `precisions`, each stage's on `device`) unless `restart`, which removes that run's outputs; then
        records this config and this world's size (its result-neutral fields may have changed), with
        `mixture` and `speed` (see `write_config`), and removes what writes killed here left. Under
        the folder's lock (`locked`), on every rank of `world`."""
        from train.engine.distributed import barrier, gathered, placement  # torch: as in `locked`

        differences = self._differences(run, precisions, device) if self.is_run else []
        if differences and not restart:
            raise RunMismatchError(f"{self.root} holds a run with another config; pass restart=True (--restart) to "
                                   "discard it, or use another output folder:\n"
                                   + "\n".join(f"  {difference}" for difference in differences))
        barrier(world)  # every process has read the recorded config before rank 0 replaces it
        capabilities = gathered(cpu_capability(), world)
        ranks = gathered(placement(), world)  # where each rank runs: its host, its Slurm node
        if world.rank == 0:
            previous = self.cpu_capabilities() if self.is_run and not restart else []
            versions = self.versions() if self.is_run and not restart else []
            if restart:
                self._remove_outputs(log)
            changes = self.world().get("changes", []) if self.is_run else []
            processes = {"size": world.size, "ranks": ranks, "changes": changes}
            self.write_config(run.to_dict(), processes, precisions, mixture, speed,
                              with_capabilities(previous, capabilities),
                              with_environment(versions, environment_versions()))
            self._sweep_temporaries(log)
        barrier(world)

    def _differences(self, run: RunConfig, precisions: dict[str, str], device: torch.device) -> list[str]:
        """How `run`, its stages in `precisions` on `device`, differs from the run recorded here."""
        from train.engine.config import run_differences  # torch: as in `locked`

        recorded = self.precisions()
        return run_differences(self.config(), run) + [
            f"stages[{index}].precision: the run folder's stage {stage.name!r} ran in {recorded[stage.name]}, "
            f"{stage.precision} is {precisions[stage.name]} on {device}"
            for index, stage in enumerate(run.stages)
            if recorded.get(stage.name, precisions[stage.name]) != precisions[stage.name]]

    def _remove_outputs(self, log: Callable[[str], None]) -> None:
        previous = self.outputs()
        for path in previous:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        if previous:
            log(f"restart: removed the previous run's {', '.join(p.name for p in previous)} from {self.root}")

    def _sweep_temporaries(self, log: Callable[[str], None]) -> None:
        """Under the folder's lock no other process writes here: every temporary is a dead one's."""
        left = self.temporaries()
        remove(left)
        if left:
            log(f"removed what an interrupted write left in {self.root}: "
                + ", ".join(str(path.relative_to(self.root)) for path in left))

    def stage(self, index: int, name: str) -> StageFolder:
        return StageFolder(self.root / _STAGES / f"{index}-{name}")

    def stages(self) -> list[StageFolder]:
        """The stages run.json records, in order."""
        return [self.stage(i, stage["name"]) for i, stage in enumerate(self.config()["stages"])]

    def last_stage(self) -> StageFolder:
        return self.stages()[-1]

    def seed_run(self, seed: int) -> RunFolder:
        return RunFolder(self.root / f"seed-{seed}")

    def runs(self) -> list[RunFolder]:
        """This folder's runs: itself when it holds one, else its seed-<s>/ runs by seed (empty if none)."""
        if self.is_run:
            return [self]
        seeded = sorted((int(match.group(1)), RunFolder(path)) for path in self.root.glob("seed-*")
                        if (match := _SEED_RUN.fullmatch(path.name)) and RunFolder(path).is_run)
        return [run for _, run in seeded]

    @property
    def seed(self) -> int | None:
        """The seed of a seed-<s>/ run of a pipeline step; None for any other run."""
        match = _SEED_RUN.fullmatch(self.root.name)
        return int(match.group(1)) if match else None

    @staticmethod
    def of_final(path: str | Path) -> tuple[RunFolder, StageFolder] | None:
        """(the run, the stage) whose final model `path` is; None when it is not one."""
        stage = StageFolder(Path(path).parent)
        run = RunFolder(stage.path.parent.parent)
        if Path(path).name != "final" or stage.path.parent.name != _STAGES or not run.is_run:
            return None
        return run, stage


def _record(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in `path`; RunConfigError naming the file when it is missing or cannot be read."""
    record = read_record(path, what, RunConfigError)
    if record is None:
        raise RunConfigError(f"{path}: no such file ({what})")
    return record
