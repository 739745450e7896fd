"""The `vlbert` command's handling of errors: one line and an exit status for what users cause,
the traceback on request, and the traceback for anything else."""

import pytest
import torch
from click.testing import CliRunner

import pipelines.commands.cache
from extract.synthetic import write_synthetic_images
from pipelines.cli import main


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
