"""Every record the project writes and reads back (a step's step.json, the executor's state file, a
store's meta.json, a training run's run.json) goes through one reader (vlbert/utils/records.py): bytes that
are not UTF-8, or anything else that keeps it from being read, are one line naming the file, and
nothing is emptied or overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from extract.store.reader import FeatureStore
from extract.store.schema import StoreError
from pipelines.cli import main
from pipelines.runner import run_pipeline
from tests.helpers.pipelines import write_pipeline
from train.engine.errors import RunConfigError
from train.engine.run_folder import RunFolder
from vlbert.utils.errors import UserError
from vlbert.utils.records import read_record

LIGHT_STEPS = [{"name": "world", "kind": "world", "images": 3, "seed": 1},
               {"name": "vocabulary", "kind": "vocabulary", "world": "${world}"}]
NOT_UTF8 = b'{"kind": "world", "params": "\xff"}'  # byte 29 is no UTF-8


def files_of(folder: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.fixture
def finished_run(tmp_path):
    """The pipeline file and output folder of a light pipeline run to its end."""
    path = write_pipeline(tmp_path, LIGHT_STEPS)
    return path, run_pipeline(path, log=lambda _: None)


def test_a_step_record_not_utf8_stops_run_and_status_in_one_line_and_the_page_names_it(finished_run):
    path, out = finished_run
    record = out / "world" / "step.json"
    record.write_bytes(NOT_UTF8)
    kept = files_of(out / "world")
    said = f"{record}: damaged (not a step's record: byte 29 is not UTF-8 text); its folder was left as it is"
    for command in (["run", "--jobs", "1"], ["run", "--jobs", "2"], ["status"]):
        result = CliRunner().invoke(main, ["pipeline", *command, str(path)])
        assert (result.exit_code, result.output) == (1, f"Error: {said}\n"), command
    report = CliRunner().invoke(main, ["pipeline", "report", str(path)])
    assert report.exit_code == 0, report.output
    lines = report.output.splitlines()
    assert f"missing: world: not run ({said})" in lines
    assert "missing: vocabulary: not run (it reads world, whose state cannot be told)" in lines
    assert files_of(out / "world") == kept


def test_a_state_file_not_utf8_stops_run_status_cancel_and_report_in_one_line(finished_run):
    path, out = finished_run
    state = out / ".pipeline" / "state.json"
    state.write_bytes(b'{"executor": "local", "steps": {"\xc3(": {}}}')
    kept = files_of(out)
    said = f"{state}: damaged (not the record of what ran: byte 33 is not UTF-8 text)"
    for command in ("run", "status", "cancel", "report"):
        result = CliRunner().invoke(main, ["pipeline", command, str(path)])
        assert (result.exit_code, result.output) == (1, f"Error: {said}\n"), command
    assert files_of(out) == kept


@pytest.mark.parametrize("content, reason", [
    (b"\xff\xfe{}", "damaged (not {what}: byte 0 is not UTF-8 text)"),
    (b'{"a": 1', "damaged (not {what})"),
    (b"[1, 2]", "damaged (not {what})"),
    (b"[" * 100_000, "damaged (not {what})"),  # nested too deeply for the JSON reader
    (b'{"a": ' + b"9" * 5000 + b"}", "damaged (not {what})"),  # more digits than Python reads
])
def test_the_reader_names_the_file_and_what_keeps_it_from_being_read(tmp_path, content, reason):
    path = tmp_path / "record.json"
    path.write_bytes(content)
    with pytest.raises(UserError) as refused:
        read_record(path, "a test record", UserError, "; nothing was changed")
    assert str(refused.value) == f"{path}: {reason.format(what='a test record')}; nothing was changed"
    assert path.read_bytes() == content
    assert read_record(tmp_path / "absent.json", "a test record", UserError) is None
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(UserError, match=r"folder.json: cannot read a test record \(Is a directory\)$"):
        read_record(tmp_path / "folder.json", "a test record", UserError)


def test_a_store_meta_json_not_utf8_is_one_line(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "meta.json").write_bytes(b'{"schema": "vlbert-\xe9"}')
    with pytest.raises(StoreError, match=r"meta.json: damaged \(not a FeatureStore's meta.json: byte 19 is not "
                                         r"UTF-8 text\)$"):
        FeatureStore(store)


def test_a_training_run_record_not_utf8_is_one_line(tmp_path):
    run = RunFolder(tmp_path / "run")
    run.write_config({"seed": 0, "stages": []})
    run.config_file.write_bytes(run.config_file.read_bytes().replace(b'"seed"', b'"se\x80d"'))
    with pytest.raises(RunConfigError, match=r"run.json: damaged \(not a training run's record: byte \d+ is not "
                                             r"UTF-8 text\)$"):
        run.config()
    assert json.loads(run.config_file.read_bytes().replace(b"\x80", b"e")) == {"seed": 0, "stages": []}
