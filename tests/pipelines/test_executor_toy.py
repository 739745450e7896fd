"""A third executor is one class and one registration: the toy one below runs every step in this process,
in order, with run options of its own (`ToyOptions`) and a settings section (`toy:`); registered into
EXECUTORS for the test, it runs a pipeline to done, `status` reads it, and nothing else names it."""

from dataclasses import dataclass, field

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.execution import run_here
from pipelines.executors import EXECUTORS, executor_of
from pipelines.executors.base import CannotRun, Executor, Launch, State, read_state, updating_state
from pipelines.runner import PipelineError, load_run, run_pipeline
from tests.helpers.pipelines import step_record, write_pipeline

LIGHT_STEPS = [{"name": "world", "kind": "world", "images": 3, "seed": 1},
               {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}]


@dataclass(frozen=True)
class ToyOptions:
    threads: int | None = field(default=None, metadata={"help": "CPU threads of every step"})
    label: str = field(default="", metadata={"help": "what the state file records of the run"})


class InThisProcess(Executor):
    """Every step in this process, one after another; `note` is its one setting (section `toy`)."""

    name = "toy"
    section = "toy"
    options = ToyOptions

    def problems(self, pipeline, options: ToyOptions) -> list[str]:
        return [f"step {step.name!r}: shards run elsewhere" for step in pipeline.steps if step.layout.shards > 1]

    def run(self, pipeline, log, options: ToyOptions, status_stream=None) -> None:
        with updating_state(pipeline.out) as records:
            records.clear()
            records.update(executor=self.name, label=options.label,
                           note=pipeline.executor_settings[self.section].get("note"), steps={})
        for step in pipeline.steps:
            run_here(step, log, self.name, options.threads, "toy=1")

    def launches(self, pipeline) -> tuple[dict[str, Launch], bool]:
        return {}, False

    def cancel(self, pipeline, log) -> None:
        log("nothing runs after `run` returns")

    def attempt(self) -> str | None:
        return None


EXECUTOR = InThisProcess()


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(EXECUTORS, "toy", __name__)


def test_a_third_executor_runs_a_pipeline_to_done_with_its_own_options_and_settings(toy, tmp_path):
    path = write_pipeline(tmp_path, LIGHT_STEPS, toy={"note": "from the file"})
    out = run_pipeline(path, log=lambda _: None, settings={"toy.note": "given", "toy.label": "first"},
                       executor="toy", threads=1)
    assert read_state(out) == {"executor": "toy", "label": "first", "note": "given", "steps": {}}
    assert step_record(out, "world")["executor"] == "toy" and step_record(out, "world")["threads"] == 1
    rows = executor_of(out).status(load_run(path))
    assert [(row.step, row.state) for row in rows] == [("world", State.DONE), ("vocabulary", State.DONE)]
    shown = CliRunner().invoke(main, ["pipeline", "status", str(path)])
    assert (shown.exit_code, shown.output) == (0, "world       done\nvocabulary  done\n")


def test_a_third_executor_s_options_are_checked_before_anything_runs(toy, tmp_path):
    path = write_pipeline(tmp_path, LIGHT_STEPS)
    with pytest.raises(CannotRun, match="^jobs: not an option of the toy executor$"):
        run_pipeline(path, log=lambda _: None, executor="toy", jobs=2)
    with pytest.raises(PipelineError) as refused:
        run_pipeline(path, log=lambda _: None, settings={"toy.threads": "two"}, executor="toy")
    assert str(refused.value) == f"{path}: --set toy.threads: expected an integer, found 'two'"
    with pytest.raises(PipelineError) as refused:
        run_pipeline(path, log=lambda _: None, settings={"toy.threads": 2}, executor="toy", threads=1)
    assert str(refused.value) == (f"{path}: --threads 1 and --set toy.threads=2: the same option given twice; "
                                  "give one of them")
    assert not (tmp_path / "out").exists()
