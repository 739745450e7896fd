"""Tokenization helpers, whole-word masking, sequence builders, and every input format through the model."""

import itertools
import pickle
import random
from collections import Counter

import pytest
import torch

from tests.helpers.models import padded_by_lists
from vlbert import (
    IGNORE_INDEX,
    Segment,
    VLBertConfig,
    VLBertForMultipleChoice,
    VLBertForPreTraining,
    VLBertForQuestionAnswering,
    VLBertForReferringExpressions,
    build_caption_sequence,
    build_choice_sequences,
    build_sequence,
    build_vqa_sequence,
    choose_masked_regions,
    load_tokenizer,
    mask_whole_words,
    pad_text,
    word_pieces,
)
from vlbert.tokenization import WordPieceMemo, WordPieces, fit_lengths

WORDS = "a the man dog cat is on in with what color of hat red blue wear play sit mat ? . , left right shirt".split()
PIECES = ["##s", "##ing", "##ed", "##er"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + PIECES
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return load_tokenizer(directory)


def test_word_pieces_keep_word_boundaries(tokenizer):
    pieces = word_pieces(tokenizer, "The man wears a red hat")
    assert tokenizer.convert_ids_to_tokens(pieces.ids) == ["the", "man", "wear", "##s", "a", "red", "hat"]
    assert pieces.word_index == [0, 1, 2, 2, 3, 4, 5]


def test_whole_word_masking_statistics(tokenizer):
    pieces = word_pieces(tokenizer, "the man wears a red hat sitting on the mat " * 40)
    rng = random.Random(0)
    chosen_words, actions = 0, Counter()
    words = len(set(pieces.word_index))
    trials = 50
    for _ in range(trials):
        masked = mask_whole_words(tokenizer, pieces, rng)
        by_word = {}
        for position, word in enumerate(pieces.word_index):
            by_word.setdefault(word, []).append(position)
        for positions in by_word.values():
            labelled = [masked.labels[p] != IGNORE_INDEX for p in positions]
            assert all(labelled) or not any(labelled)  # whole words only
            if not labelled[0]:
                assert all(masked.ids[p] == pieces.ids[p] for p in positions)
                continue
            chosen_words += 1
            assert all(masked.labels[p] == pieces.ids[p] for p in positions)
            if all(masked.ids[p] == tokenizer.mask_token_id for p in positions):
                actions["mask"] += 1
            elif all(masked.ids[p] == pieces.ids[p] for p in positions):
                actions["keep"] += 1
            else:
                actions["random"] += 1
    assert abs(chosen_words / (words * trials) - 0.15) < 0.015
    assert abs(actions["mask"] / chosen_words - 0.8) < 0.04
    assert abs(actions["random"] / chosen_words - 0.1) < 0.03


def test_the_word_piece_memo_gives_word_pieces_own_results_that_no_caller_can_change(tokenizer):
    memo = WordPieceMemo(tokenizer)
    texts = ["the man wears a red hat", "what color is the hat ?", "the man wears a red hat", ("the", "mats", "red")]
    for text in texts * 2:
        assert memo(text) == word_pieces(tokenizer, text)
    assert len(memo) == 3  # one entry a distinct text
    words = ["the", "mats", "red"]  # a text split into words, as VCR's tagged tokens give it
    encoding = tokenizer(words, is_split_into_words=True, add_special_tokens=False)
    assert memo(tuple(words)) == WordPieces(encoding["input_ids"], encoding.word_ids())
    assert encoding.word_ids() == [0, 1, 1, 2]
    # Masking every word, then changing the lists a caller got, leaves what the memo gives as it was.
    pieces = memo(texts[0])
    masked = mask_whole_words(tokenizer, pieces, random.Random(0), probability=1.0)
    assert masked.ids != pieces.ids and pieces == word_pieces(tokenizer, texts[0])
    pieces.ids[0], pieces.word_index[0] = -1, -1
    pieces.ids.append(7)
    assert memo(texts[0]) == word_pieces(tokenizer, texts[0])
    assert len(pickle.loads(pickle.dumps(memo))) == 0  # a spawned worker fills its own
    full = WordPieceMemo(tokenizer, limit=2)  # past its limit, texts are tokenized at each use
    assert [full(text) for text in texts * 2] == [word_pieces(tokenizer, text) for text in texts * 2]
    assert len(full) == 2


def test_padded_text_is_what_padding_the_lists_gives(tokenizer):
    sequences = [build_caption_sequence(tokenizer, word_pieces(tokenizer, caption).ids, 3, labels=labels)
                 for caption, labels in (("a man on the mat", [5, -100, 7, -100, -100]), ("a red hat", None),
                                         ("the dog sitting with a man wearing a blue shirt", None))]
    sequences.append(build_vqa_sequence(tokenizer, word_pieces(tokenizer, "what color ?").ids, 2))
    expected = padded_by_lists(sequences, pad_token_id=9)
    padded = pad_text(sequences, pad_token_id=9)
    assert padded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert padded[name].dtype == tensor.dtype and torch.equal(padded[name], tensor), name


def test_masked_regions_never_touch_the_whole_image():
    rng = random.Random(0)
    predicted_count = replaced_count = 0
    for _ in range(2000):
        replaced, predicted = choose_masked_regions(11, rng)
        assert not replaced[0] and not predicted[0]
        assert all(p for r, p in zip(replaced, predicted) if r)
        predicted_count += sum(predicted)
        replaced_count += sum(replaced)
    assert abs(predicted_count / (2000 * 10) - 0.15) < 0.01
    assert abs(replaced_count / predicted_count - 0.9) < 0.03


def test_caption_sequence_layout(tokenizer):
    caption = word_pieces(tokenizer, "a dog playing on the mat").ids
    sequence = build_caption_sequence(tokenizer, caption, num_regions=10, max_length=64)
    tokens = tokenizer.convert_ids_to_tokens(sequence.input_ids)
    assert tokens == ["[CLS]", "a", "dog", "play", "##ing", "on", "the", "mat", "[SEP]"]
    assert sequence.token_type_ids == [0] * 9 and sequence.num_regions == 10
    assert sequence.labels == [IGNORE_INDEX] * 9


def test_vqa_sequence_layout(tokenizer):
    question = word_pieces(tokenizer, "what color is the hat ?").ids
    sequence = build_vqa_sequence(tokenizer, question, num_regions=5)
    tokens = tokenizer.convert_ids_to_tokens(sequence.input_ids)
    assert tokens == ["[CLS]", "what", "color", "is", "the", "hat", "?", "[SEP]", "[MASK]", "[SEP]"]
    assert sequence.token_type_ids == [0] * 8 + [1, 1]
    assert tokens[sequence.answer_position] == "[MASK]"


def test_pair_sequence_with_tags(tokenizer):
    question = Segment(word_pieces(tokenizer, "what is the man wearing").ids, box_index=[0, 0, 0, 3, 0, 0])
    answer = Segment(word_pieces(tokenizer, "a red hat").ids, box_index=[0, 0, 7])
    sequence = build_sequence(tokenizer, [question, answer], num_regions=8)
    assert sequence.text_box_index == [0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 7, 0]
    assert sequence.token_type_ids == [0] * 8 + [1] * 4


def test_one_text_without_rois_to_cut_loses_what_a_piece_at_a_time_would_take():
    for length, regions, max_length in itertools.product(range(1, 30), (0, 1), range(3, 40)):
        expected = [length]
        while expected[0] > 1 and 3 + expected[0] + regions > max_length:
            expected[0] -= 1
        if 3 + expected[0] + regions > max_length:
            with pytest.raises(ValueError, match="cannot fit"):
                fit_lengths([length], [True], regions, max_length, min_regions=regions)
            continue
        assert fit_lengths([length], [True], regions, max_length, min_regions=regions) == (expected, regions)


def test_truncation_keeps_total_within_cap(tokenizer):
    long_text = word_pieces(tokenizer, "the man with a red hat is sitting on the left " * 6).ids
    for regions in (0, 3, 30, 100):
        for cap in (16, 32, 64):
            sequence = build_caption_sequence(tokenizer, long_text, num_regions=regions, max_length=cap)
            assert len(sequence) + sequence.num_regions + 1 <= cap
            assert sequence.input_ids[0] == tokenizer.cls_token_id
            assert sequence.input_ids[-1] == tokenizer.sep_token_id
            assert sequence.num_regions >= min(regions, 1)
    # The longer side gives way: text against RoIs, then the longer text segment.
    assert fit_lengths([40], [True], 100, 64) == ([30], 31)
    assert fit_lengths([10, 30], [True, True], 0, 30) == ([10, 16], 0)
    assert fit_lengths([30, 1], [True, False], 0, 12) == ([7, 1], 0)
    with pytest.raises(ValueError, match="cannot fit"):
        fit_lengths([3, 1], [False, False], 2, 6)


def test_truncated_tag_falls_back_to_the_whole_image(tokenizer):
    text = Segment(word_pieces(tokenizer, "the dog").ids, box_index=[0, 9])
    sequence = build_sequence(tokenizer, [text], num_regions=20, max_length=10)
    assert sequence.num_regions == 5 and sequence.text_box_index == [0, 0, 0, 0]


def _visual(config, batch, regions, seed=0):
    g = torch.Generator().manual_seed(seed)
    size = torch.tensor([[100.0, 80.0]]).repeat(batch, 1)
    boxes = torch.tensor([10.0, 10.0, 50.0, 40.0]).repeat(batch, regions, 1)
    boxes[:, 0] = torch.tensor([0.0, 0.0, 99.0, 79.0])
    return dict(
        appearance=torch.rand(batch, regions, config.visual_feature_size, generator=g),
        boxes=boxes,
        box_mask=torch.ones(batch, regions, dtype=torch.bool),
        image_size=size,
    )


@pytest.fixture(scope="module")
def config(tokenizer):
    return VLBertConfig.tiny(vocab_size=len(tokenizer))


def test_pretraining_format_with_text_only_rows(tokenizer, config):
    rng = random.Random(1)
    captions = ["a man wearing a red hat", "the dog sitting on the mat", "what is left", "a blue shirt"]
    sequences = []
    for index, caption in enumerate(captions):
        masked = mask_whole_words(tokenizer, word_pieces(tokenizer, caption), rng, probability=0.5)
        regions = 0 if index == 3 else 6  # the last sample is text-only
        sequences.append(build_caption_sequence(tokenizer, masked.ids, regions, 64, labels=masked.labels))
    text = pad_text(sequences)
    visual = _visual(config, 4, 6)
    visual["box_mask"][3] = False
    model = VLBertForPreTraining(config).eval()
    output = model(**{k: v for k, v in text.items() if k != "mlm_labels"}, **visual, mlm_labels=text["mlm_labels"])
    # With labels, the MLM head runs on the labelled positions only.
    assert output.mlm_logits.shape == (int((text["mlm_labels"] != -100).sum()), config.vocab_size)
    assert output.region_logits.shape == (4, 6, config.num_detector_classes)
    assert output.vlbert.attention_mask[3].sum().item() == len(sequences[3]) + 1  # text + [END], no RoIs
    assert torch.isfinite(output.loss)


def test_vqa_format(tokenizer, config):
    questions = ["what color is the hat ?", "what is on the mat ?"]
    sequences = [build_vqa_sequence(tokenizer, word_pieces(tokenizer, q).ids, 4) for q in questions]
    text = pad_text(sequences)
    positions = torch.tensor([s.answer_position for s in sequences])
    assert (text["input_ids"][torch.arange(2), positions] == tokenizer.mask_token_id).all()
    model = VLBertForQuestionAnswering(config).eval()
    output = model(
        input_ids=text["input_ids"], token_type_ids=text["token_type_ids"], text_mask=text["text_mask"],
        answer_positions=positions, **_visual(config, 2, 4),
    )
    assert output.logits.shape == (2, config.num_answers)


def test_vcr_format(tokenizer, config):
    question = Segment(word_pieces(tokenizer, "what is the man wearing ?").ids, box_index=[0, 0, 0, 2, 0, 0, 0])
    answers = [Segment(word_pieces(tokenizer, text).ids) for text in ("a red hat", "a blue shirt with a hat", "the dog")]
    sequences = build_choice_sequences(tokenizer, question, answers, num_regions=5)
    text = pad_text(sequences)
    choices = {name: text[name].unsqueeze(0) for name in ("input_ids", "token_type_ids", "text_mask", "text_box_index")}
    model = VLBertForMultipleChoice(config).eval()
    output = model(**choices, **_visual(config, 1, 5), labels=torch.tensor([0]))
    assert output.logits.shape == (1, 3)
    assert output.vlbert.last_hidden_state.shape[0] == 3


def test_refcoco_format(tokenizer, config):
    sequences = [build_caption_sequence(tokenizer, word_pieces(tokenizer, "man on the left").ids, 7)]
    text = pad_text(sequences)
    model = VLBertForReferringExpressions(config).eval()
    visual = _visual(config, 1, 7)
    visual["box_mask"][0, 5:] = False
    output = model(input_ids=text["input_ids"], token_type_ids=text["token_type_ids"], text_mask=text["text_mask"],
                   **visual)
    assert output.logits.shape == (1, 7)
