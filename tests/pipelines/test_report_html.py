"""report.html of a pipeline run: every stage's figure with its interval and chance level, the
comparisons, the loss curves, the timeline, the stores and analyses; rebuilt for a run stopped
halfway; opened in headless Chromium, which must find nothing to fetch and nothing to complain of."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from PIL import Image

from pipelines.cli import main
from pipelines.report.page import write_html_report
from pipelines.runner import StepFailed, run_pipeline
from pipelines.world.tiny import TINY_MODEL
from tests.helpers.browser import WIDTH, find_chromium, visit
from train.analysis.grounding_results import held_out_of
from train.analysis.verdicts import grounding_verdicts


def pipeline_steps(world: Path, bad_texts: Path) -> list[dict]:
    common = {"store": "${cache}", "train_annotations": str(world / "world" / "train.jsonl"),
              "eval_annotations": str(world / "world" / "val.jsonl"), "vocabulary": str(world / "vocab"),
              "images": str(world / "world"), "max_length": 40, "model": TINY_MODEL}
    return [
        {"name": "cache", "kind": "extract", "images": str(world / "world"), "detector": "tiny", "mask_variants": 1,
         "batch_size": 4, "progress": False},
        {"name": "vqa-frozen", "kind": "train", "detector": "frozen", **common,
         "stages": [{"name": "vqa", "task": "vqa", "steps": 2, "batch_size": 4},
                    {"name": "vqa-last", "task": "vqa", "steps": 1, "batch_size": 4}]},
        {"name": "vqa-tuned", "kind": "train", "detector": "tuned", **common, "init_from": "${vqa-frozen.final}",
         "stages": [{"name": "vqa-more", "task": "vqa", "steps": 1, "batch_size": 4}]},
        {"name": "grounding", "kind": "analyze", "analysis": "grounding", "model": "${vqa-frozen.final}",
         "store": "${cache}", "annotations": str(world / "world" / "val.jsonl"), "vocabulary": str(world / "vocab"),
         "images": str(world / "world"), "examples": 1, "max_items": 4},
        {"name": "bad", "kind": "vocabulary", "texts": [str(bad_texts)]},
        {"name": "after-bad", "kind": "vocabulary", "texts": ["${bad}/vocab.txt"]},
        {"name": "report", "kind": "report", "runs": ["${vqa-frozen}", "${vqa-tuned}"],
         "compare": [["${vqa-frozen}", "${vqa-tuned}"]]},
    ]


@pytest.fixture(scope="module")
def run(tiny_world, tmp_path_factory):
    """The tiny pipeline, run once: every step done but `bad` (its text file is no JSON), and
    `after-bad`, which reads it. The report step writes report.html while it runs, so its own row
    shows it done."""
    root = tmp_path_factory.mktemp("report-html")
    (root / "bad.jsonl").write_text("not JSON\n")
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "test", "out": str(root / "out"),
                                    "steps": pipeline_steps(tiny_world, root / "bad.jsonl")}))
    with pytest.raises(StepFailed, match="step 'bad'"):
        run_pipeline(path, log=lambda _: None)
    return path, root / "out"


class Page(HTMLParser):
    """What the page holds: the text, every link and image source, and the tags used."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.links, self.sources, self.tags, self.words = [], [], set(), []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attributes = dict(attrs)
        if tag == "a":
            self.links.append(attributes["href"])
        if tag == "img":
            self.sources.append(attributes["src"])

    def handle_data(self, data):
        self.words.append(data)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.words).split())


def test_the_page_shows_every_stage_with_its_interval_and_chance_and_names_what_failed(run):
    _, out = run
    page = out / "report" / "report.html"
    parsed = Page(page.read_text())
    report = json.loads((out / "report" / "report.json").read_text())
    for row in report["runs"]:
        for stage in row["stage_results"]:
            label = f"{row['name']} · {stage['stage']} ({stage['visual']})"
            low, high = stage["interval"]
            assert f"{label} {stage['value']:.3f} [{low:.3f}, {high:.3f}], chance {stage['chance']:.3f}" in parsed.text
    stages = [stage["stage"] for row in report["runs"] for stage in row["stage_results"]]
    assert stages == ["vqa", "vqa-last", "vqa-more"]
    assert parsed.text.count("stroke-dasharray=\"3 2\"") == 0  # SVG attributes are markup, not text
    assert page.read_text().count('stroke="#d62728" stroke-width="2" stroke-dasharray="3 2"') == 3  # chance lines
    (comparison,) = report["comparisons"]
    assert f"vqa-tuned − vqa-frozen {comparison['difference']:+.3f}" in parsed.text
    assert "<h3>Comparisons by answer type</h3>" in page.read_text()  # the tiny world's questions have types
    markdown = (out / "report" / "report.md").read_text()
    for group in comparison["by_group"]["groups"]:
        assert f"vqa-tuned − vqa-frozen · {group['group']} {group['difference']:+.3f}" in parsed.text
        assert f"| vqa-frozen | vqa-tuned | {group['group']} | {group['items']} |" in markdown
    assert "Not in this report, or not complete: bad: failed (" in parsed.text
    assert "after-bad: not run (it reads bad, which failed)" in parsed.text
    for heading in ("Results", "Every stage", "Comparisons", "Loss curves", "Timeline", "Features", "Analyses"):
        assert f"<h2>{heading}</h2>" in page.read_text() or f"<h3>{heading}</h3>" in page.read_text()


def test_the_timeline_has_each_step_its_state_threads_and_links_to_its_files(run):
    _, out = run
    page = out / "report" / "report.html"
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td class=\"state-[^\"]+\">([^<]+)</td>", page.read_text())
    # In the order the steps started (the page was written without the pipeline file), the step never
    # started last.
    assert sorted(rows[:-1]) == [("bad", "vocabulary", "failed"), ("cache", "extract", "done"),
                                 ("grounding", "analyze", "done"), ("report", "report", "done"),
                                 ("vqa-frozen", "train", "done"), ("vqa-tuned", "train", "done")]
    assert rows[-1] == ("after-bad", "—", "not run")
    parsed = Page(page.read_text())
    files = [link for link in parsed.links if link.endswith(("log.txt", "step.json"))]
    assert {(page.parent / link).resolve().parent.name for link in files} == {
        "cache", "bad", "vqa-frozen", "grounding", "vqa-tuned", "report", "after-bad"}
    assert all((page.parent / link).is_file() for link in files if not link.startswith("../after-bad"))
    record = json.loads((out / "vqa-frozen" / "step.json").read_text())
    threads = record["threads"]
    assert re.search(rf"<td>vqa-frozen</td><td>train</td><td class=\"state-done\">done</td><td>[^<]+</td>"
                     rf"<td>{record['seconds']:.1f}</td><td>{threads} thread{'s' if threads > 1 else ''}</td>",
                     page.read_text())


def test_the_page_is_whole_in_one_file(run):
    _, out = run
    text = (out / "report" / "report.html").read_text()
    parsed = Page(text)
    assert "script" not in parsed.tags and "link" not in parsed.tags and "iframe" not in parsed.tags
    assert parsed.sources and all(source.startswith("data:image/png;base64,") for source in parsed.sources)
    assert not re.search(r"(src|href)=\"(https?:)?//", text) and "url(" not in text
    assert len(parsed.sources) >= 2 + 1 + 2  # the loss curves, the analysis's figures, the store's pictures


def test_pipeline_report_rebuilds_the_page_of_a_run_stopped_halfway(run, tmp_path):
    """A copy of the run as a stop in vqa-tuned's stage leaves it: its record not done, the stage
    not evaluated. The page shows what exists and names what is missing."""
    path, out = run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    record = json.loads((copy / "vqa-tuned" / "step.json").read_text())
    (copy / "vqa-tuned" / "step.json").write_text(json.dumps({**record, "done": False}))
    (copy / "vqa-tuned" / "stages" / "0-vqa-more" / "eval.json").unlink()
    (copy / "report" / "report.html").unlink()
    result = CliRunner().invoke(main, ["pipeline", "report", str(path), "--out", str(copy)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[-1] == f"report: {copy / 'report' / 'report.html'}"
    assert "missing: vqa-tuned: unfinished" in lines
    assert "missing: after-bad: not run (it reads bad, which failed)" in lines
    assert "missing: comparison vqa-tuned − vqa-frozen: vqa-tuned without results" in lines
    text = Page((copy / "report" / "report.html").read_text()).text
    assert "vqa-tuned · vqa-more (cached) not evaluated" in text and "vqa-frozen · vqa-last (cached) " in text
    assert "<h2>Comparisons</h2>" not in (copy / "report" / "report.html").read_text()
    # The analysis's verdict in words beside its figures.
    verdicts = grounding_verdicts(held_out_of(json.loads((copy / "grounding" / "grounding.json").read_text())))
    assert verdicts and verdicts[0] in text


def test_pipeline_report_of_a_folder_it_never_ran_into_says_so(run, tmp_path):
    path, _ = run
    result = CliRunner().invoke(main, ["pipeline", "report", str(path), "--out", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert result.output == f"Error: {tmp_path / 'none'}: no such folder: {path} has not run into it (give its --out)\n"


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium here (Debian's chromium package; .ci/run installs it)")
def test_chromium_loads_the_page_with_no_error_and_no_request_outside_it(run, tmp_path):
    _, out = run
    page = out / "report" / "report.html"
    seen = visit(page, find_chromium())
    assert seen.errors == []
    assert seen.requests[0] == page.resolve().as_uri()
    assert all(url.startswith("data:image/png;base64,") for url in seen.requests[1:])
    (tmp_path / "screenshot.png").write_bytes(seen.screenshot)
    with Image.open(tmp_path / "screenshot.png") as shot:
        assert shot.size == (WIDTH, seen.height) and seen.height > 2000
        pixels = np.asarray(shot.convert("RGB"))
    # The page drew something on every screenful: no blank stretch where a figure failed to render.
    for top in range(0, seen.height - 900, 900):
        assert pixels[top:top + 900].std() > 5


def copied_run(run, tmp_path) -> Path:
    _, out = run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    return copy


def test_the_page_embeds_only_files_inside_the_run_folder_and_names_the_others(run, tmp_path):
    """An analysis figure that is a link out of the run folder (to a secret, or to /etc/passwd) or a
    link loop is named at the top of the page, escaped, and not embedded; a link inside it is."""
    _, out = run
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG not to be handed out with the run folder")
    grounding = out / "grounding"
    links = {grounding / "examples" / "a-<b>&leak.png": secret, grounding / "examples" / "a-passwd.png": "/etc/passwd",
             grounding / "examples" / "a-loop.png": grounding / "examples" / "a-loop.png",
             grounding / "inside.png": grounding / "grounding.png"}
    try:
        for link, target in links.items():
            link.symlink_to(target)
        missing = write_html_report(out, tmp_path / "report.html")
    finally:
        for link in links:
            link.unlink()
    text = (tmp_path / "report.html").read_text()
    for secret_bytes in (secret.read_bytes(), Path("/etc/passwd").read_bytes()):
        assert base64.b64encode(secret_bytes).decode()[:40] not in text
    for name in ("a-<b>&leak.png", "a-passwd.png", "a-loop.png"):
        line = (f"grounding: figure examples/{name} not shown: no regular file inside the run folder (a symlink out "
                "of it, or a loop)")
        assert line in missing and f"<li>{escape(line)}</li>" in text
    figure = base64.b64encode((grounding / "grounding.png").read_bytes()).decode()
    assert text.count(figure) == 2  # grounding.png, and inside.png: the same file


def test_pipeline_report_never_draws_a_picture_through_a_link_out_of_the_run(run, tmp_path):
    path, _ = run
    copy = copied_run(run, tmp_path)
    (tmp_path / "outside").mkdir()
    shutil.rmtree(copy / "report" / "pictures")
    (copy / "report" / "pictures").symlink_to(tmp_path / "outside")
    page = (copy / "report" / "report.html").read_bytes()
    result = CliRunner().invoke(main, ["pipeline", "report", str(path), "--out", str(copy)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.splitlines() == [
        f"Error: {copy / 'report' / 'pictures'} is a symlink to {tmp_path / 'outside'}, outside the output folder "
        f"{copy}: nothing is written through a symlink that leaves its output folder (remove the link, or choose "
        "another output folder)"]
    assert os.listdir(tmp_path / "outside") == [] and (copy / "report" / "report.html").read_bytes() == page


def test_pipeline_report_never_writes_into_a_folder_the_run_reads(run, tiny_world):
    path, _ = run
    images = tiny_world / "world"
    before = sorted(images.rglob("*"))
    result = CliRunner().invoke(main, ["pipeline", "report", str(path), "--out", str(images)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    [line] = result.output.splitlines()
    assert line.startswith(f"Error: out {images}: is the input step 'cache': images {images}; ")
    assert sorted(images.rglob("*")) == before
