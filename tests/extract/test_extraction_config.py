"""One record of an extraction's settings (extract/extraction_config.py): `vlbert extract`'s defaults, the
pipeline's extract step fields and the job's checks all come from it."""

import dataclasses

import pytest

from extract.extraction_config import ExtractionConfig, JobError
from pipelines.commands.extract import extract_command
from pipelines.steps.extract import KIND, ExtractStep
from train.engine.errors import RunConfigError

# the settings whose defaults `vlbert extract --help` shows (the others' default is None, or the flag's absence)
SHOWN_DEFAULTS = ("batch_size", "device", "precision", "res5_layout", "feature_dtype", "mask_variants", "mask_prob",
                  "mask_seed", "jpeg_decoding", "max_pixels")


def test_the_command_s_defaults_are_the_record_s():
    options = {option.name: option for option in extract_command.params}
    config = ExtractionConfig("images")
    assert {name: options[name].default for name in SHOWN_DEFAULTS} == {name: getattr(config, name)
                                                                         for name in SHOWN_DEFAULTS}
    assert options["top_k_classes"].default == str(config.top_k_classes)  # the option's text: 'all' or K


def test_a_step_takes_the_record_s_fields_and_its_shards():
    names = [spec.name for spec in dataclasses.fields(ExtractionConfig)]
    assert KIND.fields({}) == [*names, "shards"]
    step = KIND.check({"images": "world", "detector": "tiny", "shards": 3, "batch_size": 2})
    job = step.extraction((1, 3))
    assert type(job) is ExtractionConfig and (job.shard, job.batch_size, job.detector) == ((1, 3), 2, "tiny")
    assert step.extraction() == ExtractionConfig("world", "tiny", batch_size=2)


@pytest.mark.parametrize("settings, message", [
    ({"batch_size": 0}, "batch_size 0: expected at least 1"),
    ({"shard": (2, 2)}, "shard [2, 2]: expected [i, n] with 0 <= i < n"),
    ({"jpeg_decoding": "gpu"}, "jpeg_decoding 'gpu': expected one of"),
    ({"speed_paths": ("batched-rpn", "fast")}, "speed_paths 'fast': expected one of folded-res5-norms, "),
])
def test_a_setting_the_job_cannot_take_is_refused_as_the_record_is_built(settings, message):
    with pytest.raises(JobError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ExtractionConfig("images", "tiny", **settings)
    with pytest.raises(RunConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ExtractStep("images", "tiny", **settings)


def test_the_record_is_frozen_and_a_step_s_shard_and_shards_exclude_each_other():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExtractionConfig("images").batch_size = 4
    with pytest.raises(RunConfigError, match="shard and shards: give one"):
        KIND.check({"images": "world", "shards": 2, "shard": [0, 2]})
