"""`vlbert vocab build`: a WordPiece vocabulary from annotation files and text corpora, as
vlbert.tokenization reads it; bad inputs refused with one line, a rebuild replacing the whole."""

import json
import re

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from train.data.files import DataError
from train.data.wordpiece import build_vocabulary
from vlbert import VLBertConfig
from vlbert.tokenization import load_tokenizer

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

RECORDS = [
    {"file": "a/1.jpg", "captions": ["A man riding a horse.", "Horses graze by the café"],
     "vqa": [{"question_id": 7, "question": "What colour is the saddle?", "answers": ["brown", "tan"]}]},
    {"file": "a/2.jpg", "refs": [{"sent_id": 3, "text": "leftmost zebra", "box": [0, 0, 4, 4]}]},
    {"file": "b/3.jpg", "objects": ["person", "dog"],
     "vcr": [{"annot_id": "val-0", "question": ["is", ["Casey", 0], "near", ["dog", 1], "?"],
              "answer_choices": [["yes"], ["no"], ["maybe"], ["quizzically"]],
              "rationale_choices": [["because", "jumping"]] * 4, "answer_label": 1, "rationale_label": 2}]},
]
CORPUS = ["The horse jumped over the fence.", "", "A zebra is a striped horse; naïve riders wonder."]


def run(*args):
    return CliRunner().invoke(main, ["vocab", "build", *map(str, args)])


def write_inputs(folder):
    folder.mkdir(exist_ok=True)
    annotations, corpus = folder / "train.jsonl", folder / "corpus.txt"
    annotations.write_text("".join(json.dumps(record) + "\n" for record in RECORDS), encoding="utf-8")
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    return annotations, corpus


def words_of_inputs():
    texts = [*RECORDS[0]["captions"], RECORDS[0]["vqa"][0]["question"], *RECORDS[0]["vqa"][0]["answers"],
             RECORDS[1]["refs"][0]["text"], "Casey near dog quizzically because jumping", *CORPUS]
    return {word for text in texts for word in re.findall(r"\w+|[^\w\s]", text)}


def vocabulary(folder):
    return (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()


def test_a_vocabulary_of_annotations_and_a_corpus_tokenizes_their_words_without_unk(tmp_path):
    out = tmp_path / "vocab"
    result = run(*write_inputs(tmp_path / "data"), "--out", out, "--size", 1000, "--min-frequency", 1)
    tokens = vocabulary(out)
    assert result.exit_code == 0, result.output
    assert result.output == (f"{len(tokens)} tokens, fewer than size 1000: the texts hold no other piece at "
                             f"min_frequency 1\n{out / 'vocab.txt'}: {len(tokens)} tokens (uncased)\n")
    assert sorted(path.name for path in out.iterdir()) == ["tokenizer_config.json", "vocab.txt"]
    tokenizer = load_tokenizer(out)
    assert tokens[:5] == SPECIAL_TOKENS and len(tokenizer) == len(tokens)
    assert tokenizer.pad_token_id == VLBertConfig.pad_token_id == 0
    assert [tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id] == [
        1, 2, 3, 4]
    for word in words_of_inputs():
        assert "[UNK]" not in tokenizer.tokenize(word), word
    # uncased as BERT uncased: lower-cased, accents stripped
    assert tokenizer.tokenize("Café NAÏVE Quizzically") == tokenizer.tokenize("cafe naive quizzically")
    assert {"quizzically", "casey", "zebra", "horse"} <= set(tokens)


def test_a_cased_vocabulary_keeps_case_and_accents_when_loaded(tmp_path):
    out = tmp_path / "vocab"
    result = run(*write_inputs(tmp_path / "data"), "--out", out, "--size", 1000, "--min-frequency", 1, "--cased")
    assert result.exit_code == 0 and result.output.endswith("tokens (cased)\n"), result.output
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"do_lower_case": False}
    tokenizer = load_tokenizer(out)
    for word in words_of_inputs():
        pieces = tokenizer.tokenize(word)
        assert "".join(piece.removeprefix("##") for piece in pieces) == word, pieces
    assert tokenizer.tokenize("Casey") != tokenizer.tokenize("casey")


def test_the_size_is_the_number_of_tokens_and_one_too_small_for_the_characters_is_refused(tmp_path):
    inputs = write_inputs(tmp_path / "data")
    size = len(vocabulary_of(inputs, tmp_path / "full", size=5_000)) - 20
    assert run(*inputs, "--out", tmp_path / "sized", "--size", size, "--min-frequency", 1).exit_code == 0
    assert vocabulary(tmp_path / "sized") == vocabulary(tmp_path / "full")[:size]
    with pytest.raises(DataError, match=r"^size 30 is too small: the texts need at least \d+ tokens, 5 special"):
        build_vocabulary(list(inputs), tmp_path / "tiny", size=30)
    result = run(*inputs, "--out", tmp_path / "tiny", "--size", 30)
    assert result.exit_code == 2 and result.output.startswith("Error: size 30 is too small")
    assert result.output.count("\n") == 1 and not (tmp_path / "tiny").exists()


def vocabulary_of(inputs, out, size):
    """The tokens of a vocabulary built through the API; nothing logged on small inputs but a
    vocabulary smaller than `size`."""
    logged = []
    assert build_vocabulary(list(inputs), out, size=size, min_frequency=1, log=logged.append) == out / "vocab.txt"
    tokens = vocabulary(out)
    assert logged == ([f"{len(tokens)} tokens, fewer than size {size}: the texts hold no other piece at "
                       "min_frequency 1"] if len(tokens) < size else [])
    return tokens


def test_a_rebuild_replaces_the_vocabulary_whole_and_a_failed_one_leaves_it(tmp_path):
    annotations, corpus = write_inputs(tmp_path / "data")
    out = tmp_path / "vocab"
    assert run(annotations, corpus, "--out", out, "--cased").exit_code == 0
    assert run(corpus, "--out", out, "--size", 60, "--min-frequency", 1).exit_code == 0
    # the same file as a fresh build: nothing of the first is left, and builds are reproducible
    assert vocabulary(out) == vocabulary_of([corpus], tmp_path / "fresh", size=60)
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"do_lower_case": True}
    before = (out / "vocab.txt").read_bytes()
    (tmp_path / "empty.txt").write_text("\n  \n")
    assert run(corpus, tmp_path / "empty.txt", "--out", out).exit_code == 2
    assert (out / "vocab.txt").read_bytes() == before
    assert sorted(path.name for path in out.iterdir()) == ["tokenizer_config.json", "vocab.txt"]


def bad_inputs(tmp_path):
    """(arguments, the error) for each kind of bad input."""
    annotations, corpus = write_inputs(tmp_path / "data")
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text("\n \n\t\n")
    (tmp_path / "latin1.txt").write_bytes("first line\ncaf\xe9\n".encode("latin-1"))
    (tmp_path / "bad.jsonl").write_text(json.dumps(RECORDS[0]) + "\n" + '{"captions": ["no file"]}\n')
    (tmp_path / "untexted.jsonl").write_text('{"file": "a.jpg"}\n')
    (tmp_path / "shadowed").mkdir()
    (tmp_path / "shadowed" / "tokenizer.json").write_text("{}")
    return {
        "missing": ([tmp_path / "nope.txt", corpus], f"{tmp_path / 'nope.txt'}: no such file or folder"),
        "folder without text files": ([tmp_path / "empty"], f"{tmp_path / 'empty'}: a folder without *.txt files"),
        "blank text file": ([corpus, tmp_path / "blank.txt"], f"{tmp_path / 'blank.txt'}: no text"),
        "annotations without text": ([tmp_path / "untexted.jsonl"], f"{tmp_path / 'untexted.jsonl'}: no text"),
        "not UTF-8": ([tmp_path / "latin1.txt"], f"{tmp_path / 'latin1.txt'}:2: not UTF-8 text (invalid"),
        "not an annotation": ([tmp_path / "bad.jsonl"],
                              f"{tmp_path / 'bad.jsonl'}:2: not an annotation record (missing key 'file')"),
        "shadowed by tokenizer.json": ([corpus, "--out", tmp_path / "shadowed"],
                                       f"{tmp_path / 'shadowed'}: holds a tokenizer.json, which load_tokenizer"),
        "out inside an input folder": ([tmp_path / "data", "--out", tmp_path / "data" / "vocab"],
                                       f"--out {tmp_path / 'data' / 'vocab'}: lies inside the input folder {tmp_path / 'data'}"),
    }


@pytest.mark.parametrize("case", ["missing", "folder without text files", "blank text file",
                                  "annotations without text", "not UTF-8", "not an annotation",
                                  "shadowed by tokenizer.json", "out inside an input folder"])
def test_a_bad_input_is_one_line_naming_it_and_writes_nothing(tmp_path, case):
    arguments, error = bad_inputs(tmp_path)[case]
    if "--out" not in arguments:
        arguments = [*arguments, "--out", tmp_path / "vocab"]
    result = run(*arguments)
    assert result.exit_code == 2 and result.output.startswith(f"Error: {error}"), result.output
    assert result.output.count("\n") == 1
    assert not (tmp_path / "vocab").exists()
    assert not list(tmp_path.rglob("vocab.txt")) and not list(tmp_path.rglob("*.tmp"))
