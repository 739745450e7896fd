"""A step's environment: vlbert/utils/step_environment.py names every variable of the project's own that a
step's process reads, the executors build it from those names (pipelines/executors/environment.py),
with the values they always gave, and no other module of the project spells one."""

import ast
from pathlib import Path

from pipelines.executors.environment import local_environment, slurm_variables
from pipelines.runner import load_pipeline
from tests.helpers.pipelines import write_pipeline

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("extract", "train", "vlbert", "pipelines")
NAMES = Path("vlbert/utils/step_environment.py")
# A variable the user sets for any command (`--debug`), which click reads: not one an executor gives a step.
USERS = {(Path("pipelines/cli.py"), "VLBERT_DEBUG")}


def test_the_executors_give_a_step_the_variables_they_always_gave(tmp_path):
    step = load_pipeline(write_pipeline(tmp_path, [{"name": "world", "kind": "world", "images": 3}])).steps[0]
    local = local_environment(step, 1, 2, 3, ["0", "2"], {"VLBERT_SCHEDULER": "12 boot/34"}, "local=5")
    assert {name: local[name] for name in local if name.startswith("VLBERT_") or name in (
        "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONSAFEPATH")} == {
        "OMP_NUM_THREADS": "2", "VLBERT_CORES": "6", "CUDA_VISIBLE_DEVICES": "0,2", "PYTHONSAFEPATH": "1",
        "VLBERT_SCHEDULER": "12 boot/34", "VLBERT_ATTEMPT": "local=5",
        "VLBERT_PROGRESS_FILE": str(step.progress_file(1))}
    assert slurm_variables(step, None, 4, tmp_path / "meet.json") == {
        "OMP_NUM_THREADS": "4", "VLBERT_PROGRESS_FILE": str(step.progress_file(None)),
        "VLBERT_RENDEZVOUS": str(tmp_path / "meet.json")}
    assert "VLBERT_RENDEZVOUS" not in slurm_variables(step, None, 4, None)


def test_no_module_but_the_names_one_spells_a_step_s_variable():
    texts = {path.relative_to(ROOT): path.read_text() for package in PACKAGES
             for path in (ROOT / package).rglob("*.py")}
    spelt = {(path, node.value) for path, text in texts.items() if "VLBERT_" in text
             for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Constant)
             and isinstance(node.value, str) and node.value.startswith("VLBERT_")}
    assert {(path, name) for path, name in spelt if path != NAMES} == USERS
