"""The analyses' results as frozen records (train/analysis/): each writes its JSON as the analysis always
has (keys, their order, the figures left out where there are none) and reads back from it."""

import json
from dataclasses import replace

import numpy as np
import torch

from train.analysis.grounding import GroundingTally
from train.analysis.grounding_results import GroundingResult, HeadScores, held_out_of
from train.analysis.masked_words import WordTally
from train.analysis.syntax import markdown_table
from train.analysis.syntax_results import PaperFigures, RelationScores, SyntaxResult, held_out_by_relation
from train.analysis.verdicts import grounding_verdicts, syntax_verdicts, words_verdicts
from train.analysis.word_results import WordGroup, WordsResult


def _words_result() -> WordsResult:
    words = ["red", "a", "red", "red", "blue"]
    tally = WordTally(words, {"own image": [1.0, 1.0, 1.0, 0.0, 1.0], "another image": [0.0, 1.0, 0.0, 0.0, 1.0]},
                      [str(i) for i in range(len(words))])
    texts = np.array(words)
    groups = {"colour": ["red", "blue"], "one": ["a"], "none": ["zebra"]}
    by_group = {name: WordGroup(members, tally.summary(np.isin(texts, members))) for name, members in groups.items()}
    return WordsResult("model", "val.jsonl", 3, ["own image", "another image"], tally.summary(), by_group,
                       {word: tally.summary(texts == word) for word in ("red", "a")})


def test_the_words_result_writes_words_json_s_keys_in_order_and_reads_back():
    result = _words_result()
    written = result.to_json()
    assert list(written) == ["model", "annotations", "captions", "conditions", "masked_words", "own_image",
                             "another_image", "difference", "interval", "p_value", "verdict", "groups", "by_word"]
    # one masked word: no paired difference; none: only the count
    assert written["groups"]["one"] == {"words": ["a"], "masked_words": 1, "own_image": 1.0, "another_image": 1.0}
    assert written["groups"]["none"] == {"words": ["zebra"], "masked_words": 0}
    assert [row["word"] for row in written["by_word"]] == ["red", "a"] and list(written["by_word"][0])[:2] == [
        "word", "masked_words"]
    read = WordsResult.from_json(json.loads(json.dumps(written, indent=2)))
    assert read == result and words_verdicts(read) == words_verdicts(result)
    assert words_verdicts(result)[-1] == "none: no masked word"


def _head_scores(items: int, unit: str = "phrases", allowed: np.ndarray | None = None) -> HeadScores:
    """A tally of `items` items over 2 layers × 2 heads where head (2, 1) attends to RoI 1 and the others
    to RoI 2; the box fits RoI 1 on every other item, RoI 2 on the rest (RoI 0 the whole image)."""
    attention = torch.full((items, 2, 2, 3), 0.05)
    attention[..., 2] = 0.9
    attention[:, 1, 0, 1] = 0.95
    candidates = torch.ones(items, 3, dtype=torch.bool)
    candidates[:, 0] = False
    iou = torch.zeros(items, 3)
    iou[0::2, 1], iou[1::2, 2] = 0.9, 0.9
    tally = GroundingTally(2, 2)
    tally.add(attention, candidates, iou)
    return tally.result(allowed, unit)


def test_the_grounding_result_writes_grounding_json_s_keys_in_order_and_reads_back():
    scores = _head_scores(6)
    result = GroundingResult("model", "val.jsonl", "refs", scores, [{"item_id": "7", "phrase": "a", "box": "[0]",
                                                                     "problem": "p"}], [])
    written = result.to_json()
    assert list(written) == ["model", "annotations", "format", "phrases", "layers", "heads", "iou_threshold",
                             "accuracy", "region_attention", "best", "mean_accuracy", "random_baseline",
                             "confidence_baseline", "intervals", "held_out_best", "left_out", "examples"]
    assert list(written["held_out_best"])[:3] == ["layer", "head", "phrases"]
    read = GroundingResult.from_json(json.loads(json.dumps(written, indent=2)))
    assert read == result and read.scores.figures.held_out_best.count == 3
    assert grounding_verdicts(held_out_of(written)) == grounding_verdicts(scores.figures.held_out_best) != []
    # One phrase: no intervals, no held-out head; no head allowed: no best head, nor its interval.
    alone = _head_scores(1).to_json()
    assert "intervals" not in alone and "held_out_best" not in alone and alone["best"] is not None
    none_allowed = _head_scores(4, allowed=np.zeros((2, 2), bool))
    assert none_allowed.to_json()["best"] is None and list(none_allowed.to_json()["intervals"]) == [
        "level", "random_baseline", "confidence_baseline"]
    assert HeadScores.from_json(none_allowed.to_json()) == none_allowed


def test_the_syntax_result_writes_syntax_json_s_keys_in_order_and_reads_back():
    rows = []
    for relation, arcs, paper in (("amod", 6, PaperFigures("amod", 18.67, 45.96, 10, 9)), ("nmod", 1, None)):
        scores = _head_scores(arcs, "arcs")
        rows.append(RelationScores(relation, [relation] if paper else [], True, scores.count, scores.accuracy,
                                   scores.figures, paper))
    result = SyntaxResult("conllu", "ud", 4, 7, 2, 2, 0.5, [[0.9, 0.9], [0.95, 0.9]], None, None, rows, [], [],
                          "model", "val.txt", None, {"relations": "relations.png"})
    written = result.to_json()
    assert list(written) == ["parser", "labels", "captions", "arcs", "layers", "heads", "iou_threshold",
                             "region_attention", "min_region_attention", "active_heads", "relations", "skipped",
                             "left_out", "model", "annotations", "parses", "figures"]
    assert list(written["relations"][0]) == ["relation", "stanford", "top", "arcs", "accuracy", "best",
                                             "mean_accuracy", "random_baseline", "confidence_baseline", "intervals",
                                             "held_out_best", "paper"]
    assert written["relations"][0]["paper"] == {"relation": "amod", "baseline": 18.67, "best": 45.96, "layer": 10,
                                                "head": 9}
    assert list(written["relations"][0]["held_out_best"])[:3] == ["layer", "head", "arcs"]
    read = SyntaxResult.from_json(json.loads(json.dumps(written, indent=2)))
    assert read == result and markdown_table(read) == markdown_table(result)
    verdicts = syntax_verdicts(result.held_out())
    assert syntax_verdicts(held_out_by_relation(written)) == verdicts and verdicts[1].startswith("amod: ")
    assert len(verdicts) == 2  # nmod's one arc: no held-out head
    assert replace(result, relations=[]).to_json()["relations"] == [] and syntax_verdicts({}) == []
