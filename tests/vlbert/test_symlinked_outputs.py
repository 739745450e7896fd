"""Nothing is written through a symlink that leaves its output folder (vlbert/utils/paths.py `checked`,
which every writer calls): each writing command refuses in one line, exit status 2, and the folder
the link points to is as it was. Links that stay inside the output folder are followed, and an output
folder given as a symlink is the user's choice."""

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from extract.store import FeatureStoreWriter, build_meta
from pipelines.cli import main
from pipelines.world.tiny import TINY_MODEL
from tests.helpers.pipelines import write_image
from tests.helpers.stores import DIM, synthetic_record
from tests.vlbert.test_outputs_apart import snapshot
from vlbert.utils.atomic import made_folder, write_atomically
from vlbert.utils.errors import USAGE
from vlbert.utils import paths
from vlbert.utils.paths import EscapingPathError, checked, output_folder


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside every output folder, which a planted link points to."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "keep.txt").write_text("never overwritten\n")
    return folder


def refused(*arguments) -> str:
    """The error line a refused command ends with (exit status 2, no traceback)."""
    result = CliRunner().invoke(main, [str(a) for a in arguments])
    assert result.exit_code == USAGE and "Traceback" not in result.output, result.output
    return result.output.splitlines()[-1]


def escape_line(link: Path, target: Path, out: Path) -> str:
    return (f"Error: {link} is a symlink to {target}, outside the output folder {out}: nothing is written through a "
            "symlink that leaves its output folder (remove the link, or choose another output folder)")


def test_writes_follow_links_inside_the_output_folder_and_never_one_out_of_it(tmp_path, outside):
    out = tmp_path / "out"
    (out / "inner").mkdir(parents=True)
    (out / "alias").symlink_to(out / "inner")
    (out / "away").symlink_to(outside)
    (out / "keep.txt").symlink_to(outside / "keep.txt")
    before = snapshot(outside)
    output_folder(out)
    write_atomically(out / "alias" / "a.txt", "inside\n")
    assert (out / "inner" / "a.txt").read_text() == "inside\n" and made_folder(out / "new" / "deep").is_dir()
    for write in (lambda: write_atomically(out / "away" / "a.txt", "x"), lambda: made_folder(out / "away" / "sub"),
                  lambda: write_atomically(out / "alias" / ".." / "away" / "b.txt", "x")):
        with pytest.raises(EscapingPathError) as error:
            write()
        assert f"Error: {error.value}" == escape_line(out / "away", outside, out)
    with pytest.raises(EscapingPathError, match=f"^{out / 'keep.txt'} is a symlink to {outside / 'keep.txt'}, "):
        write_atomically(out / "keep.txt", "x")
    assert snapshot(outside) == before and not (outside / "sub").exists()
    assert checked(tmp_path / "elsewhere" / "x") == tmp_path / "elsewhere" / "x"  # below no output folder


def test_an_output_folder_given_as_a_symlink_is_the_users_choice(tmp_path, outside):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "away").symlink_to(outside)
    output_folder(tmp_path / "link")
    write_atomically(tmp_path / "link" / "a.txt", "mine\n")
    assert (tmp_path / "real" / "a.txt").read_text() == "mine\n"
    with pytest.raises(EscapingPathError, match=f"^{tmp_path / 'link' / 'away'} is a symlink to {outside}, "):
        write_atomically(tmp_path / "link" / "away" / "a.txt", "x")


def test_a_folder_declared_inside_another_resolves_inside_it(tmp_path, outside):
    out = tmp_path / "out"
    out.mkdir()
    (out / "step").symlink_to(outside)
    output_folder(out)
    with pytest.raises(EscapingPathError, match=f"^{out / 'step'} is a symlink to {outside}, "):
        output_folder(out / "step")


def test_a_folder_declared_again_is_one_entry_and_still_keeps_its_writes_inside(tmp_path, outside):
    """A long-lived process (a test session, a pipeline running its steps in-process) declares the same
    folders again and again: the record of them stays one entry a folder, so `checked` stays cheap."""
    out = tmp_path / "out"
    output_folder(out)
    declared = len(paths._DECLARED)
    for _ in range(1000):
        output_folder(out)
    assert len(paths._DECLARED) == declared
    out.mkdir()
    (out / "link").symlink_to(outside)
    with pytest.raises(EscapingPathError, match=f"^{out / 'link'} is a symlink to {outside}, "):
        checked(out / "link" / "keep.txt")


def test_a_planted_temporary_is_replaced_not_written_through(tmp_path, outside):
    out = tmp_path / "out"
    out.mkdir()
    (out / f".a.txt.{os.getpid()}.tmp").symlink_to(outside / "keep.txt")
    write_atomically(out / "a.txt", "new\n")
    assert (out / "a.txt").read_text() == "new\n" and not (out / "a.txt").is_symlink()
    assert (outside / "keep.txt").read_text() == "never overwritten\n"


# ---- each writing command ---------------------------------------------------------------------------

@pytest.fixture
def images_and_store(tmp_path) -> tuple[Path, Path]:
    """A folder of two images (images/a, b) and a store of them that records it as its images root."""
    root = tmp_path / "pictures"
    for seed, name in enumerate(("images/a.png", "b.png")):
        write_image(root / name, seed)
    store = tmp_path / "store"
    meta = build_meta(feature_dim=DIM, mode="imported", num_classes=7, has_attributes=False, images_root=str(root))
    with FeatureStoreWriter(store, meta) as writer:
        writer.commit({"images/a": synthetic_record("images/a"), "b": synthetic_record("b")})
    return root, store


def test_cache_show_never_draws_over_the_images_root_the_store_records(images_and_store):
    root, store = images_and_store
    before = snapshot(root)
    line = refused("cache", "show", store, "b", "--out", root)
    assert line.startswith(f"Error: --out {root}: is the input images root of CACHE {root}; ")
    assert snapshot(root) == before


def test_cache_show_never_draws_over_an_image_it_reads_through_a_link(images_and_store, tmp_path):
    root, store = images_and_store
    out = tmp_path / "drawn"
    out.mkdir()
    os.replace(root / "b.png", out / "b.png")  # the images root's b.png is a link into --out
    (root / "b.png").symlink_to(out / "b.png")
    before = snapshot(out)
    line = refused("cache", "show", store, "b", "--out", out)
    assert line.startswith(f"Error: --out {out}: holds the input image {root / 'b.png'}; ")
    assert snapshot(out) == before


def test_cache_show_never_draws_through_a_folder_link_out_of_its_out(images_and_store, tmp_path, outside):
    _, store = images_and_store
    out = tmp_path / "drawn"
    out.mkdir()
    (out / "images").symlink_to(outside)
    before = snapshot(outside)
    assert refused("cache", "show", store, "images/a", "--out", out) == escape_line(out / "images", outside, out)
    assert snapshot(outside) == before


def test_extract_never_writes_a_shard_through_a_link(tmp_path, outside):
    for seed in range(2):
        write_image(tmp_path / "images" / f"{seed}.png", seed)
    out = tmp_path / "store"
    out.mkdir()
    (out / "shards").symlink_to(outside)
    before = snapshot(outside)
    line = refused("extract", "--images", tmp_path / "images", "--out", out, "--detector", "tiny", "--quiet")
    assert line == escape_line(out / "shards", outside, out) and snapshot(outside) == before


def test_world_generate_never_writes_images_through_a_link(tmp_path, outside):
    out = tmp_path / "world"
    out.mkdir()
    (out / "images").symlink_to(outside)
    before = snapshot(outside)
    assert refused("world", "generate", "--out", out, "--images", 3) == escape_line(out / "images", outside, out)
    assert snapshot(outside) == before


def test_vocab_build_never_writes_through_a_planted_temporary(tmp_path, outside):
    (tmp_path / "texts.txt").write_text("a dog runs\nthe cat sits\n")
    out = tmp_path / "vocab"
    out.mkdir()
    (out / "vocab.txt.tmp").symlink_to(outside / "keep.txt")
    before = snapshot(outside)
    line = refused("vocab", "build", tmp_path / "texts.txt", "--out", out, "--min-frequency", 1)
    assert line == escape_line(out / "vocab.txt.tmp", outside / "keep.txt", out) and snapshot(outside) == before


def test_data_prepare_never_writes_through_a_planted_temporary(tmp_path, outside):
    root = tmp_path / "cc"
    root.mkdir()
    (root / "Validation_GCC-1.1.0-Validation.tsv").write_text("a cat\thttp://b/0.jpg\n")
    (tmp_path / "images" / "validation" / "00000").mkdir(parents=True)
    (tmp_path / "images" / "validation" / "00000" / "000000000.jpg").write_bytes(b"never decoded")
    out = tmp_path / "prepared"
    out.mkdir()
    (out / "images.txt.tmp").symlink_to(outside / "keep.txt")
    before = snapshot(outside)
    line = refused("data", "prepare", "cc", "--root", root, "--images", tmp_path / "images", "--out", out)
    assert line == escape_line(out / "images.txt.tmp", outside / "keep.txt", out) and snapshot(outside) == before


def test_train_never_writes_a_stage_through_a_link(tiny_world, tmp_path, outside):
    out = tmp_path / "run"
    out.mkdir()
    (out / "stages").symlink_to(outside)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "out": str(out), "store": str(tiny_world / "cache"), "vocabulary": str(tiny_world / "vocab"),
        "train_annotations": str(tiny_world / "world" / "train.jsonl"),
        "eval_annotations": str(tiny_world / "world" / "val.jsonl"), "max_length": 40, "model": dict(TINY_MODEL),
        "stages": [{"name": "vqa", "task": "vqa", "steps": 1, "batch_size": 4, "num_workers": 0}]}))
    before = snapshot(outside)
    assert refused("train", config) == escape_line(out / "stages", outside, out) and snapshot(outside) == before


def test_analyze_never_writes_an_example_through_a_link(tiny_world, tmp_path, outside):
    from extract.store.reader import FeatureStore
    from vlbert import VLBertConfig
    from vlbert.modeling import VLBertForPreTraining
    from vlbert.tokenization import load_tokenizer

    config = VLBertConfig(**TINY_MODEL, vocab_size=len(load_tokenizer(tiny_world / "vocab")),
                          visual_feature_size=FeatureStore(tiny_world / "cache").meta["features"]["dim"])
    VLBertForPreTraining(config).save_pretrained(tmp_path / "model")
    out = tmp_path / "grounding"
    out.mkdir()
    (out / "examples").symlink_to(outside)
    before = snapshot(outside)
    line = refused("analyze", "grounding", "--model", tmp_path / "model", "--store", tiny_world / "cache",
                   "--annotations", tiny_world / "world" / "val.jsonl", "--vocabulary", tiny_world / "vocab",
                   "--images", tiny_world / "world", "--examples", 1, "--max-items", 4, "--out", out)
    assert line == escape_line(out / "examples", outside, out) and snapshot(outside) == before


# ---- pipeline run -----------------------------------------------------------------------------------

def world_pipeline(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "links", "steps": [{"name": "world", "kind": "world", "images": 3}]}))
    return path


def test_pipeline_run_never_empties_or_writes_a_step_folder_through_a_link(tmp_path, outside):
    out = tmp_path / "run"
    out.mkdir()
    (out / "world").symlink_to(outside)
    before = snapshot(outside)
    line = refused("pipeline", "run", world_pipeline(tmp_path), "--out", out, "--jobs", 1)
    assert line.endswith(escape_line(out / "world", outside, out).removeprefix("Error: "))
    assert snapshot(outside) == before


def test_a_resumed_step_never_writes_through_a_link_in_its_folder(tmp_path, outside):
    """A step that resumes keeps its folder, and a link planted in it since."""
    path, out = world_pipeline(tmp_path), tmp_path / "run"
    assert CliRunner().invoke(main, ["pipeline", "run", str(path), "--out", str(out), "--jobs", "1"]).exit_code == 0
    record = json.loads((out / "world" / "step.json").read_text())
    (out / "world" / "step.json").write_text(json.dumps({**record, "done": False}))
    shutil.rmtree(out / "world" / "images")
    (out / "world" / "images").symlink_to(outside)
    before = snapshot(outside)
    line = refused("pipeline", "run", path, "--out", out, "--jobs", 1)
    assert line.endswith(escape_line(out / "world" / "images", outside, out).removeprefix("Error: "))
    assert snapshot(outside) == before


def test_pipeline_run_refuses_an_out_inside_a_folder_a_step_reads(tmp_path):
    images = tmp_path / "images"
    for seed in range(2):
        write_image(images / f"{seed}.png", seed)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "over", "steps": [
        {"name": "cache", "kind": "extract", "images": str(images), "detector": "tiny", "progress": False}]}))
    before = snapshot(images)
    line = refused("pipeline", "run", path, "--out", images / "run", "--jobs", 1)
    assert line.startswith(f"Error: out {images / 'run'}: lies inside the input step 'cache': images {images}; ")
    assert snapshot(images) == before and sorted(os.listdir(images)) == ["0.png", "1.png"]
