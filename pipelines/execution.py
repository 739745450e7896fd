"""Running one pipeline step: in this process, or in a process of its own that any executor starts.

A step's folder holds `step.json`: its kind, its parameters (references resolved), a digest of what
it reads (earlier steps' step.json, other input files), whether it is done, and how it ran (threads,
GPUs, executor, processes). A step is up to date when that record is done and its kind, parameters
and inputs are those of the step now; a step whose record matches but is not done resumes (its kind
continues from what it committed); any other step starts again from an empty folder (its log stays).
A record that exists but cannot be read (a read error, a damaged file) is an error naming it, never a
reason to start again: a finished step's folder is not emptied because a read failed. An input file's
digest is taken again only when its size or mtime differs from what the record noted with it.

In a process of its own (`vlbert pipeline step SPEC`), a step reads a `StepSpec` file: the step,
the part of it this process runs (all of it, one shard of an extraction, or the closing check of a
sharded one) and the thread count it was given. Several processes may begin one step at once (a
job array's shards, a DDP run's ranks): the decision to resume or start again is taken by the first
under a lock, and the others follow it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pipelines import STEP_FILE
from pipelines.steps import KINDS, Layout
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.errors import FAILED, UserError
from vlbert.utils.locks import holding
from vlbert.utils.paths import checked, output_folder
from vlbert.utils.records import read_record

LOG_FILE = "log.txt"
STATE_FOLDER = ".pipeline"  # under the pipeline's `out`: specs, locks, the executor's records
PROGRESS_FILE = ".progress{part}.json"
STAMPED = ("kind", "params", "inputs")  # what a step's record must match for its folder to hold the step
FILES = "input_files"  # in a step's record: the size and mtime of each input file its digest was taken at
LAUNCHER_VARIABLE = "TORCHELASTIC_RUN_ID"  # torch's launcher's run: its processes are one attempt

Log = Callable[[str], None]


class StepSpecError(UserError):
    """A step spec file that cannot be read."""


class RecordUnreadable(UserError):
    """A step's record (step.json) that exists but cannot be read: nothing is decided from it."""

    exit_status = FAILED


@dataclass(frozen=True)
class Step:
    name: str
    kind: str
    folder: Path
    params: dict[str, Any]  # references resolved
    reads: dict[str, Path]  # the earlier steps it refers to → their folders
    layout: Layout = field(default_factory=Layout)

    @property
    def state_folder(self) -> Path:
        return self.folder.parent / STATE_FOLDER

    @property
    def log_file(self) -> Path:
        return self.folder / LOG_FILE

    def progress_file(self, shard: int | None = None) -> Path:
        """Where the step's process (or shard's) publishes its progress (vlbert/utils/progress.py)."""
        return self.folder / PROGRESS_FILE.format(part="" if shard is None else f"-{shard}")


# ---- the record ----------------------------------------------------------------------------------

def stamp(step: Step, previous: dict | None = None) -> dict[str, Any]:
    """What decides whether the step's folder holds this step (STAMPED: kind, parameters, input
    digests), and the size and mtime of each input file, by which a later stamp takes the digest of
    a file unchanged since from `previous` (the folder's record) instead of reading it again."""
    files = input_files(step)
    known = previous.get("inputs") or {} if previous else {}
    seen = previous.get(FILES) or {} if previous else {}
    digests = {name: _digest(folder / STEP_FILE) for name, folder in step.reads.items()
               if (folder / STEP_FILE).is_file()}
    for path, size_and_mtime in files.items():
        unchanged = seen.get(path) == size_and_mtime and isinstance(known.get(path), str)
        digests[path] = known[path] if unchanged else _digest(Path(path))
    return {"kind": step.kind, "params": step.params, "inputs": digests, FILES: files}


def input_files(step: Step) -> dict[str, list[int]]:
    """Every existing file its parameters name outside the steps it reads → [size, mtime in ns], taken
    before its digest (a change while it is read then shows at the next look)."""
    files = {}
    for value in strings(step.params):
        path = Path(value)
        if path.is_file() and not any(path.is_relative_to(folder) for folder in step.reads.values()):
            info = path.stat()
            files[value] = [info.st_size, info.st_mtime_ns]
    return files


def read_stamp(folder: Path) -> dict | None:
    """The step's record; None where it has none yet. One that exists but cannot be read (a read error,
    a damaged file) is a RecordUnreadable naming it, so that nothing decides from it to start again."""
    return read_record(folder / STEP_FILE, "a step's record", RecordUnreadable, "; its folder was left as it is")


def write_stamp(folder: Path, record: dict) -> None:
    write_atomically(folder / STEP_FILE, json.dumps(record, indent=1))


def decide(step: Step, previous: dict | None, current: dict | None = None) -> str:
    """"done" (up to date), "resume" (this step, interrupted) or "start", from the folder's record
    `previous` (and the step's `stamp`, `current`, when it is at hand)."""
    current = current or stamp(step, previous)
    if previous is None or any(previous.get(key) != current[key] for key in STAMPED):
        return "start"
    return "done" if previous.get("done") else "resume"


def state(step: Step) -> str:
    """`decide` on the step's record as its folder holds it now."""
    return decide(step, read_stamp(step.folder))


def recorded(step: Step) -> dict:
    """How the step's last attempt ran (threads, devices, ...), or {}."""
    return read_stamp(step.folder) or {}


def _digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def strings(value: Any) -> Iterator[str]:
    return (text for _, text in named_strings(value))


def named_strings(value: Any, name: str = "") -> Iterator[tuple[str, str]]:
    """Every string in `value` (parameters: mappings and lists) with where it is: `stages[0].options.corpus`."""
    if isinstance(value, str):
        yield name, value
    elif isinstance(value, list):
        for index, v in enumerate(value):
            yield from named_strings(v, f"{name}[{index}]")
    elif isinstance(value, dict):
        for key, v in value.items():
            yield from named_strings(v, f"{name}.{key}" if name else str(key))


# ---- beginning and ending a step -----------------------------------------------------------------

def step_lock(step: Step):
    """Serialises the processes that begin one step (shards, ranks, a stale job and its requeued self)."""
    made_folder(step.state_folder)
    return holding(step.state_folder / f"{step.name}.lock")


def begin(step: Step, log: Log, how: dict[str, Any]) -> tuple[bool, dict[str, Any]] | None:
    """Decides, under the step's lock: None when the step is up to date; else (resume, the record it
    runs under), after emptying the folder (but its log) when it starts again. `how` (threads,
    devices, executor, attempt) is recorded; a resumed step keeps the threads it started with, which
    decide its last bits. The other processes of an attempt (shards, ranks) follow the first's decision."""
    output_folder(step.folder.parent)  # the pipeline's: its step folders must resolve inside it
    checked(step.folder)  # before it is emptied
    with step_lock(step):
        previous = read_stamp(step.folder)
        current = stamp(step, previous)
        decision = decide(step, previous, current)
        if decision == "done":
            log(f"[{step.name}] up to date")
            return None
        if decision == "resume" and previous.get("attempt") == how["attempt"]:
            return previous["resumed"], previous
        if decision == "resume":
            log(f"[{step.name}] resuming an interrupted run")
            how = {**how, "threads": resumed_threads(step) or how["threads"]}
        elif step.folder.exists():
            if previous is not None:
                log(f"[{step.name}] parameters or inputs changed: starting again")
            empty_but_log(step.folder)
        made_folder(step.folder)
        record = {**current, "done": False, "resumed": decision == "resume", "started_at": time.time(), **how}
        write_stamp(step.folder, record)
        return record["resumed"], record


def finish(step: Step, record: dict, log: Log) -> None:
    seconds = time.time() - record["started_at"]
    outcome = KINDS[step.kind].outcome(step.params, step.folder)
    write_stamp(step.folder, {**record, **outcome, "done": True, "seconds": round(seconds, 2)})
    log(f"[{step.name}] done in {seconds:.1f} s")


def empty_but_log(folder: Path) -> None:
    for path in folder.iterdir():
        if path.name == LOG_FILE:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def resumed_threads(step: Step) -> int | None:
    """The threads an interrupted step started with, which it resumes with: they decide its last bits."""
    threads = recorded(step).get("threads")
    return threads if isinstance(threads, int) else None


# ---- running in this process -----------------------------------------------------------------------

def run_here(step: Step, log: Log, executor: str, threads: int | None, attempt: str) -> None:
    """The whole step in this process, as `attempt` of `executor`, with `threads` (None: torch's current
    count); its messages also go to its log."""
    import torch

    from vlbert.utils.threads import configured_threads

    how = {"threads": threads or torch.get_num_threads(), "executor": executor, "host": socket.gethostname(),
           "attempt": attempt}
    decision = begin(step, log, how)
    if decision is None:
        return
    resume, record = decision
    with _teed(step, log) as step_log, configured_threads(record["threads"]):
        step_log(f"[{step.name}] {step.kind} ...")
        KINDS[step.kind].run(step.params, step.folder, resume, step_log)
    finish(step, record, log)


@contextmanager
def _teed(step: Step, log: Log) -> Iterator[Log]:
    with checked(step.log_file).open("a", encoding="utf-8") as file:
        def both(message: str) -> None:
            log(message)
            file.write(message + "\n")
            file.flush()

        yield both


# ---- running in a process of its own ---------------------------------------------------------------

@dataclass(frozen=True)
class StepSpec:
    """What `vlbert pipeline step SPEC` runs: a step, the executor that launches it, the part of it
    (`""`: all of it; `shard`: the shard given by the launcher; `close`: the check that ends a sharded
    step) and its threads."""

    step: Step
    executor: str
    threads: int
    part: str = ""

    def to_json(self) -> str:
        step = asdict(self.step)
        step["folder"] = str(self.step.folder)
        step["reads"] = {name: str(folder) for name, folder in self.step.reads.items()}
        return json.dumps({"step": step, "threads": self.threads, "part": self.part, "executor": self.executor},
                          indent=1)

    @classmethod
    def from_file(cls, path: Path) -> StepSpec:
        try:
            values = json.loads(Path(path).read_text())
            step = values["step"]
            return cls(Step(step["name"], step["kind"], Path(step["folder"]), step["params"],
                            {name: Path(folder) for name, folder in step["reads"].items()}, Layout(**step["layout"])),
                       values["executor"], values["threads"], values["part"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StepSpecError(f"{path}: not a step spec ({type(exc).__name__}: {exc})") from None

    def write(self) -> Path:
        path = self.step.state_folder / "specs" / f"{self.step.name}{'-' + self.part if self.part else ''}.json"
        made_folder(path.parent)
        write_atomically(path, self.to_json())
        return path


def run_spec(spec: StepSpec, shard: int | None = None, log: Log = print, attempt: str | None = None) -> None:
    """What a step's process does: begins the step (or follows the process of its attempt that did),
    runs it (or shard `shard` of it) with the threads given, and marks it done when that completes it;
    the `close` part checks a sharded step's shards and marks it done. A light step's process (a world,
    a report) loads no torch: one thread is all it computes with. `attempt`: the launch this process
    belongs to, as the environment its executor gave it says (base.Executor.attempt)."""
    step, kind = spec.step, KINDS[spec.step.kind]
    if spec.part == "close":
        kind.close(step.params, step.folder, log)
        finish(step, recorded(step), log)
        return
    rank, processes = _rank() if step.layout.ranks * step.layout.nodes > 1 else (0, 1)
    how = {"threads": spec.threads, "executor": spec.executor, "host": socket.gethostname(),
           "devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "attempt": attempt or _launcher_attempt(),
           **({"processes": processes} if processes > 1 else {})}
    decision = begin(step, log, how)
    if decision is None:
        return
    resume, record = decision
    sharded = {"shard": (shard, step.layout.shards)} if shard is not None else {}
    with nullcontext() if kind.light else _torch_threads(record["threads"]):
        if rank == 0:
            log(f"[{step.name}] {step.kind} ..." + (f" (shard {shard}/{step.layout.shards})" if sharded else ""))
        kind.run(step.params, step.folder, resume, log, **sharded)
    if not sharded and rank == 0:
        finish(step, record, log)


def _rank() -> tuple[int, int]:
    """(rank, world size) of this process of a DDP step, from its launcher's variables."""
    from train.engine.distributed import World

    world = World.from_env()
    return world.rank, world.size


def _torch_threads(threads: int):
    from vlbert.utils.threads import configured_threads

    return configured_threads(threads)


def new_attempt() -> str:
    return f"process={uuid.uuid4().hex}"


def _launcher_attempt() -> str:
    """The attempt of a process that no executor's environment names: torch's launcher's run (its ranks
    share it), else this process's own."""
    launcher = os.environ.get(LAUNCHER_VARIABLE)
    return f"{LAUNCHER_VARIABLE}={launcher}" if launcher else new_attempt()
