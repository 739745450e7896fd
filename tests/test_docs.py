"""The reference the `vlbert train --help` text points at stays complete: every field of the run
config, of a stage and of each task's options is in docs/training.md's "Run config fields", and
nothing it lists is gone. And every relative link of README.md and docs/ leads to a file and, where it
names one, to a heading of that file."""

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

from click.testing import CliRunner

from pipelines.cli import main
from train.engine.config import RunConfig, StageConfig
from train.tasks import TASKS

DOCS = Path(__file__).resolve().parents[1] / "docs"
README = DOCS.parent / "README.md"


def documented_fields() -> dict[str, list[str]]:
    text = DOCS.joinpath("training.md").read_text()
    section = text.split("## Run config fields", 1)[1].split("\n## ", 1)[0]
    run, stage = section.split("### Stage", 1)
    stage = stage.split("### Task options", 1)[0]
    return {name: re.findall(r"^\| `(\w+)` \|", part, re.M) for name, part in (("run", run), ("stage", stage))}


def test_the_run_config_reference_lists_every_field_in_order():
    documented = documented_fields()
    assert documented["run"] == [f.name for f in dataclasses.fields(RunConfig)]
    assert documented["stage"] == [f.name for f in dataclasses.fields(StageConfig)]


def test_the_task_options_reference_lists_every_task_s_options_in_order():
    text = DOCS.joinpath("training.md").read_text()
    section = text.split("### Task options", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(\w+)` \| `(\w+)` \|", section, re.M)
    assert documented == [(name, spec.name) for name, task in TASKS.items()
                          for spec in dataclasses.fields(task.options)]


def test_train_help_names_the_reference():
    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0 and 'docs/training.md' in result.output and "Run config fields" in result.output


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def without_code(text: str) -> str:
    """The text outside code blocks and code spans, where a bracket is no link."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def anchors(markdown: Path) -> Iterator[str]:
    """GitHub's anchor of each heading: lower case, punctuation but - and _ dropped, spaces as -, and
    -1, -2, ... after a heading met again."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ +(.+?) *#*$", without_code_blocks(markdown.read_text()), re.M):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.replace("`", ""))
        anchor = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        seen[anchor] = seen.get(anchor, -1) + 1
        yield anchor if seen[anchor] == 0 else f"{anchor}-{seen[anchor]}"


def broken_links(markdown: Path) -> list[str]:
    problems, name = [], markdown.relative_to(README.parent)
    for target in re.findall(r"\]\(([^)\s]+)\)", without_code(markdown.read_text())):
        if re.match(r"[a-z]+:", target):  # an address elsewhere (https:, mailto:), not checked offline
            continue
        path, _, anchor = target.partition("#")
        linked = (markdown.parent / path).resolve() if path else markdown
        if not linked.exists():
            problems.append(f"{name}: {target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in set(anchors(linked))):
            problems.append(f"{name}: {target}: no heading #{anchor} in {linked.name}")
    return problems


def test_every_relative_link_of_the_docs_leads_to_a_file_and_its_heading():
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    assert [problem for page in pages for problem in broken_links(page)] == []
