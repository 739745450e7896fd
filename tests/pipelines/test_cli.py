"""The `vlbert` command's handling of errors: one line and an exit status for what users cause,
the traceback on request, and the traceback for anything else."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import pipelines.commands.cache
from extract.checkpoint import CheckpointError
from extract.config import ConfigError
from extract.detector import BoxError
from extract.images import ImageError
from extract.job import JobError
from extract.store.schema import DamagedRecordError, StoreError, StoreMismatchError
from extract.synthetic import write_synthetic_images
from pipelines.cli import main
from pipelines.runner import PipelineError, StepFailed
from train.data.files import DataError
from train.engine.config import RunConfigError, RunMismatchError
from vlbert.tokenization import VocabularyError
from vlbert.utils.device import DeviceError, StickyDeviceError
from vlbert.utils.errors import FAILED, USAGE, UserError, exit_status
from vlbert.utils.precision import PrecisionError


def run(*args: str, **env: str):
    return CliRunner().invoke(main, list(args), env=env)


def test_an_expected_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    result = run("cache", "info", str(tmp_path))
    assert result.exit_code == 1 and result.output == f"Error: {tmp_path}: not a FeatureStore (no meta.json)\n"
    for debug in (run("--debug", "cache", "info", str(tmp_path)), run("cache", "info", str(tmp_path), VLBERT_DEBUG="1")):
        assert debug.exit_code == 1 and "Error:" not in debug.output
        assert "not a FeatureStore" in str(debug.exception)  # raised, so click's runner keeps the traceback


def test_bad_usage_exits_with_2(tmp_path):
    write_synthetic_images(tmp_path / "images", 1)
    config = tmp_path / "detector.yaml"
    config.write_text("base: tiny\nmin_size: [\n")
    for args, message in (
        (["--detector", "tiny", "--set", "max_boxs=5"], "unknown field 'max_boxs' (did you mean 'max_boxes'?)"),
        (["--detector", str(config)], f"detector config {config}: invalid YAML, line 3, column 1: "),
    ):
        result = run("extract", "--images", str(tmp_path / "images"), "--out", str(tmp_path / "store"), *args)
        assert result.exit_code == 2 and result.output.startswith(f"Error: {message}"), result.output
        assert result.output.count("\n") == 1
    assert not (tmp_path / "store").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_bad_usage(tmp_path):
    write_synthetic_images(tmp_path / "images", 1)
    result = run("extract", "--images", str(tmp_path / "images"), "--out", str(tmp_path / "store"),
                 "--detector", "tiny", "--device", "cuda:1")
    assert result.exit_code == 2 and "Error: device 'cuda:1': CUDA is not available on this machine" in result.output
    assert not (tmp_path / "store").exists()


def test_ctrl_c_ends_quietly_with_130(tmp_path, monkeypatch):
    def interrupted(cache):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipelines.commands.cache, "store_info", interrupted)
    result = run("cache", "info", str(tmp_path))
    assert result.exit_code == 130 and result.output == "Interrupted.\n"


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(cache):
        raise KeyError("a bug")

    monkeypatch.setattr(pipelines.commands.cache, "store_info", broken)
    result = run("cache", "info", str(tmp_path))
    assert result.exit_code == 1 and isinstance(result.exception, KeyError) and "Error:" not in result.output


def test_help_answers_without_loading_torch():
    """`vlbert --help` and every command's --help import only click and light modules (they answered
    in 0.4–0.6 s instead of 5–9 s): the heavy libraries load when a command runs."""
    script = """
import sys
import click
from pipelines.cli import main

def commands(group, path):
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        yield path + [name]
        if isinstance(command, click.Group):
            yield from commands(command, path + [name])

for args in [[], *commands(main, [])]:
    try:
        main.main(args + ["--help"], prog_name="vlbert", standalone_mode=False)
    except SystemExit:
        pass
print(" ".join(sorted(m for m in ("torch", "torchvision", "transformers") if m in sys.modules)))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "Usage: vlbert extract" in result.stdout and "Usage: vlbert cache verify" in result.stdout
    assert result.stdout.splitlines()[-1] == ""


@pytest.mark.parametrize("error, status", [
    (StoreMismatchError, USAGE), (RunConfigError, USAGE), (RunMismatchError, USAGE), (ConfigError, USAGE),
    (PrecisionError, USAGE), (DeviceError, USAGE), (JobError, USAGE), (PipelineError, USAGE),
    (CheckpointError, USAGE), (DataError, USAGE), (VocabularyError, USAGE), (StickyDeviceError, FAILED),
    (StoreError, FAILED), (DamagedRecordError, FAILED), (ImageError, FAILED), (BoxError, FAILED),
])
def test_each_user_error_ends_the_command_with_its_status(error, status):
    exc = error("message", "img") if error is DamagedRecordError else error("message")
    assert isinstance(exc, UserError) and exit_status(exc) == status
    assert exit_status(StepFailed(Path("p.yaml"), "step", exc)) == status
    assert exit_status(FileNotFoundError(2, "No such file", "x")) == FAILED
    assert exit_status(StepFailed(Path("p.yaml"), "step", KeyError("a bug"))) is None
