"""bench/bench_effects.py's plumbing, without training: each claim's pipelines load, a run's steps read
the shared world, FeatureStore and vocabulary, its seeds reach every seeded step, and a comparison
holds only when every interval of the run's report lies above 0; the report's VQA comparisons by answer
type are printed under it and judge nothing."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.runner import load_pipeline, parse_settings

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_effects", ROOT / "bench" / "bench_effects.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize("name", ["zero_shot", "ablation"])
def test_each_claims_pipelines_share_the_world_and_scale_the_trained_stages(bench, name, tmp_path):
    claim = bench.CLAIMS[name]
    shared, runs = bench.claim_pipelines(claim, ROOT, 0.5, tmp_path)
    loaded = load_pipeline(shared, {"out": str(tmp_path / "shared")})  # as the benchmark runs it
    assert [step.name for step in loaded.steps] == list(bench.SHARED_STEPS)
    # The runner orders them by what they read: the extraction and vocabulary wait for the whole world.
    reads = {step.name: sorted(step.reads) for step in loaded.steps}
    assert reads["world"] == [] and reads["cache"] == reads["vocabulary"] == ["world"]
    document = yaml.safe_load(runs.read_text())
    steps = {step["name"]: step for step in document["steps"]}
    assert list(steps) == [*claim.steps, *(["report"] if claim.compare else [])]
    full = {step["name"]: step for step in yaml.safe_load(claim.pipeline.read_text())["steps"]}
    for step in claim.steps:
        assert steps[step]["store"] == str(tmp_path / "shared" / "cache")
        if step in claim.scaled:
            assert [s["steps"] for s in steps[step]["stages"]] == [round(s["steps"] / 2) for s in full[step]["stages"]]
    for a, b in claim.compare:
        assert [f"${{{a}}}", f"${{{b}}}"] in steps["report"]["compare"]
    assert set(claim.seeded) <= set(claim.steps)


BY_TYPE = {"name": "answer type", "groups": [{"group": "colour", "difference": 0.071, "interval": [0.02, 0.12]},
                                             {"group": "count", "difference": -0.01, "interval": [-0.03, 0.01]}]}


def _report(folder: Path, intervals: dict[tuple[str, str], tuple[float, float]]) -> None:
    """A run's report.json: VQA comparisons also by answer type (BY_TYPE), as the report writes them."""
    (folder / "report").mkdir(parents=True)
    comparisons = [{"a": a, "b": b, "difference": sum(i) / 2, "interval": list(i),
                    **({"by_group": BY_TYPE} if b.endswith("-vqa") else {})} for (a, b), i in intervals.items()]
    (folder / "report" / "report.json").write_text(json.dumps({"comparisons": comparisons}))
    for run in ("a-vqa", "e-vqa", "a-refexp", "e-refexp"):
        (folder / run).mkdir()
        (folder / run / "step.json").write_text(json.dumps({"threads": 2}))


@pytest.mark.parametrize("refexp, holds", [((0.01, 0.05), True), ((-0.01, 0.05), False), ((-0.05, -0.01), False)])
def test_a_comparison_holds_only_when_every_interval_lies_above_0(bench, tmp_path, refexp, holds):
    _report(tmp_path, {("a-vqa", "e-vqa"): (0.02, 0.06), ("a-refexp", "e-refexp"): refexp})
    result = bench.compared(("a-vqa", "e-vqa"), ("a-refexp", "e-refexp"))(tmp_path)
    assert (result.holds, result.threads) == (holds, 2)
    assert result.figure.startswith("e-vqa − a-vqa +0.040 [+0.020, +0.060]; e-refexp − a-refexp")
    alone = bench.CLAIMS["ablation"].effects["pretraining_refexp"].judge(tmp_path)
    assert (alone.holds, alone.figure, alone.details) == (holds, result.figure.split("; ")[1], ())
    by_type = "by answer type: colour +0.071 [+0.020, +0.120], count -0.010 [-0.030, +0.010]"
    assert result.details == (f"e-vqa − a-vqa {by_type}",)
    vqa = bench.CLAIMS["ablation"].effects["pretraining_vqa"].judge(tmp_path)
    assert (vqa.holds, vqa.details) == (True, (by_type,))  # count's interval holds 0: the whole split judges


def test_settings_of_a_shared_step_go_to_the_shared_run_and_the_others_to_each_run(bench, tmp_path):
    settings = ["world.max_objects=3", "a-vqa.vqa.base_lr=2e-4", "cache.batch_size=4", "worldly.seed=1"]
    shared, runs = bench.split_settings(settings)
    assert shared == ["world.max_objects=3", "cache.batch_size=4"]
    assert runs == ["a-vqa.vqa.base_lr=2e-4", "worldly.seed=1"]
    # Each half loads with its pipeline, as the benchmark runs them.
    claim = bench.CLAIMS["ablation"]
    shared_file, _ = bench.claim_pipelines(claim, ROOT, 1.0, tmp_path)
    loaded = load_pipeline(shared_file, {"out": str(tmp_path / "shared"), **parse_settings(shared)})
    assert {step.name: step.params.get("max_objects") for step in loaded.steps}["world"] == 3
