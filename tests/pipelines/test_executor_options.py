"""An executor's run options: `--set local.OPTION=VALUE` and `--set slurm.OPTION=VALUE` are its flags
(`--jobs`, `--threads`, `--wait`), a wrong key or value is one line before anything runs, and a step or
input named as an executor keeps its `--set NAME.FIELD`."""

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.executors.local import LocalExecutor, LocalOptions
from pipelines.executors.slurm import SlurmExecutor, SlurmOptions
from pipelines.runner import load_pipeline
from tests.helpers.pipelines import write_pipeline

LIGHT_STEPS = [{"name": "world", "kind": "world", "images": 3, "seed": 1},
               {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}]


@pytest.fixture
def given_options(monkeypatch) -> list:
    """The options each executor's `run` is given; nothing runs (nor is a Slurm cluster asked)."""
    given = []
    for executor in (LocalExecutor, SlurmExecutor):
        monkeypatch.setattr(executor, "run", lambda self, pipeline, log, options, status_stream=None:
                            given.append(options))
    monkeypatch.setattr(SlurmExecutor, "problems", lambda self, pipeline, options: [])
    return given


def pipeline_run(path, *arguments):
    return CliRunner().invoke(main, ["pipeline", "run", str(path), *arguments])


def test_set_executor_options_are_the_run_flags(given_options, tmp_path):
    path = write_pipeline(tmp_path, LIGHT_STEPS)
    runs = [["--jobs", "2", "--threads", "1"], ["--set", "local.jobs=2", "--set", "local.threads=1"],
            ["--executor", "slurm", "--wait", "--threads", "1"],
            ["--executor", "slurm", "--set", "slurm.wait=true", "--set", "slurm.threads=1"],
            ["--jobs", "2", "--set", "local.jobs=2"],  # the same value both ways
            ["--set", "slurm.wait=true"],  # another executor's option: not this run's
            ["--set", 'local.gpus=["7"]']]
    for arguments in runs:
        assert pipeline_run(path, *arguments).exit_code == 0, arguments
    assert given_options == [LocalOptions(jobs=2, threads=1)] * 2 + [SlurmOptions(wait=True, threads=1)] * 2 + [
        LocalOptions(jobs=2), LocalOptions(jobs=None), LocalOptions(jobs=None, gpus=("7",))]


def test_a_wrong_option_key_or_value_is_one_line_before_anything_runs(given_options, tmp_path):
    path = write_pipeline(tmp_path, LIGHT_STEPS)
    refused = {("--set", "local.job=2"): f"{path}: --set local.job: not an option of the local executor (did you mean "
                                         "'jobs'?); its options: jobs (launches at once; 1: one after another in this "
                                         "process, null: as many as the cores and GPUs allow); threads (CPU threads of "
                                         "every step's processes; null: the free cores shared among the steps "
                                         "starting); gpus (the GPUs to hand out; null: CUDA_VISIBLE_DEVICES, else "
                                         "every GPU torch sees)",
               ("--set", "local.jobs=two"): f"{path}: --set local.jobs: expected an integer, found 'two'",
               ("--set", "local.jobs=0"): f"{path}: jobs 0: expected a positive number of steps at once",
               ("--jobs", "2", "--set", "local.jobs=3"): f"{path}: --jobs 2 and --set local.jobs=3: the same option "
                                                         "given twice; give one of them",
               ("--executor", "slurm", "--set", "slurm.wait=maybe"): f"{path}: --set slurm.wait: expected true or "
                                                                     "false, found 'maybe'"}
    for arguments, line in refused.items():
        result = pipeline_run(path, *arguments)
        assert (result.exit_code, result.output) == (2, f"Error: {line}\n"), arguments
    assert given_options == [] and not (tmp_path / "out").exists()


def test_a_step_named_as_an_executor_keeps_its_set_fields(tmp_path):
    path = write_pipeline(tmp_path, [{"name": "local", "kind": "world", "images": 3, "seed": 1}])
    assert load_pipeline(path, {"local.images": 4}).steps[0].params["images"] == 4
