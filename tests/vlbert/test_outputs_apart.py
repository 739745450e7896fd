"""No command writes over what it reads: every output that is, lies inside or holds one of the
command's inputs is refused in one line before anything is written (vlbert/utils/paths.py)."""

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from extract.store import FeatureStoreWriter
from pipelines.cli import main
from tests.helpers.stores import QUIET_LOSSES, meta, synthetic_record
from train.engine.config import RunConfig, StageConfig
from vlbert.utils.errors import USAGE
from vlbert.utils.paths import OutputOverlapError, check_apart


def refusal(*arguments) -> str:
    """The one line a refused command prints; fails when it printed more or did not exit 2."""
    result = CliRunner().invoke(main, [str(a) for a in arguments])
    assert result.exit_code == USAGE and "Traceback" not in result.output, result.output
    [line] = result.output.splitlines()
    return line


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_output_that_is_lies_inside_or_holds_an_input_is_refused_resolved(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(data)
    for out, relation in ((data, "is"), (data / "sub" / "out", "lies inside"), (tmp_path, "holds"),
                          (tmp_path / "link" / "out", "lies inside"), (data / "sub" / ".." / ".." / "data", "is")):
        with pytest.raises(OutputOverlapError) as error:
            check_apart(out, [("--root", data), ("--images", None)])
        assert str(error.value) == (f"--out {out}: {relation} the input --root {data}; an output is never written over "
                                    "an input (nor where a later run would read it as one): choose another --out")
    check_apart(tmp_path / "data2", [("--root", data)])  # a name that only starts like the input's
    check_apart(tmp_path / "out", [("--root", data), ("--images", tmp_path / "images")])
    with pytest.raises(OutputOverlapError, match="lies inside the input --images"):  # the nearest is named
        check_apart(data / "images" / "out", [("--root", data), ("--images", data / "images")])


@pytest.fixture
def store(tmp_path) -> Path:
    root = tmp_path / "store"
    with FeatureStoreWriter(root, meta()) as writer:
        writer.commit({"a": synthetic_record("a"), "b": synthetic_record("b")})
    return root


@QUIET_LOSSES
@pytest.mark.parametrize("fmt, out, relation", [
    ("tsv", "meta.json", "lies inside"), ("h5", "shards/shard-00000-of-00001/data.mdb", "lies inside"),
    ("npz", ".", "is"), ("npz", "..", "holds"), ("npz", "exported", "lies inside")])
def test_cache_export_never_writes_over_the_store_it_reads(store, fmt, out, relation):
    before = snapshot(store.parent)
    line = refusal("cache", "export", store, "--format", fmt, "--out", store / out)
    assert line.startswith(f"Error: --out {store / out}: {relation} the input CACHE {store}; ")
    assert snapshot(store.parent) == before
    result = CliRunner().invoke(main, ["cache", "verify", str(store)])
    assert result.exit_code == 0 and "OK (2 records" in result.output


@QUIET_LOSSES
def test_cache_export_through_a_symlink_to_the_store_is_refused(store, tmp_path):
    (tmp_path / "alias").symlink_to(store)
    before = snapshot(store)
    line = refusal("cache", "export", store, "--format", "tsv", "--out", tmp_path / "alias" / "meta.json")
    assert line.startswith(f"Error: --out {tmp_path / 'alias' / 'meta.json'}: lies inside the input CACHE {store}; ")
    assert snapshot(store) == before


@QUIET_LOSSES
def test_an_out_that_cannot_be_resolved_or_is_a_folder_for_a_file_is_refused(store, tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    line = refusal("cache", "export", store, "--format", "tsv", "--out", tmp_path / "loop" / "x.tsv")
    assert line.startswith(f"Error: {tmp_path / 'loop' / 'x.tsv'}: cannot be resolved (")
    folder = tmp_path / "folder"
    folder.mkdir()
    result = CliRunner().invoke(main, ["cache", "export", str(store), "--format", "h5", "--out", str(folder)])
    assert result.exit_code == 1 and result.output == f"Error: {folder}: a folder; a h5 export is one file\n"


@QUIET_LOSSES
def test_cache_import_never_writes_into_its_source(store, tmp_path):
    assert CliRunner().invoke(main, ["cache", "export", str(store), "--format", "npz", "--out",
                                     str(tmp_path / "npz")]).exit_code == 0
    before = snapshot(tmp_path / "npz")
    line = refusal("cache", "import", tmp_path / "npz", "--format", "npz", "--out", tmp_path / "npz" / "store")
    assert line.startswith(f"Error: --out {tmp_path / 'npz' / 'store'}: lies inside the input SRC {tmp_path / 'npz'}; ")
    assert snapshot(tmp_path / "npz") == before


def test_vocab_build_never_replaces_or_rereads_its_input(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "vocab.txt").write_text("a dog runs\nthe cat sits\n")
    (folder / "more.txt").write_text("a cat runs\n")
    before = snapshot(folder)
    line = refusal("vocab", "build", folder / "vocab.txt", "--out", folder)
    assert line.startswith(f"Error: --out {folder}: holds the input file {folder / 'vocab.txt'}; ")
    line = refusal("vocab", "build", *sorted(folder.glob("*.txt")), "--out", folder)  # D/*.txt --out D
    assert line.startswith(f"Error: --out {folder}: holds the input file ")
    assert snapshot(folder) == before


def test_data_prepare_refuses_an_out_that_holds_its_root(tmp_path):
    (tmp_path / "published" / "vcr").mkdir(parents=True)
    line = refusal("data", "prepare", "vcr", "--root", tmp_path / "published" / "vcr", "--out", tmp_path / "published")
    assert line.startswith(f"Error: --out {tmp_path / 'published'}: holds the input --root ")
    assert sorted(p.name for p in (tmp_path / "published").iterdir()) == ["vcr"]


@pytest.mark.parametrize("option, out", [("--images", "images/store"), ("--weights", "weights"),
                                         ("--list", "lists"), ("--images", "images")])
def test_extract_refuses_an_out_that_is_inside_or_holds_an_input(tmp_path, option, out):
    (tmp_path / "images").mkdir()
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "model.pkl").write_bytes(b"never read")
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "images.txt").write_text("a.png\n")
    before = snapshot(tmp_path)
    line = refusal("extract", "--images", tmp_path / "images", "--out", tmp_path / out, "--detector", "tiny",
                   "--weights", tmp_path / "weights" / "model.pkl", "--list", tmp_path / "lists" / "images.txt")
    assert line.startswith(f"Error: --out {tmp_path / out}: ") and f" the input {option} " in line
    assert snapshot(tmp_path) == before and not (tmp_path / "images" / "store").exists()


def test_the_other_writing_commands_refuse_an_out_over_an_input(tmp_path):
    for folder in ("model", "store", "vocab", "world"):
        (tmp_path / folder).mkdir()
    (tmp_path / "model" / "vl-bert.model").write_bytes(b"never read")
    (tmp_path / "val.jsonl").write_text("")
    before = snapshot(tmp_path)
    line = refusal("convert-official", tmp_path / "model" / "vl-bert.model", "--out", tmp_path / "model")
    assert line.startswith(f"Error: --out {tmp_path / 'model'}: holds the input SOURCE ")
    line = refusal("analyze", "grounding", "--model", tmp_path / "model", "--store", tmp_path / "store",
                   "--annotations", tmp_path / "val.jsonl", "--vocabulary", tmp_path / "vocab",
                   "--out", tmp_path / "store" / "analysis")
    assert line.startswith(f"Error: --out {tmp_path / 'store' / 'analysis'}: lies inside the input --store ")
    weights = tmp_path / "world" / "d.safetensors"
    line = refusal("world", "train-detector", "--world", tmp_path / "world", "--out", weights)
    assert line.startswith(f"Error: --out {weights}: lies inside the input --world ")
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path / "store")) == []


def run_values(tmp_path: Path, out: Path) -> dict:
    for folder in ("cache", "vocab", "world"):
        (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "world" / "train.jsonl").write_text("")
    return dict(out=str(out), store=str(tmp_path / "cache"), train_annotations=str(tmp_path / "world" / "train.jsonl"),
                eval_annotations=str(tmp_path / "world" / "train.jsonl"), vocabulary=str(tmp_path / "vocab"))


def test_a_run_folder_over_an_input_of_the_run_is_refused(tmp_path):
    for out, relation, field in ((tmp_path / "cache" / "run", "lies inside", "store"),
                                 (tmp_path / "world", "holds", "train_annotations"),
                                 (tmp_path / "vocab", "is", "vocabulary")):
        run = RunConfig(stages=[StageConfig(name="v", task="vqa", steps=1)], **run_values(tmp_path, out))
        with pytest.raises(OutputOverlapError, match=f"^out {out}: {relation} the input {field} "):
            run.check_paths()
    apart = RunConfig(stages=[StageConfig(name="v", task="vqa", steps=1)], **run_values(tmp_path, tmp_path / "run"))
    apart.check_paths()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**run_values(tmp_path, tmp_path / "cache"),
                                      "stages": [{"name": "v", "task": "vqa", "steps": 1}]}))
    line = refusal("train", config)
    assert line.startswith(f"Error: out {tmp_path / 'cache'}: is the input store {tmp_path / 'cache'}; ")
    assert sorted(os.listdir(tmp_path / "cache")) == []
