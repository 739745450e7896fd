"""Pre-training on Conceptual Captions and SBU Captions from img2dataset's tar shards: the demo
world's corpora (pipelines/world/corpus_files.py) through pipelines/configs/pretrain_cc_sbu.yaml,
prepare → sharded extraction from the tars → one stage mixing both corpora."""

import json
from pathlib import Path

import pytest
from transformers import BertConfig, BertForPreTraining

from extract.store.reader import FeatureStore
from pipelines.world import generate_world
from pipelines.world.corpus_files import write_corpus_files
from tests.helpers.pipelines import run_pipeline_file, tiny_checkpoints
from tests.pipelines.test_benchmark_pipelines import WORDS, shrunk
from train.data.prepare import prepare_dataset
from train.data.sources.captions import CONCEPTUAL_CAPTIONS
from train.data.sources.sbu import SOURCE as SBU
from train.engine.run_folder import RunFolder
from vlbert.tokenization import load_tokenizer

pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpora")
    generate_world(root / "world", 30, seed=3)  # 24 training images (16 CC, 8 SBU), 6 validation
    write_corpus_files(root / "world", root / "corpora")
    return root


def test_world_corpora_prepare_from_their_published_files_with_one_failed_download_each(corpora, tmp_path) -> None:
    files = corpora / "corpora"
    assert sorted(path.name for path in (files / "images" / "sbu").iterdir()) == [
        "00000.parquet", "00000.tar", "00000_stats.json"]
    cc = prepare_dataset(CONCEPTUAL_CAPTIONS, files / "cc", tmp_path / "cc", files / "images", log=lambda _: None)
    sbu = prepare_dataset(SBU, files / "sbu", tmp_path / "sbu", files / "images", log=lambda _: None)

    assert cc["splits"] == {"training": {"items": 15, "skipped": 1, "missing_images": 1},
                            "validation": {"items": 5, "skipped": 1, "missing_images": 1}}
    assert sbu["splits"] == {"training": {"items": 7, "skipped": 1, "missing_images": 1}}
    world = {record["captions"][0]: record["file"] for split in ("train", "val")
             for record in map(json.loads, (corpora / "world" / f"{split}.jsonl").read_text().splitlines())}
    records = [json.loads(line) for line in (tmp_path / "sbu" / "training.jsonl").read_text().splitlines()]
    assert [record["file"] for record in records] == [f"sbu/00000/{row:09d}.jpg" for row in range(7)]
    assert all(record["captions"][0] in world for record in records)  # the world's captions, on their rows


def test_the_cc_sbu_pipeline_extracts_from_tar_shards_and_pretrains_on_both_corpora(corpora, tmp_path) -> None:
    files = corpora / "corpora"
    settings = {"cc": str(files / "cc"), "sbu": str(files / "sbu"), "images": str(files / "images"),
                "corpus": str(corpora / "world" / "corpus.txt"), "features.shards": "2",
                **{k: v for k, v in tiny_checkpoints(tmp_path, WORDS).items() if k != "vlbert"}}
    bert = BertForPreTraining(BertConfig(vocab_size=len(load_tokenizer(settings["bert"])), hidden_size=32,
                                         num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
    bert.save_pretrained(settings["bert"])
    out = tmp_path / "run"

    run_pipeline_file(shrunk("pretrain_cc_sbu.yaml", tmp_path), out, settings)

    cc = [json.loads(line)["file"] for line in (out / "cc" / "training.jsonl").read_text().splitlines()]
    sbu = [json.loads(line)["file"] for line in (out / "sbu" / "training.jsonl").read_text().splitlines()]
    store = FeatureStore(out / "features")
    for file in cc + sbu:
        assert file.removesuffix(".jpg") in store  # prepare's names are extraction's keys
    mixture = RunFolder(out / "pretrain").mixture()
    assert [(Path(part["file"]).parent.name, part["items"]["captions"], part["share"]["captions"])
            for part in mixture] == [("cc", 15, round(15 / 22, 6)), ("sbu", 7, round(7 / 22, 6))]
    logged = [json.loads(line) for line in RunFolder(out / "pretrain").metrics_file.read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [1, 2]
