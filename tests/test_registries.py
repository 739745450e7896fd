"""Registries and imports without side effects: every item kind, task, source and benchmark is known
whatever was imported before; no module of the project imports itself back through another; and
`vlbert extract` loads nothing of train/."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("extract", "train", "vlbert", "pipelines")
REGISTRIES = {"ITEM_KINDS": "train.data.annotations", "TASKS": "train.tasks", "SOURCES": "train.data.sources",
              "BENCHMARKS": "train.evaluation.benchmarks"}

# Prints each registry's names as JSON, after importing what `IMPORTS` names.
READ_REGISTRIES = """
import importlib, json, pkgutil, sys
{imports}
registries = {registries}
print(json.dumps({{name: list(getattr(importlib.import_module(module), name)) for name, module in registries.items()}}))
"""
EVERYTHING = """
for package in {packages}:
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:  # an optional dependency (detectron2)
            if exc.name.split(".")[0] in {packages}:
                raise
"""


def python(script: str, *args: str) -> str:
    """The stdout of `script` run in a fresh interpreter at the repository root."""
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout


@pytest.fixture(scope="module")
def full_registries() -> dict[str, list[str]]:
    script = READ_REGISTRIES.format(imports=EVERYTHING.format(packages=PACKAGES), registries=REGISTRIES)
    return json.loads(python(script).splitlines()[-1])


@pytest.mark.parametrize("name", REGISTRIES)
def test_a_registry_read_after_importing_only_its_module_lists_everything(name, full_registries):
    alone = json.loads(python(READ_REGISTRIES.format(imports="", registries={name: REGISTRIES[name]})))
    assert alone[name] == full_registries[name]


def test_the_registries_hold_the_visual_entailment_records(full_registries):
    assert "snli_ve" in full_registries["ITEM_KINDS"] and "snli_ve" in full_registries["TASKS"]
    assert "snli-ve" in full_registries["SOURCES"] and "snli-ve" in full_registries["BENCHMARKS"]


def test_a_vocabulary_of_snli_ve_annotations_alone_holds_their_hypotheses_words(tmp_path):
    """`vlbert vocab build` in a fresh process, as a user runs it: nothing imported the SNLI-VE task."""
    hypotheses = ["a zebra gallops across the savanna", "the zebra sleeps", "nobody rides a zebra"]
    records = [{"file": f"flickr30k_images/{i}.jpg", "image_id": str(i),
                "snli_ve": [{"pair_id": f"{i}.jpg#{k}", "hypothesis": text, "label": "neutral"}
                            for k, text in enumerate(hypotheses)]} for i in range(4)]
    annotations = tmp_path / "dev.jsonl"
    annotations.write_text("".join(json.dumps(record) + "\n" for record in records))
    python("from pipelines.cli import main; main()", "vocab", "build", str(annotations), "--out", str(tmp_path / "vocab"),
           "--size", "200", "--min-frequency", "2")
    tokens = (tmp_path / "vocab" / "vocab.txt").read_text().splitlines()
    assert {"zebra", "savanna"} <= set(tokens)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module → the project's modules it imports anywhere in its text (at the top, inside a function
    or for type checking alike), read from the source without importing it."""
    modules = {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    imported |= {submodule} if submodule in modules else {node.module} & modules.keys()
        graph[name] = imported - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            following = next(edges, None)
            if following is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    if len(group) > 1:
                        found.append(sorted(group))
            elif following not in index:
                index[following] = low[following] = len(index)
                stack.append(following)
                work.append((following, iter(sorted(graph[following]))))
            elif following in stack:
                low[node] = min(low[node], index[following])
    return found


def test_no_module_imports_itself_back_through_others():
    assert circles(import_graph()) == []


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Each part's floor: a module imports only from its own floor or those below. The ground floor
# (vlbert.utils) imports nothing else of the project; the detector (extract) and the model library
# (vlbert) stand on it side by side, neither importing the other; train stands on both, pipelines on all.
GROUND_FLOOR = "vlbert.utils"
FLOORS = {GROUND_FLOOR: 0, "extract": 1, "vlbert": 1, "train": 2, "pipelines": 3}


def part(module: str) -> str:
    return GROUND_FLOOR if module == GROUND_FLOOR or module.startswith(GROUND_FLOOR + ".") else module.split(".")[0]


def arrows_against_the_floors(graph: dict[str, set[str]]) -> list[str]:
    """Each import that goes up a floor, or across from one part to another on the same floor."""
    return sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                  if part(target) != part(name) and FLOORS[part(target)] >= FLOORS[part(name)])


def test_every_import_goes_down_a_floor_the_ground_floor_imports_nothing_and_extract_and_vlbert_stand_apart():
    graph = import_graph()
    assert any(part(name) == GROUND_FLOOR for name in graph) and arrows_against_the_floors(graph) == []


def test_the_floor_check_finds_an_arrow_up_and_one_across():
    graph = {"vlbert.utils.atomic": {"extract.config"}, "extract.job": {"vlbert.modeling", "vlbert.utils.paths"},
             "train.trainer": {"extract.job"}}
    assert arrows_against_the_floors(graph) == ["extract.job -> vlbert.modeling",
                                                "vlbert.utils.atomic -> extract.config"]


def test_vlbert_extract_loads_nothing_of_train(tmp_path):
    images = tmp_path / "images"  # apart from the store: an output inside its input is refused
    images.mkdir()
    for index in range(2):
        pixels = np.random.default_rng(index).integers(0, 255, (48, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"{index}.jpg")
    script = """
import sys
from pipelines.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    assert not exit.code, exit.code
print(" ".join(sorted(name for name in sys.modules if name.split(".")[0] in ("train", "pipelines"))))
"""
    out = python(script, "extract", "--images", str(images), "--out", str(tmp_path / "store"), "--detector", "tiny")
    assert (tmp_path / "store" / "meta.json").is_file()
    assert out.splitlines()[-1].split() == ["pipelines", "pipelines.cli", "pipelines.commands",
                                            "pipelines.commands.extract", "pipelines.commands.values",
                                            "pipelines.own_packages"]


def test_the_light_report_step_reads_run_folders_without_torch():
    """The report step is light (it counts for no core and starts as a plain command): what it imports to
    write the report, run folders included, loads no torch."""
    out = python("import sys\nfrom pipelines.report.summary import write_report\nprint('torch' in sys.modules)")
    assert out.split() == ["False"]


def test_the_attention_command_offers_every_text_kind_the_analysis_reads():
    from pipelines.commands.analyze import TEXT_KINDS
    from train.analysis.attention import TEXT_KINDS as READ

    assert TEXT_KINDS == tuple(READ)
