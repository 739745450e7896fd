"""The `analyze` step and pipelines/configs/grounding.yaml: VisualBERT's entity and syntactic grounding
analyses run end to end on a tiny demo world (the shipped file, its step counts shrunk), the step's
parameters checked at load, and a rerun that finds every step up to date."""

import json
from pathlib import Path

import pytest
import yaml

from pipelines.runner import PipelineError, load_pipeline, run_pipeline
from tests.helpers.pipelines import run_pipeline_file
from train.analysis.grounding_results import held_out_of
from train.analysis.syntax_results import held_out_by_relation
from train.analysis.verdicts import grounding_verdicts, syntax_verdicts, words_verdicts
from train.analysis.word_results import WordsResult

GROUNDING = Path(__file__).parents[2] / "pipelines" / "configs" / "grounding.yaml"
TINY = {"world.images": 10}  # 2 validation images: 6 captions


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory) -> Path:
    """grounding.yaml with 2-step stages of batch 2."""
    pipeline = yaml.safe_load(GROUNDING.read_text())
    for step in pipeline["steps"]:
        for stage in step.get("stages", []):
            stage.update(steps=2, batch_size=2, warmup_steps=1)
    path = tmp_path_factory.mktemp("grounding") / "grounding.yaml"
    path.write_text(yaml.safe_dump(pipeline).replace("${here}/..", str(GROUNDING.parents[1])))
    return path


@pytest.fixture(scope="module")
def ran(shrunk) -> Path:
    out = shrunk.parent / "run"
    run_pipeline_file(shrunk, out, TINY)
    return out


def in_unit_interval(values) -> bool:
    flat = [v for row in values for v in (row if isinstance(row, list) else [row])]
    return bool(flat) and all(0.0 <= v <= 1.0 for v in flat)


def test_the_syntax_steps_count_the_parsed_arcs_and_give_accuracies_and_baselines(ran):
    conllu = (ran / "world" / "val.conllu").read_text()
    split = (ran / "world" / "val.txt").read_text().split()
    trained, fresh = (json.loads((ran / step / "syntax.json").read_text()) for step in ("syntax", "syntax-fresh"))
    # Every caption of the split's images (three each), one parse each, none skipped.
    assert trained["captions"] == 3 * len(split) == conllu.count("# sent_id") == 6
    assert trained["skipped"] == [] and trained["min_region_attention"] == 0.2
    rows = {row["relation"]: row for row in trained["relations"]}
    assert trained["arcs"] == sum(row["arcs"] for row in rows.values()) > 0
    # An amod arc counts when its noun heads a boxed phrase: at most every amod arc of the parses.
    amod = sum(1 for line in conllu.splitlines() if line and not line.startswith("#") and line.split("\t")[7] == "amod")
    assert 0 < rows["amod"]["arcs"] <= amod
    for row in rows.values():
        assert in_unit_interval(row["accuracy"]) and len(row["accuracy"]) == trained["layers"] == 4
        assert 0 <= row["random_baseline"] <= 1 and 0 <= row["confidence_baseline"] <= 1
    assert in_unit_interval(trained["region_attention"])
    # The before-training reference reads the same captions and arcs.
    assert (fresh["captions"], fresh["arcs"]) == (trained["captions"], trained["arcs"])
    assert "amod" in (ran / "syntax" / "syntax.md").read_text() and (ran / "syntax" / "relations.png").is_file()
    # The step's log line says how many relations' held-out head beats the most confident RoI.
    verdicts = syntax_verdicts(held_out_by_relation(trained))
    assert verdicts and verdicts[0] in (ran / "syntax" / "log.txt").read_text()


def test_the_grounding_step_scores_the_entity_phrases(ran):
    result = json.loads((ran / "grounding" / "grounding.json").read_text())
    assert result["phrases"] > 0 and (ran / "grounding" / "grounding.png").is_file()
    assert len(result["accuracy"]) == result["layers"] == 4 and in_unit_interval(result["accuracy"])
    assert 0 <= result["random_baseline"] <= 1 and 0 <= result["confidence_baseline"] <= 1
    assert result["best"]["accuracy"] == max(max(row) for row in result["accuracy"])
    verdicts = grounding_verdicts(held_out_of(result))
    assert verdicts and verdicts[0] in (ran / "grounding" / "log.txt").read_text()


def test_the_words_step_predicts_each_caption_word_beside_two_images(ran):
    result = json.loads((ran / "words" / "words.json").read_text())
    captions = sum(len(json.loads(line)["captions"]) for line in (ran / "world" / "val.jsonl").read_text().splitlines())
    assert result["captions"] == captions
    assert result["masked_words"] == sum(row["masked_words"] for row in result["by_word"])
    assert set(result["groups"]) == {"colour", "shape"} and result["groups"]["colour"]["masked_words"] > 0
    assert in_unit_interval([result["own_image"], result["another_image"]])
    verdicts = words_verdicts(WordsResult.from_json(result))
    assert len(verdicts) == 3 and all(line in (ran / "words" / "log.txt").read_text() for line in verdicts)
    assert "| colour |" in (ran / "words" / "words.md").read_text()


def test_a_rerun_finds_every_step_up_to_date_and_recomputes_nothing(ran, shrunk):
    outputs = [ran / step / name for step, name in (("grounding", "grounding.json"), ("syntax", "syntax.json"),
                                                    ("syntax-fresh", "syntax.json"), ("words", "words.json"))]
    before = [path.stat().st_mtime_ns for path in outputs]
    messages = []
    run_pipeline(shrunk, ran, log=messages.append, settings=TINY)
    steps = [step["name"] for step in yaml.safe_load(shrunk.read_text())["steps"]]
    assert messages == [f"[{name}] up to date" for name in steps]
    assert [path.stat().st_mtime_ns for path in outputs] == before


@pytest.mark.parametrize("settings, message", [
    ({"syntax.analysis": "syntaks"},
     r": step 'syntax' \(analyze\): analysis: 'syntaks' is not one of grounding, syntax, words \(did you mean "
     r"'syntax'\?\)$"),
    ({"words.groups": {"colour": []}}, r": step 'words' \(analyze\): groups: group 'colour': names no words$"),
    ({"words.groups": {"colour": ["light blue"]}},
     r": step 'words' \(analyze\): groups: group 'colour': 'light blue' is not one word$"),
    ({"syntax.min_region_attention": 1}, r": step 'syntax' \(analyze\): min_region_attention: expected a share below 1"),
    ({"grounding.format": "coco"}, r": step 'grounding' \(analyze\): format: 'coco' is not one of refs, flickr30k-entities"),
    ({"syntax.parses": "/nonexistent.conllu"}, r": step 'syntax' \(analyze\): parses: /nonexistent.conllu does not exist"),
])
def test_bad_analyze_params_are_refused_at_load_in_one_line(settings, message):
    with pytest.raises(PipelineError, match=message) as caught:
        load_pipeline(GROUNDING, settings)
    assert "\n" not in str(caught.value)


def test_a_key_of_another_analysis_is_an_unknown_field_at_load(tmp_path):
    pipeline = yaml.safe_load(GROUNDING.read_text())
    (syntax,) = [step for step in pipeline["steps"] if step["name"] == "syntax"]
    syntax["format"] = "flickr30k-entities"  # grounding's
    path = tmp_path / "grounding.yaml"
    path.write_text(yaml.safe_dump(pipeline).replace("${here}/..", str(GROUNDING.parents[1])))
    with pytest.raises(PipelineError, match=r": step 'syntax' \(analyze\): unknown field 'format'") as caught:
        load_pipeline(path)
    assert "\n" not in str(caught.value)
