"""An extract step's `shards`, bounded when the pipeline loads: at most the images it shares out (the
image files, the lines of an image list, the tar shards, which each process reads whole) where they
can be counted then, each counted only up to the bound; and at most what the executor can run
(pipelines/executors/shard_limits.py): processes here, a job array's tasks under Slurm."""

from __future__ import annotations

import resource
import subprocess
import tracemalloc

import pytest

from pipelines.executors.base import CannotRun
from pipelines.executors.processes import pid_max
from pipelines.executors.shard_limits import array_tasks, local_processes, too_many_shards
from pipelines.runner import PipelineError, load_pipeline, run_pipeline
from tests.helpers.pipelines import write_pipeline
from tests.helpers.shards import write_tar


def extract_step(images, shards: int, **fields) -> dict:
    return {"name": "features", "kind": "extract", "images": str(images), "detector": "tiny", "shards": shards,
            "progress": False, **fields}


@pytest.mark.parametrize("shards", [13, 1_000_001, 10_000_000])
def test_more_shards_than_images_are_refused_at_load_in_one_line_within_bounded_memory(tiny_world, tmp_path, shards):
    images = tiny_world / "world"  # 12 images
    path = write_pipeline(tmp_path, [extract_step(images, shards)])
    tracemalloc.start()
    try:
        with pytest.raises(PipelineError) as refused:
            load_pipeline(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value) == (f"{path}: step 'features' (extract): shards {shards}: more than the 12 images under "
                                  f"{images}: at most 12")
    assert peak < 20 * 2**20  # nothing held per shard, nor per image counted
    assert load_pipeline(write_pipeline(tmp_path, [extract_step(images, 12)])).steps[0].layout.shards == 12


def test_tar_shards_and_image_lists_bound_the_shards_as_they_share_them_out(tmp_path):
    for index in range(3):
        write_tar(tmp_path / "tars" / f"{index:05d}.tar", [(f"{index}.txt", b"a caption")])
    path = write_pipeline(tmp_path, [extract_step(tmp_path / "tars", 4)])
    with pytest.raises(PipelineError, match=r"step 'features' \(extract\): shards 4: more than the 3 tar shards of "
                                            r".*/tars: at most 3$"):
        load_pipeline(path)
    (tmp_path / "images").mkdir()
    listed = tmp_path / "images.txt"
    listed.write_text("a.jpg\n\nb.jpg\n")
    path = write_pipeline(tmp_path, [extract_step(tmp_path / "images", 3, image_list=str(listed))])
    with pytest.raises(PipelineError, match=r"shards 3: more than the 2 images the list .*/images.txt names: at most "
                                            r"2$"):
        load_pipeline(path)


def test_images_an_earlier_step_writes_are_not_counted_at_load(tmp_path):
    steps = [{"name": "world", "kind": "world", "images": 3, "seed": 1}, extract_step("${world}", 50)]
    assert load_pipeline(write_pipeline(tmp_path, steps)).steps[1].layout.shards == 50


def test_each_executor_names_the_most_shards_it_can_run(tmp_path):
    pipeline = load_pipeline(write_pipeline(tmp_path, [{"name": "world", "kind": "world", "images": 3, "seed": 1},
                                                       extract_step("${world}", 50)]))
    assert too_many_shards(pipeline, 49, "the tasks of a test") == [
        "step 'features': shards 50: more than the tasks of a test (49)"]
    assert too_many_shards(pipeline, 50, "the tasks of a test") == []
    most, why = local_processes()
    user = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    assert most == (pid_max() if user == resource.RLIM_INFINITY else min(user, pid_max())) and "process" in why
    assert array_tasks("MaxArraySize            = 40\nMaxJobCount = 10000\n") == (
        40, "the tasks of a job array on this cluster (MaxArraySize)")


def test_slurm_s_array_limit_is_read_from_its_config(slurm_cluster):
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    assert array_tasks(config)[0] == 1001  # the test cluster's: Slurm's default


# What the executors' own checks make of these bounds, before anything runs

def world_then_extract(shards: int) -> list[dict]:
    return [{"name": "world", "kind": "world", "images": 3, "seed": 1},
            {"name": "features", "kind": "extract", "images": "${world}", "detector": "tiny", "shards": shards,
             "progress": False}]


def test_more_shards_than_this_machine_may_run_are_refused_before_anything_runs(tmp_path):
    most, why = local_processes()
    path = write_pipeline(tmp_path, world_then_extract(most + 1))
    with pytest.raises(CannotRun) as refused:
        run_pipeline(path, log=lambda _: None)
    assert str(refused.value) == f"{path}: step 'features': shards {most + 1}: more than {why} ({most})"
    assert not (tmp_path / "out").exists()


def test_more_shards_than_a_slurm_job_array_takes_are_refused_before_submitting(slurm_cluster, tmp_path):
    path = write_pipeline(tmp_path, world_then_extract(1002))
    with pytest.raises(CannotRun) as refused:
        run_pipeline(path, log=lambda _: None, settings={"slurm.partition": slurm_cluster.partition}, executor="slurm")
    assert str(refused.value) == (f"{path}: step 'features': shards 1002: more than the tasks of a job array on this "
                                  "cluster (MaxArraySize) (1001)")
    assert not (tmp_path / "out").exists()
