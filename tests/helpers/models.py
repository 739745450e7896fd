"""VL-BERT test configs and batches: a tiny model without dropout, and random batches of text and regions."""

import math

import torch

from vlbert import IGNORE_INDEX, VLBertConfig

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, visual_dropout_prob=0.0, classifier_dropout=0.0)


def make_batch(config, text_lengths=(7, 5, 6, 4), region_counts=(5, 3, 4, 5), seed=0):
    """Random ids, RoI features and boxes; box 0 is the whole image; padding after the real elements."""
    g = torch.Generator().manual_seed(seed)
    batch, text_length, num_regions = len(text_lengths), max(text_lengths), max(region_counts)
    text_mask = torch.arange(text_length) < torch.tensor(text_lengths).unsqueeze(1)
    input_ids = torch.randint(5, config.vocab_size, (batch, text_length), generator=g).masked_fill(~text_mask, 0)
    token_type_ids = ((torch.arange(text_length) >= 3) & text_mask).long()
    box_mask = torch.arange(num_regions) < torch.tensor(region_counts).unsqueeze(1)
    image_size = torch.randint(60, 120, (batch, 2), generator=g).float()
    corners = torch.rand(batch, num_regions, 2, 2, generator=g).sort(2).values * image_size.view(batch, 1, 1, 2)
    boxes = corners.flatten(2)[..., [0, 2, 1, 3]].clone()  # x1, y1, x2, y2
    boxes[:, 0] = torch.cat((torch.zeros(batch, 2), image_size - 1), 1)
    appearance = torch.rand(batch, num_regions, config.visual_feature_size, generator=g) * box_mask.unsqueeze(-1)
    return dict(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        text_mask=text_mask,
        appearance=appearance,
        boxes=boxes,
        box_mask=box_mask,
        image_size=image_size,
    )


def tiny(**overrides):
    # A visual gain of 1 so the tests see the visual features (0, the default, hides them at init).
    return VLBertConfig.tiny(**{**NO_DROPOUT, "visual_gain_init": 1.0, **overrides})


def padded_by_lists(sequences, pad_token_id: int = 0, multiple: int = 1) -> dict[str, torch.Tensor]:
    """`vlbert.pad_text`'s tensors made the plain way (each row a padded list), for comparisons."""
    length = math.ceil(max(len(s) for s in sequences) / multiple) * multiple
    rows = {"input_ids": (lambda s: s.input_ids, pad_token_id, torch.int64),
            "token_type_ids": (lambda s: s.token_type_ids, 0, torch.int64),
            "text_mask": (lambda s: [1] * len(s), 0, torch.bool),
            "text_box_index": (lambda s: s.text_box_index, 0, torch.int64),
            "mlm_labels": (lambda s: s.labels, IGNORE_INDEX, torch.int64)}
    return {name: torch.tensor([values(s) + [fill] * (length - len(s)) for s in sequences], dtype=dtype)
            for name, (values, fill, dtype) in rows.items()}


def saved_world_model(world, path):
    """A tiny VL-BERT for pre-training (seed 0) sized for the tiny world's vocabulary and store, saved at `path`."""
    from pipelines.world.tiny import TINY_MODEL
    from train.data.regions import RegionBank
    from vlbert.modeling import VLBertForPreTraining
    from vlbert.tokenization import load_tokenizer

    config = VLBertConfig(**TINY_MODEL, vocab_size=len(load_tokenizer(world / "vocab")),
                          visual_feature_size=RegionBank(world / "cache").feature_dim)
    torch.manual_seed(0)
    VLBertForPreTraining(config).save_pretrained(path)
    return path
