"""Model folders a user can share: config.json as transformers reads it (model_type, architectures,
id2label, the versions that wrote it), the tokenizer beside the weights, transformers' Auto classes
after `import vlbert`, Hub ids through huggingface_hub's cache, unknown keys kept; and the versions
that meta.json, run.json and `vlbert --version` record."""

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import (AutoConfig, AutoModel, AutoModelForVisualQuestionAnswering, AutoTokenizer, BertTokenizerFast,
                          PretrainedConfig)
from transformers.utils import ModelOutput

from extract.store.schema import build_meta
from extract.store.writer import ensure_meta
from pipelines.cli import main
from tests.helpers.models import make_batch, tiny
from tests.helpers.worlds import run_config
from tests.train.test_task_inputs import VQA, answers_file
from train.engine.run_folder import RunFolder
from train.engine.trainer import Trainer
from vlbert import VLBertForPreTraining, VLBertForQuestionAnswering, VLBertModel, VLBertTransformersConfig
from vlbert.model_folder import ModelFolderError
from vlbert.modeling import load_pretrained
from vlbert.tokenization import load_tokenizer
from vlbert.utils.versions import environment_versions

ANSWERS = ["yes", "no", "red", "two", "a square", "left", "none"]  # the tiny model's 7 answers
WORDS = ["red", "green", "square", "circle", "left", "of", "the", "a", "is", "what", "colour"]


def vocabulary(folder: Path, size: int = 128) -> Path:
    """A tokenizer folder as `vlbert vocab build` writes one (vocab.txt, tokenizer_config.json), of `size` pieces."""
    folder.mkdir()
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    pieces += [f"##x{index}" for index in range(size - len(pieces))]
    (folder / "vocab.txt").write_text("".join(piece + "\n" for piece in pieces))
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return folder


def vqa_folder(tmp_path: Path) -> tuple[VLBertForQuestionAnswering, Path]:
    """A tiny VQA model (trained-looking weights) saved with its tokenizer and answers."""
    torch.manual_seed(0)
    model = VLBertForQuestionAnswering(tiny(label_names=ANSWERS)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    model.tokenizer_source = vocabulary(tmp_path / "vocab")
    model.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


def vqa_logits(model, config) -> torch.Tensor:
    with torch.no_grad():
        return model(**make_batch(config), answer_positions=torch.tensor([1, 2, 1, 3])).logits


def test_a_saved_folder_loads_with_transformers_auto_classes_with_its_tokenizer_and_answers(tmp_path):
    model, folder = vqa_folder(tmp_path)
    record = json.loads((folder / "config.json").read_text())
    assert record["model_type"] == "vlbert" and record["architectures"] == ["VLBertForQuestionAnswering"]
    assert record["id2label"] == {str(index): answer for index, answer in enumerate(ANSWERS)}
    assert record["label2id"] == {answer: index for index, answer in enumerate(ANSWERS)}
    assert record["versions"] == environment_versions() and record["versions"]["torch"] == metadata.version("torch")

    config = AutoConfig.from_pretrained(folder)
    assert isinstance(config, VLBertTransformersConfig) and isinstance(config, PretrainedConfig)
    assert (config.id2label[4], config.label2id["left"], config.num_labels) == ("a square", 5, 7)
    assert config.hidden_size == 32
    answering = AutoModelForVisualQuestionAnswering.from_pretrained(folder).eval()
    assert type(answering) is VLBertForQuestionAnswering and answering.config.label_names == ANSWERS
    assert torch.equal(vqa_logits(answering, model.config), vqa_logits(model, model.config))
    encoder = AutoModel.from_pretrained(folder)
    assert type(encoder) is VLBertModel
    assert all(torch.equal(encoder.state_dict()[name], tensor) for name, tensor in model.vlbert.state_dict().items())

    text = "What colour is the square left of the circle?"
    expected = load_tokenizer(tmp_path / "vocab")(text)["input_ids"]
    assert BertTokenizerFast.from_pretrained(folder)(text)["input_ids"] == expected
    assert AutoTokenizer.from_pretrained(folder)(text)["input_ids"] == expected
    assert (folder / "vocab.txt").read_text() == (tmp_path / "vocab" / "vocab.txt").read_text()


def test_outputs_index_and_read_as_transformers_model_outputs():
    torch.manual_seed(0)
    model = VLBertForQuestionAnswering(tiny()).eval()
    batch, positions = make_batch(model.config), torch.tensor([1, 2, 1, 3])
    labelled = model(**batch, answer_positions=positions, labels=torch.rand(4, model.config.num_answers))
    assert isinstance(labelled, ModelOutput) and isinstance(labelled.vlbert, ModelOutput)
    assert labelled[0] is labelled.loss and labelled["logits"] is labelled.logits
    assert labelled.to_tuple()[1] is labelled.logits
    unlabelled = model(**batch, answer_positions=positions)
    assert unlabelled[0] is unlabelled.logits and "loss" not in unlabelled
    assert unlabelled.vlbert[0] is unlabelled.vlbert.last_hidden_state

    mlm_labels = torch.full((4, 7), -100).index_fill(1, torch.tensor([2]), 6)
    pretraining = VLBertForPreTraining(tiny())(**batch, mlm_labels=mlm_labels)
    assert list(pretraining.keys()) == ["loss", "mlm_logits", "region_logits", "mlm_loss", "vlbert"]
    assert torch.equal(pretraining.loss, pretraining.mlm_loss)


def test_a_saved_config_key_this_version_does_not_know_is_warned_about_and_kept(tmp_path):
    _, folder = vqa_folder(tmp_path)
    record = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**record, "future_setting": {"depth": 2}}))
    with pytest.warns(UserWarning, match=r"config.json: 'future_setting' is not a key of this version's VL-BERT "
                                         r"config \(a newer version's\?\); kept as written, not used"):
        loaded = load_pretrained(folder)
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["future_setting"] == {"depth": 2}
    assert (tmp_path / "again" / "vocab.txt").is_file()  # the tokenizer travels on from the folder it came from


def test_a_folder_written_before_model_type_still_loads(tmp_path):
    model, folder = vqa_folder(tmp_path)
    record = json.loads((folder / "config.json").read_text())
    old = {key: value for key, value in record.items() if key not in ("model_type", "architectures", "versions",
                                                                       "id2label", "label2id", "label_names")}
    (folder / "config.json").write_text(json.dumps({**old, "architecture": "VLBertForQuestionAnswering"}))
    loaded = load_pretrained(folder).eval()
    assert type(loaded) is VLBertForQuestionAnswering and loaded.config.label_names is None
    assert torch.equal(vqa_logits(loaded, model.config), vqa_logits(model, model.config))


def _hub_cache(folder: Path, cache: Path, repo_id: str, revision: str) -> None:
    """`folder`'s files in a huggingface_hub cache, laid out as the Hub's downloads lay them out: blobs by
    their hash, a snapshot of links to them, refs/main naming the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for file in folder.iterdir():
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        (repo / "blobs" / digest).write_bytes(file.read_bytes())
        (repo / "snapshots" / revision / file.name).symlink_to(Path("..", "..", "blobs", digest))


HUB_SCRIPT = """
import sys
import vlbert
print("light" if "torch" not in sys.modules and "transformers" not in sys.modules else "heavy")
from transformers import AutoConfig, AutoModelForVisualQuestionAnswering
config = AutoConfig.from_pretrained("org/vlbert-tiny")
model = AutoModelForVisualQuestionAnswering.from_pretrained("org/vlbert-tiny")
loaded = vlbert.load_pretrained("org/vlbert-tiny")
print(type(config).__name__, config.id2label[2], type(model).__name__, type(loaded).__name__)
try:
    vlbert.load_pretrained("org/absent")
except vlbert.model_folder.ModelFolderError as exc:
    print(exc)
"""


def test_after_import_vlbert_a_hub_id_loads_from_huggingface_hub_s_cache_offline(tmp_path):
    _, folder = vqa_folder(tmp_path)
    _hub_cache(folder, tmp_path / "hub", "org/vlbert-tiny", "0123456789abcdef0123456789abcdef01234567")
    environment = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", HUB_SCRIPT], capture_output=True, text=True, env=environment,
                            cwd=Path(__file__).parents[2], timeout=300)
    assert result.returncode == 0, result.stderr
    light, loaded, missing = result.stdout.splitlines()
    assert light == "light"  # `import vlbert` loads neither torch nor transformers; registering waited for them
    assert loaded == "VLBertTransformersConfig red VLBertForQuestionAnswering VLBertForQuestionAnswering"
    assert missing.startswith("org/absent: no such model folder, nor a Hugging Face Hub model that huggingface_hub "
                              "finds (")


def test_a_name_that_is_no_folder_is_one_line(tmp_path):
    with pytest.raises(ModelFolderError) as absent:
        VLBertModel.from_pretrained("org/absent", cache_dir=tmp_path, local_files_only=True)
    assert str(absent.value).startswith("org/absent: no such model folder, nor a Hugging Face Hub model")
    assert "\n" not in str(absent.value)
    with pytest.raises(ModelFolderError, match=r"^runs/x/stages/0-vqa/final: no such model folder$"):
        load_pretrained("runs/x/stages/0-vqa/final")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelFolderError, match="weights.bin: a file, expected a model folder"):
        load_pretrained(tmp_path / "weights.bin")
    with pytest.raises(ModelFolderError, match=r": not a model folder \(no config.json\)$"):
        load_pretrained(tmp_path)


@pytest.fixture(scope="module")
def world(tiny_world):
    return tiny_world  # read only: every run here writes under its test's tmp_path


def test_a_trained_run_s_folders_carry_the_tokenizer_and_answers_and_run_json_the_versions(world, tmp_path,
                                                                                           monkeypatch):
    answers = answers_file(world, tmp_path)
    run = run_config(world, str(tmp_path / "run"), [replace(VQA, options={"answers": str(answers)})])
    Trainer(run, log=lambda _: None).fit()
    folder = RunFolder(tmp_path / "run")
    stage = folder.stage(0, "vqa")
    for saved in (stage.final, *stage.checkpoints()):
        config = AutoConfig.from_pretrained(saved)
        assert list(config.id2label.values()) == answers.read_text().splitlines()
        assert (saved / "vocab.txt").read_text() == (world / "vocab" / "vocab.txt").read_text()
        assert json.loads((saved / "tokenizer_config.json").read_text())["tokenizer_class"] == "BertTokenizer"
    assert stage.checkpoints()  # the stage's last step wrote one
    assert folder.versions() == [environment_versions()]

    # Versions are records: a run of other versions goes on, adding the environment that continues it.
    other = {**environment_versions(), "torch": "0.0.1"}
    monkeypatch.setattr("train.engine.run_folder.environment_versions", lambda: other)
    Trainer(run, log=lambda _: None).fit()
    assert folder.versions() == [environment_versions(), other]
    assert "versions" not in folder.config()


def test_meta_json_records_the_versions_and_a_store_of_other_versions_resumes(tmp_path):
    meta = build_meta(feature_dim=8, mode="imported", num_classes=5)
    assert meta["versions"] == [environment_versions()]
    (tmp_path / "store").mkdir()
    for recorded in ({**meta, "versions": [{**environment_versions(), "torch": "0.0.1"}]},
                     {key: value for key, value in meta.items() if key != "versions"}):  # a store from before
        (tmp_path / "store" / "meta.json").write_text(json.dumps(recorded))
        assert ensure_meta(tmp_path / "store", meta)["features"]["dim"] == 8


def test_vlbert_version_prints_the_package_cuda_and_cudnn_versions():
    result = CliRunner().invoke(main, ["--version"])
    versions = environment_versions()
    assert result.exit_code == 0 and result.output.splitlines() == [
        f"vlbert-pipeline {metadata.version('vlbert-pipeline')}", f"python {versions['python']}",
        f"torch {metadata.version('torch')}", f"torchvision {metadata.version('torchvision')}",
        f"transformers {metadata.version('transformers')}", f"tokenizers {metadata.version('tokenizers')}",
        f"CUDA {torch.version.cuda or 'none (a CPU-only torch)'}", f"cuDNN {versions['cudnn'] or 'none'}"]
