"""The state file's typed records (pipelines/executors/records.py): a view of the file, not a new format.
A state file as the local and Slurm executors wrote it before the records reads and writes back key for
key; what the executors write through them has the keys they always wrote."""

from __future__ import annotations

import json

import pytest

from pipelines.executors.base import StateUnreadable, read_run, record_launch, record_run, state_file
from pipelines.executors.records import LaunchRecord, RunRecord, SchedulerRecord

LOCAL_STATE = {  # as the local scheduler wrote it: one step done, one failed, one not run, one running
    "executor": "local",
    "scheduler": {"pid": 4242, "identity": "boot-1/77", "host": "node1", "started": 1700000000.5,
                  "ended": 1700000100.25},
    "steps": {
        "world": {"state": "done", "processes": {"4300": "boot-1/80"}, "started": 1700000001.0,
                  "attempt": "a1", "ended": 1700000002.0},
        "cache": {"state": "failed", "processes": {"4301": "boot-1/81", "4302": None}, "started": 1700000003.0,
                  "attempt": "a2", "ended": 1700000004.0, "error": "Error: no images"},
        "train": {"state": "not run", "ended": 1700000004.5, "error": "it reads cache, which failed"},
        "long": {"state": "running", "processes": {"4303": "boot-1/83"}, "started": 1700000005.0, "attempt": "a3"},
    },
}
SLURM_STATE = {"executor": "slurm", "steps": {"world": {"jobs": ["12"]}, "cache": {"jobs": ["13_0", "14"]}}}


@pytest.mark.parametrize("recorded", [LOCAL_STATE, SLURM_STATE, {}], ids=["local", "slurm", "no-run"])
def test_a_state_file_written_before_the_records_reads_and_writes_back_key_for_key(recorded):
    run = RunRecord.from_json(json.loads(json.dumps(recorded)))
    assert run.to_json() == (recorded or {"steps": {}})


def test_the_records_read_what_each_executor_wrote():
    run = RunRecord.from_json(LOCAL_STATE)
    assert run.scheduler == SchedulerRecord(4242, "boot-1/77", "node1", 1700000000.5, 1700000100.25)
    assert run.launched("local")["cache"] == LaunchRecord("failed", {"4301": "boot-1/81", "4302": None},
                                                          started=1700000003.0, attempt="a2", ended=1700000004.0,
                                                          error="Error: no images")
    assert run.launched("slurm") == {}  # another executor ran it last
    assert RunRecord.from_json(SLURM_STATE).launched("slurm")["cache"].jobs == ["13_0", "14"]


def test_what_an_executor_records_through_them_has_the_keys_it_always_wrote(tmp_path):
    out = tmp_path / "out"
    scheduler = SchedulerRecord(4242, "boot-1/77", "node1", 1.5)
    record_run(out, lambda _: RunRecord("local", scheduler))
    record_launch(out, "world", lambda launch: (launch or LaunchRecord("running", started=2.0, attempt="a1"))
                  .with_process(4300, "boot-1/80"))
    record_launch(out, "world", lambda launch: launch.with_process(4301, None))
    record_launch(out, "train", lambda launch: LaunchRecord("not run", ended=3.0, error="it reads world"))
    assert json.loads(state_file(out).read_text()) == {
        "executor": "local", "scheduler": {"pid": 4242, "identity": "boot-1/77", "host": "node1", "started": 1.5},
        "steps": {"world": {"state": "running", "processes": {"4300": "boot-1/80", "4301": None}, "started": 2.0,
                            "attempt": "a1"},
                  "train": {"state": "not run", "ended": 3.0, "error": "it reads world"}}}


def test_what_is_no_record_is_kept_as_read_or_named_in_one_line(tmp_path):
    out = tmp_path / "out"
    record_run(out, lambda _: RunRecord("local", "pid 5"))  # the local executor names it when it cancels
    assert read_run(out).scheduler == "pid 5"
    state_file(out).write_text(json.dumps({"executor": "local", "steps": {"world": ["running"]}}))
    with pytest.raises(StateUnreadable, match=r"state\.json: damaged \(step 'world': its launch is not a record\)$"):
        read_run(out)
    record = LaunchRecord.from_json({"processes": None, "jobs": "12"}, "world")
    assert (record.processes, record.jobs) == (None, "12")  # as read: the executor names what is wrong
