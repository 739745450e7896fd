"""Syntactic grounding (VisualBERT Table 2): the metric on a hand-parsed CoNLL-U fixture with a
hand-built attention tensor whose planted head grounds `amod` arcs, the Stanford ↔ UD label map and
the prep/pobj arcs rebuilt from UD (one sentence parsed by hand in UD and in ClearNLP gives the same
Stanford arcs), parses that are no tree skipped and named, bad inputs, and `vlbert analyze syntax`
end to end on the tiny world in Flickr30K Entities' layout."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from extract.extraction_config import ExtractionConfig
from extract.job import run_extraction
from pipelines.cli import main
from pipelines.world.entities import write_world_entities
from pipelines.world.generate import load_split
from pipelines.world.tiny import TINY_MODEL
from train.analysis.parses import read_conllu
from train.analysis.phrases import PHRASE_READERS
from train.analysis.relations import LABEL_MAP, LABEL_SETS, paper_name, stanford_names
from train.analysis.grounding_results import Best
from train.analysis.syntax import SyntaxTally, analyze_syntax, markdown_table, read_syntax_inputs, syntax_result
from train.analysis.syntax_results import held_out_by_relation
from train.analysis.verdicts import syntax_verdicts
from train.data.files import DataError
from train.data.regions import RegionBank
from vlbert.config import VLBertConfig
from vlbert.modeling import VLBertForPreTraining
from vlbert.tokenization import load_tokenizer

CIRCLE, SQUARE, STAR = [10, 10, 30, 30], [60, 10, 90, 40], [20, 20, 50, 50]
BOTH = [10, 10, 90, 40]  # the union of the circle's and the square's boxes
# The whole-image box first (never a candidate), then the RoIs, best first: R1 fits the circle, R2
# nothing, R3 the square, R4 both together; on image 2, S2 fits the star.
IMAGE_1 = [[0, 0, 100, 80], [11, 11, 30, 30], [40, 50, 60, 70], [60, 12, 90, 40], [8, 8, 92, 42]]
IMAGE_2 = [[0, 0, 100, 80], [0, 0, 15, 15], [21, 19, 50, 50], [55, 55, 70, 70]]

SENTENCES = {
    "1": "[/EN#1/other A red circle] beside [/EN#2/other a large blue square] .\n"
         "[/EN#3/other Two small shapes] sit .\n",
    "2": "[/EN#4/other A green triangle] .\n"
         "\n"  # a blank line is no caption (no parse), but it is counted in the caption index
         "[/EN#5/other a green star].\n",
}
OBJECTS = {"1": [("1", CIRCLE), ("2", SQUARE), ("3", CIRCLE), ("3", SQUARE)], "2": [("4", STAR), ("5", STAR)]}
PARSES = """# sent_id = 1/0
1	A	_	DET	_	_	3	det	_	_
2	red	_	ADJ	_	_	3	amod	_	_
3	circle	_	NOUN	_	_	0	root	_	_
4	beside	_	ADP	_	_	8	case	_	_
5	a	_	DET	_	_	8	det	_	_
6	large	_	ADJ	_	_	8	amod	_	_
7	blue	_	ADJ	_	_	8	amod	_	_
8	square	_	NOUN	_	_	3	nmod	_	_
9	.	_	PUNCT	_	_	3	punct	_	_

# sent_id = 1/1
1	Two	_	NUM	_	_	3	nummod	_	_
2	small	_	ADJ	_	_	3	amod	_	_
3	shapes	_	NOUN	_	_	4	nsubj	_	_
4	sit	_	VERB	_	_	0	root	_	_
5	.	_	PUNCT	_	_	4	punct	_	_

# sent_id = 2/0: a parse of another caption
1	A	_	DET	_	_	3	det	_	_
2	green	_	ADJ	_	_	3	amod	_	_
3	star	_	NOUN	_	_	0	root	_	_
4	.	_	PUNCT	_	_	3	punct	_	_

# sent_id = 2/2: a multiword token spanning the last two words
1	a	_	DET	_	_	3	det	_	_
2	green	_	ADJ	_	_	3	amod	_	_
3-4	star.	_	_	_	_	_	_	_	_
3	star	_	NOUN	_	_	0	root	_	_
4	.	_	PUNCT	_	_	3	punct	_	_

"""
PLANTED = (1, 1)  # layer 2, head 2 (from 0)


def write_entities(root: Path, parses: str = PARSES) -> tuple[Path, Path]:
    """A two-image Flickr30K Entities split in `root` and its CoNLL-U parses."""
    for folder in ("Sentences", "Annotations"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "val.txt").write_text("1\n2\n")
    for image, text in SENTENCES.items():
        (root / "Sentences" / f"{image}.txt").write_text(text)
        boxes = "".join(f"<object><name>{name}</name><bndbox><xmin>{box[0]}</xmin><ymin>{box[1]}</ymin>"
                        f"<xmax>{box[2]}</xmax><ymax>{box[3]}</ymax></bndbox></object>" for name, box in OBJECTS[image])
        (root / "Annotations" / f"{image}.xml").write_text(f"<annotation>{boxes}</annotation>")
    (root / "val.conllu").write_text(parses)
    return root / "val.txt", root / "val.conllu"


def _iou(a, b) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


# The amod arcs by construction: (caption row, the adjective's word position, w1's box, the RoIs).
AMOD = [(0, 2, CIRCLE, IMAGE_1), (0, 6, SQUARE, IMAGE_1), (0, 7, SQUARE, IMAGE_1), (1, 2, BOTH, IMAGE_1),
        (2, 2, STAR, IMAGE_2)]
RIGHT_ROI = {(0, 2): 1, (0, 6): 3, (0, 7): 3, (1, 2): 4, (2, 2): 2}
WRONG_ROI = 2  # R2 fits nothing on image 1; S2 on image 2 is the star, so image 2 uses S3
MISSED = (0, 7)  # the planted head looks at the wrong RoI for "blue": 4 of 5 amod arcs


def hand_built_attention() -> torch.Tensor:
    """(captions, layers 2, heads 2, T, N): every head gives half its attention from each word to a
    RoI that fits no box (R2; S3 on image 2), a tenth to each other RoI; the planted head gives
    little to the RoIs at all (under 20%), but from an amod arc's adjective the most to its noun's
    RoI."""
    text_length, regions = 11, 5
    attention = torch.zeros(3, 2, 2, text_length, regions)
    for row, boxes in enumerate((IMAGE_1, IMAGE_1, IMAGE_2)):
        wrong = WRONG_ROI if boxes is IMAGE_1 else 3
        for layer in range(2):
            for head in range(2):
                planted = (layer, head) == PLANTED
                attention[row, layer, head, :, 1:len(boxes)] = 0.01 if planted else 0.1
                attention[row, layer, head, :, wrong] = 0.05 if planted else 0.5
        for (arc_row, position), roi in RIGHT_ROI.items():
            if arc_row == row and (arc_row, position) != MISSED:
                attention[row, PLANTED[0], PLANTED[1], position, roi] = 0.15
    return attention


def tally_fixture(tmp_path: Path):
    split, parses = write_entities(tmp_path)
    inputs = read_syntax_inputs(split, "conllu", parses, None, None)
    tally = SyntaxTally(inputs.relations, layers=2, heads=2)
    box_mask = torch.tensor([[True] * 5, [True] * 5, [True] * 4 + [False]])
    offsets = []  # one piece per word: the words' characters
    for item in inputs.captions:
        words = item.caption.text.replace(".", " .").split()
        position, spans = 0, []
        for word in words:
            position = item.caption.text.index(word, position)
            spans.append((position, position + len(word)))
            position += len(word)
        offsets.append(spans)
    boxes = [np.array(IMAGE_1, np.float32), np.array(IMAGE_1, np.float32), np.array(IMAGE_2, np.float32)]
    tally.add(hand_built_attention(), box_mask, inputs.captions, boxes, offsets)
    return inputs, tally


def test_the_planted_head_is_the_best_for_amod_with_its_accuracy_and_the_baselines_are_the_paper_s(tmp_path):
    inputs, tally = tally_fixture(tmp_path)
    result = syntax_result(tally, inputs, None)
    amod = next(row for row in result.relations if row.relation == "amod")
    assert amod.arcs == len(AMOD) and amod.stanford == ["amod"] and amod.paper.best == 45.96
    assert amod.figures.best == Best(PLANTED[0] + 1, PLANTED[1] + 1, 0.8)
    accuracy = np.asarray(amod.accuracy)
    assert accuracy[PLANTED] == 0.8 and np.delete(accuracy.ravel(), 3).tolist() == [0, 0, 0]
    # The baselines, computed here from the boxes: the most confident RoI is the first candidate; a
    # random RoI hits with the share of candidates that fit w1's box.
    confident = np.mean([_iou(rois[1], box) >= 0.5 for _, _, box, rois in AMOD])
    random = np.mean([np.mean([_iou(roi, box) >= 0.5 for roi in rois[1:]]) for _, _, box, rois in AMOD])
    assert amod.figures.confidence_baseline == round(confident, 4) == 0.2
    assert amod.figures.random_baseline == round(random, 4)
    assert amod.figures.intervals.best[0] <= 0.8 <= amod.figures.intervals.best[1]
    # The most common first (ties by name): amod 5, det 3, punct 2, then one each; UD's nmod and case
    # of "circle beside ... square" rebuilt as Stanford's prep and pobj.
    assert [(row.relation, row.arcs) for row in result.relations] == [
        ("amod", 5), ("det", 3), ("punct", 2), ("nsubj", 1), ("nummod", 1), ("pobj", 1), ("prep", 1)]
    assert all(row.top for row in result.relations)
    assert [(arc.relation, arc.entity_word, arc.other_word) for arc in inputs.captions[0].arcs
            if arc.relation in ("prep", "pobj")] == [("prep", "circle", "beside"), ("pobj", "square", "beside")]
    assert {row.relation: row.paper.relation for row in result.relations
            if row.relation in ("prep", "pobj")} == {"prep": "prep", "pobj": "pobj"}


def test_each_relation_s_held_out_head_is_compared_with_the_most_confident_roi_in_the_json_and_the_table(tmp_path):
    inputs, tally = tally_fixture(tmp_path)
    result = syntax_result(tally, inputs, None)
    held_out = next(row for row in result.relations if row.relation == "amod").figures.held_out_best
    # Chosen on the 1st, 3rd and 5th amod arcs (the planted head fits 2 of 3), scored on the 2nd and
    # 4th: the planted head fits both, the most confident RoI (R1, the circle) neither.
    written = held_out.to_json()
    assert (held_out.layer, held_out.head, written["arcs"]) == (2, 2, 2) and "phrases" not in written
    assert (held_out.accuracy, held_out.confidence_baseline) == (1.0, 0.0)
    side = held_out.against_confidence
    assert (side.difference, side.difference_interval, side.outcome) == (1.0, [1.0, 1.0], "beats")
    assert side.verdict == ("the best head (layer 2, head 2, chosen on half the arcs) beats the most confident RoI "
                               "on the other half: +1.000 [+1.000, +1.000]")
    compared = [row for row in result.relations if row.figures.held_out_best]  # those with 2 arcs or more
    outcomes = [row.figures.held_out_best.against_confidence.outcome for row in compared]
    verdicts = syntax_verdicts(result.held_out())
    assert verdicts[0] == (f"the held-out best head beats the most confident RoI in {outcomes.count('beats')} of "
                           f"{len(compared)} relations (amod); it is worse in {outcomes.count('worse')}, not "
                           f"distinguishable in {outcomes.count('not distinguishable')}")
    assert verdicts[1:] == [f"{row.relation}: {row.figures.held_out_best.against_confidence.verdict}"
                            for row in compared]
    table = markdown_table(replace(result, model="M", annotations="A", parses=None))
    assert "| 100.00 (2-2, 2 arcs) | +100.00 [+100.00, +100.00]: beats |" in table
    assert f"In short: {verdicts[0]}." in table and f"- {verdicts[1]}" in table


def test_the_region_attention_filter_leaves_out_the_planted_head_that_gives_the_rois_little(tmp_path):
    inputs, tally = tally_fixture(tmp_path)
    result = syntax_result(tally, inputs, 0.2)
    assert result.active_heads == [[1, 1], [1, 2], [2, 1]]
    share = np.asarray(result.region_attention)
    assert share[PLANTED] < 0.2 < share.min(initial=1, where=np.arange(4).reshape(2, 2) != 3)
    best = next(row for row in result.relations if row.relation == "amod").figures.best
    assert (best.layer, best.head) != (2, 2) and best.accuracy == 0
    nobody = syntax_result(tally, inputs, 0.95)
    assert nobody.active_heads == [] and all(row.figures.best is None for row in nobody.relations)


def test_sentences_whose_parse_is_not_their_caption_are_skipped_and_named(tmp_path):
    inputs, _ = tally_fixture(tmp_path)
    assert inputs.skipped == [{"image_id": "2", "caption": 0, "parse": f"{tmp_path / 'val.conllu'}:19 (sentence 3)",
                               "text": "A green triangle .",
                               "reason": "token 3 'star' is not the caption's text at character 8 ('triangle .')"}]
    # The multiword token "star." gives both its words its characters; caption 2/2 is analysed.
    assert [item.item_id for item in inputs.captions] == ["1/0", "1/1", "2/2"]
    star = inputs.captions[2]
    assert [(arc.relation, arc.other_word, arc.entity_word, arc.source) for arc in star.arcs] == [
        ("det", "a", "star", (0, 1)), ("amod", "green", "star", (2, 7)), ("punct", ".", "star", (8, 13))]


def test_the_stanford_and_ud_names_map_both_ways():
    def ud_names(stanford: str) -> tuple[str, ...]:
        return next((mapping.ud for mapping in LABEL_MAP if mapping.stanford == stanford), ())

    assert {label: paper_name(label) for label in ("compound", "flat", "flat:name", "nummod", "acl", "obj", "det",
                                                    "amod", "nsubj", "punct", "pobj", "prep", "dobj", "nn")} == {
        "compound": "nn", "flat": "nn", "flat:name": "nn", "nummod": "num", "acl": "partmod", "obj": "dobj",
        "det": "det", "amod": "amod", "nsubj": "nsubj", "punct": "punct", "pobj": "pobj", "prep": "prep",
        "dobj": "dobj", "nn": "nn"}
    # UD's case, obl and nmod are rebuilt as prep, pobj and possessive (below); left over, they are none of them.
    assert [stanford_names(label) for label in ("case", "obl", "nmod", "obl:agent")] == [(), (), (), ()]
    assert ud_names("nn") == ("compound", "flat", "flat:name") and ud_names("partmod") == ("acl",)
    assert ud_names("prep") == ud_names("pobj") == ud_names("possessive") == ()  # rebuilt, not renamed
    assert stanford_names("nmod:poss") == ("poss",) and paper_name("nmod:poss") is None
    assert stanford_names("nmod:tmod") == stanford_names("obl:tmod") == ("tmod",)
    assert stanford_names("nmod:npmod") == stanford_names("obl:npmod") == ("npadvmod",)
    assert stanford_names("obl:unmarked") == stanford_names("nmod:unmarked") == ("tmod", "npadvmod")
    assert stanford_names("acl:x") == ("partmod", "infmod")  # a subtype the map lacks: its base
    assert stanford_names("reparandum") == ()


# "A man in a red hat sits on John 's bench ." parsed by hand: UD's structure and labels, then
# ClearNLP's (spaCy's English models: Stanford's structure, case the possessive 's).
HAND_PARSED = {
    "ud": [("A", 2, "det"), ("man", 7, "nsubj"), ("in", 6, "case"), ("a", 6, "det"), ("red", 6, "amod"),
           ("hat", 2, "nmod"), ("sits", 0, "root"), ("on", 11, "case"), ("John", 11, "nmod:poss"), ("'s", 9, "case"),
           ("bench", 7, "obl"), (".", 7, "punct")],
    "clearnlp": [("A", 2, "det"), ("man", 7, "nsubj"), ("in", 2, "prep"), ("a", 6, "det"), ("red", 6, "amod"),
                 ("hat", 3, "pobj"), ("sits", 0, "root"), ("on", 7, "prep"), ("John", 11, "poss"), ("'s", 9, "case"),
                 ("bench", 8, "pobj"), (".", 7, "punct")],
}
STANFORD_ARCS = {("det", "man", "A"), ("nsubj", "sits", "man"), ("prep", "man", "in"), ("pobj", "in", "hat"),
                 ("det", "hat", "a"), ("amod", "hat", "red"), ("prep", "sits", "on"), ("pobj", "on", "bench"),
                 ("poss", "bench", "John"), ("possessive", "John", "'s"), ("punct", "sits", ".")}


@pytest.mark.parametrize("labels", HAND_PARSED)
def test_a_hand_parsed_sentence_gives_the_stanford_arcs_in_either_label_set(tmp_path, labels):
    """prep joins the modified word to the preposition and pobj the preposition to its noun, rebuilt
    from UD's obl/nmod and case; the possessive 's is no pobj."""
    path = tmp_path / f"{labels}.conllu"
    path.write_text("".join(f"{index}\t{form}\t_\t_\t_\t_\t{head}\t{relation}\t_\t_\n"
                            for index, (form, head, relation) in enumerate(HAND_PARSED[labels], 1)))
    (sentence,) = read_conllu(path)
    words = LABEL_SETS[labels].as_stanford(sentence.words)
    arcs = {(stanford_names(word.relation, labels), words[word.head - 1].form, word.form) for word in words
            if word.head}
    assert all(len(names) == 1 for names, _, _ in arcs)
    assert {(names[0], head, dependent) for names, head, dependent in arcs} == STANFORD_ARCS


def test_spacys_clearnlp_labels_keep_their_own_meanings_of_case_and_nmod(tmp_path):
    """ClearNLP's case is the possessive 's and its nmod has no row of the paper, where UD's case is
    pobj's arc and nmod prep's; its Stanford names are themselves in either set."""
    assert {label: paper_name(label, "clearnlp") for label in ("case", "nmod", "compound", "nummod", "acl", "pobj",
                                                                "prep", "dobj", "relcl")} == {
        "case": None, "nmod": None, "compound": "nn", "nummod": "num", "acl": "partmod", "pobj": "pobj",
        "prep": "prep", "dobj": "dobj", "relcl": None}
    assert stanford_names("case", "clearnlp") == ("possessive",) and stanford_names("relcl", "clearnlp") == ("rcmod",)
    assert stanford_names("dative", "clearnlp") == ("iobj",) and stanford_names("nmod", "clearnlp") == ()
    split, parses = write_entities(tmp_path)
    inputs = read_syntax_inputs(split, "conllu", parses, None, None, labels="clearnlp")
    tally = SyntaxTally(inputs.relations, layers=2, heads=2)
    result = syntax_result(tally, inputs, None)
    assert result.labels == "clearnlp"
    assert {row.relation: row.paper and row.paper.relation for row in result.relations} == {
        "amod": "amod", "det": "det", "nmod": None, "punct": "punct", "case": None, "nsubj": "nsubj", "nummod": "num"}
    with pytest.raises(DataError, match="labels 'stanford': expected one of ud, clearnlp"):
        read_syntax_inputs(split, "conllu", parses, None, None, labels="stanford")


@pytest.mark.parametrize("parses, message", [
    (PARSES.split("\n\n# sent_id = 2/2")[0] + "\n\n",
     "{parses}: 3 sentences, but the split's Sentences files hold 4 captions; give one parse per caption, in the "
     "order of the split file's images and of their Sentences lines"),
    (PARSES.replace("3\tamod", "x\tamod", 1),
     "{parses}:1 (sentence 1): not CoNLL-U (Failed parsing field 'head': 'x' is not a valid value for "
     "parse_int_value.)"),
    (PARSES.replace("1\tTwo\t_\tNUM\t_\t_\t3\tnummod\t_\t_", "1\tTwo\t_\tNUM"),
     "{parses}:12 (sentence 2): word 1 'Two' has no head or relation (HEAD None, DEPREL None); CoNLL-U has 10 "
     "tab-separated columns"),
])
def test_parses_that_do_not_fit_the_captions_are_one_line(tmp_path, parses, message):
    split, path = write_entities(tmp_path, parses)
    with pytest.raises(DataError) as error:
        read_syntax_inputs(split, "conllu", path, None, None)
    assert str(error.value) == message.format(parses=path)


CIRCLE_ROW = "3\tcircle\t_\tNOUN\t_\t_\t0\troot"  # line 4 of PARSES


@pytest.mark.parametrize("parse, reason", [
    (PARSES.replace(CIRCLE_ROW, CIRCLE_ROW.replace("\t0\troot", "\t3\troot")),
     "word 3 'circle' (line 4) is its own head: not a tree"),
    (PARSES.replace(CIRCLE_ROW, CIRCLE_ROW.replace("\t0\troot", "\t8\tdep")),
     "the heads of words 3 'circle' → 8 'square' → 3 'circle' (line 4) form a cycle: not a tree"),
    (PARSES.replace(CIRCLE_ROW, CIRCLE_ROW.replace("\t0\troot", "\t12\troot")),
     "word 3 'circle' (line 4) has head 12, not a word of the sentence (0 to 9)"),
    (PARSES.replace(CIRCLE_ROW, CIRCLE_ROW.replace("\t0\troot", "\t" + "9" * 5000 + "\troot")),
     "word 3 'circle' (line 4) has head of more than 18 digits, not a word of the sentence (0 to 9)"),
])
def test_a_parse_that_is_no_tree_is_skipped_named_and_counted(tmp_path, parse, reason):
    split, parses = write_entities(tmp_path, parse)
    inputs = read_syntax_inputs(split, "conllu", parses, None, None)
    assert inputs.skipped[0] == {"image_id": "1", "caption": 0, "parse": f"{parses}:1 (sentence 1)",
                                 "text": "A red circle beside a large blue square .", "reason": reason}
    assert [item["parse"] for item in inputs.skipped] == [f"{parses}:1 (sentence 1)", f"{parses}:19 (sentence 3)"]
    assert [item.item_id for item in inputs.captions] == ["1/1", "2/2"]
    result = syntax_result(SyntaxTally(inputs.relations, layers=2, heads=2), inputs, None)
    assert result.captions == 2 and len(result.skipped) == 2


def test_conllu_comments_and_empty_nodes_carry_no_words(tmp_path):
    path = tmp_path / "p.conllu"
    path.write_text("# newdoc\n\n# text = a b\n1\ta\t_\t_\t_\t_\t0\troot\t_\t_\n1.1\tgone\t_\t_\t_\t_\t_\t_\t_\t_\n"
                    "2\tb\t_\t_\t_\t_\t1\tdep\t_\t_\n")
    (sentence,) = read_conllu(path)
    assert [(w.form, w.head, w.relation) for w in sentence.words] == [("a", 0, "root"), ("b", 1, "dep")]


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    """The tiny world in Flickr30K Entities' layout with its parses, its images extracted into a store
    under their Flickr30K keys, and a tiny model with fresh weights."""
    root = tmp_path_factory.mktemp("syntax")
    counts = write_world_entities(tiny_world / "world", root / "entities")
    run_extraction(ExtractionConfig(root / "entities", "tiny", batch_size=4, progress=False), root / "cache")
    tokenizer = load_tokenizer(tiny_world / "vocab")
    config = VLBertConfig(**TINY_MODEL, vocab_size=len(tokenizer),
                          visual_feature_size=RegionBank(root / "cache").feature_dim)
    torch.manual_seed(0)
    VLBertForPreTraining(config).save_pretrained(root / "model")
    return {"root": root, "counts": counts, "vocab": tiny_world / "vocab", "records": load_split(tiny_world / "world",
                                                                                                 "train")}


def test_the_world_s_entities_are_its_objects_and_their_union(world):
    records = world["records"]
    assert world["counts"]["train"] == 3 * len(records)
    phrases = PHRASE_READERS["flickr30k-entities"](world["root"] / "entities" / "train.txt")
    for record in records:
        boxes = [obj["box"] for obj in record["objects"]]
        mine = {p.phrase: p.box for p in phrases if p.item_id.startswith(f"{record['id']}/1/")}
        count = len(boxes)
        union = [min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)]
        assert list(mine.values()) == [union] and list(mine)[0].endswith("shape" if count == 1 else "shapes")
        first = [p.box for p in phrases if p.item_id.startswith(f"{record['id']}/0/")]
        assert first == boxes  # one phrase per object, in order, the background without a box


def test_analyze_syntax_on_the_world_writes_the_json_the_table_and_the_plots(world, tmp_path):
    root = world["root"]
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "analyze", "syntax", "--model", str(root / "model"), "--store", str(root / "cache"), "--annotations",
        str(root / "entities" / "train.txt"), "--parses", str(root / "entities" / "train.conllu"), "--vocabulary",
        str(world["vocab"]), "--out", str(out), "--plot", "amod", "--plot", "num", "--batch-size", "4"])
    assert result.exit_code == 0, result.output
    table = json.loads((out / "syntax.json").read_text())
    assert result.output.startswith(f"{table['arcs']} arcs of {len(table['relations'])} relations in "
                                    f"{len(world['records']) * 3} captions")
    assert table["skipped"] == [] and table["left_out"] == []
    relations = {row["relation"]: row for row in table["relations"]}
    # Each image's second caption has one number ("three shapes"): one nummod arc per image.
    assert relations["nummod"]["arcs"] == len(world["records"]) and relations["nummod"]["paper"]["relation"] == "num"
    # Fresh weights: the visual gains are 0, every RoI looks alike, so every head ties among them and
    # scores the random RoI's rate, relation by relation.
    for row in table["relations"]:
        assert np.allclose(row["accuracy"], row["random_baseline"], atol=1e-4), row["relation"]
    markdown = (out / "syntax.md").read_text()
    summary = syntax_verdicts(held_out_by_relation(table))[0]
    assert summary.startswith("the held-out best head beats the most confident RoI in ")
    assert f"Held out: {summary} (each relation's verdict in syntax.md)" in result.output
    assert f"In short: {summary}." in markdown
    assert "| amod | amod | " in markdown and "amod: 18.67 → 45.96 (10-9)" in markdown
    assert "| nummod | num | " in markdown and "num: 23.15 → 67.44 (9-11)" in markdown
    assert set(table["figures"]) == {"relations", "amod", "nummod"}
    for picture in (out / "relations.png", out / "layers" / "amod.png", out / "layers" / "nummod.png"):
        with Image.open(picture) as image:
            image.load()
            assert image.width > 100 and image.height > 100


def test_analyze_syntax_refuses_bad_inputs_in_one_line_before_writing(world, tmp_path):
    root = world["root"]
    args = ["analyze", "syntax", "--model", str(root / "model"), "--store", str(root / "cache"), "--annotations",
            str(root / "entities" / "val.txt"), "--vocabulary", str(world["vocab"]), "--out", str(tmp_path / "out")]
    parses = ["--parses", str(root / "entities" / "val.conllu")]
    unknown = CliRunner().invoke(main, args + parses + ["--plot", "xcomp"])
    assert unknown.exit_code == 2 and unknown.output.count("\n") == 1
    assert unknown.output.startswith("Error: --plot xcomp: no arc of the parses has this relation")
    other = CliRunner().invoke(main, args + ["--parses", str(root / "entities" / "train.conllu")])
    assert other.exit_code == 2 and other.output.count("\n") == 1 and " sentences, but the split's Sentences " in \
        other.output
    none = CliRunner().invoke(main, args)
    assert none.exit_code == 2 and none.output == (
        "Error: --parser conllu reads the parses from a CoNLL-U file: give it with --parses FILE\n")
    inside = CliRunner().invoke(main, args[:-1] + [str(root / "model" / "out")] + parses)
    assert inside.exit_code == 2 and inside.output.startswith(
        f"Error: --out {root / 'model' / 'out'}: lies inside the input --model ")
    assert not (tmp_path / "out").exists() and not (root / "model" / "out").exists()


def test_the_spacy_parser_without_spacy_is_one_line(world, tmp_path):
    try:
        import spacy  # noqa: F401
        pytest.skip("spaCy is installed: the error path cannot be reached")
    except ImportError:
        pass
    root = world["root"]
    result = CliRunner().invoke(main, [
        "analyze", "syntax", "--model", str(root / "model"), "--store", str(root / "cache"), "--annotations",
        str(root / "entities" / "val.txt"), "--parser", "spacy", "--vocabulary", str(world["vocab"]),
        "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.output == (
        "Error: --parser spacy: spaCy is not installed; pip install 'vlbert-pipeline[syntax]' and an English model "
        "(python -m spacy download en_core_web_sm), or give CoNLL-U parses with --parses FILE\n")


def test_the_spacy_parser_where_spacy_and_an_english_model_are_installed(world, tmp_path):
    spacy = pytest.importorskip("spacy")
    if not any(name.startswith("en_") for name in spacy.util.get_installed_models()):
        pytest.skip("no English spaCy model installed")
    root = world["root"]
    result = analyze_syntax(root / "model", root / "cache", root / "entities" / "val.txt", world["vocab"],
                            tmp_path / "out", parser="spacy")
    # spaCy tokenizes the captions itself: every parse aligns, and the noun phrases' adjectives are amod.
    assert result.skipped == [] and any(row.relation == "amod" for row in result.relations)


def test_world_entities_command_writes_the_same_files_again(world, tiny_world, tmp_path):
    result = CliRunner().invoke(main, ["world", "entities", "--world", str(tiny_world / "world"), "--out",
                                       str(tmp_path / "entities")])
    counts = world["counts"]
    assert result.exit_code == 0 and result.output == (
        f"{tmp_path / 'entities'}: train.txt and train.conllu ({counts['train']} captions), val.txt and val.conllu "
        f"({counts['val']} captions)\n")
    for name in ("train.conllu", "val.conllu", "val.txt", "Sentences/" + world["records"][0]["id"] + ".txt"):
        assert (tmp_path / "entities" / name).read_text() == (world["root"] / "entities" / name).read_text()


def test_world_entities_of_a_folder_that_is_no_world_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "not-a-world").mkdir()
    result = CliRunner().invoke(main, ["world", "entities", "--world", str(tmp_path / "not-a-world"), "--out",
                                       str(tmp_path / "entities")])
    assert result.exit_code != 0 and result.output.count("\n") == 1
    assert "no such split" in result.output and not (tmp_path / "entities").exists()
