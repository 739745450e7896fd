"""Official-checkpoint converter against an independent forward pass over the official key layout.

`official_forward` below is written from the reference code's structure (jackroos/VL-BERT:
common/fast_rcnn.py, common/visual_linguistic_bert.py, pretrain/ and vqa/ modules): it reads the
official state dict directly, packs each sample text → objects → [END] without padding in between,
and runs BERT layers by hand with the reference's −10000 attention mask.
"""

import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner, Result
from safetensors.torch import load_file

from extract.checkpoint import detectron2_names
from extract.presets import PRESETS
from pipelines.cli import main
from vlbert import VLBertForPreTraining, VLBertForQuestionAnswering, convert_official_checkpoint, load_pretrained
from vlbert.modeling import ENCODER_LAYERS

HIDDEN, LAYERS, HEADS, INTERMEDIATE, VOCAB, POSITIONS = 32, 2, 4, 64, 50, 64
FEATURE, FREQUENCIES, CLASSES, ANSWERS = 24, 4, 11, 9
GEOMETRY = 8 * FREQUENCIES
TINY = dict(num_attention_heads=HEADS, visual_feature_size=FEATURE, geometry_frequencies=FREQUENCIES)


def _random_official_vlbert(g, with_pooler):
    def t(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    def norm(prefix):
        return {prefix + "weight": 1 + t(HIDDEN, scale=0.1), prefix + "bias": t(HIDDEN, scale=0.1)}

    state = {
        "vlbert.word_embeddings.weight": t(VOCAB, HIDDEN),
        "vlbert.end_embedding.weight": t(1, HIDDEN),
        "vlbert.position_embeddings.weight": t(POSITIONS, HIDDEN),
        "vlbert.token_type_embeddings.weight": t(3, HIDDEN),
        **norm("vlbert.embedding_LayerNorm."),
        **norm("vlbert.visual_ln_text."),
        **norm("vlbert.visual_ln_object."),
        "object_linguistic_embeddings.weight": t(1, HIDDEN),
        "image_feature_extractor.obj_downsample.1.weight": t(HIDDEN, GEOMETRY + FEATURE),
        "image_feature_extractor.obj_downsample.1.bias": t(HIDDEN),
    }
    for i in range(LAYERS):
        p = f"vlbert.encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            state[p + name + ".weight"], state[p + name + ".bias"] = t(HIDDEN, HIDDEN), t(HIDDEN)
        state[p + "intermediate.dense.weight"], state[p + "intermediate.dense.bias"] = t(INTERMEDIATE, HIDDEN), t(INTERMEDIATE)
        state[p + "output.dense.weight"], state[p + "output.dense.bias"] = t(HIDDEN, INTERMEDIATE), t(HIDDEN)
        state.update(norm(p + "attention.output.LayerNorm."))
        state.update(norm(p + "output.LayerNorm."))
    if with_pooler:
        state["vlbert.pooler.dense.weight"], state["vlbert.pooler.dense.bias"] = t(HIDDEN, HIDDEN), t(HIDDEN)
    return state


def _random_fast_rcnn(g):
    """A narrow ResNet C4 in the official key layout: stem, layer1-3 (one block each) and a 2-block res5."""
    state = {}

    def conv(name, out, inp, k):
        state[name + ".weight"] = torch.randn(out, inp, k, k, generator=g)

    def bn(name, channels):
        for param in ("weight", "bias", "running_mean", "running_var"):
            state[f"{name}.{param}"] = torch.rand(channels, generator=g)
        state[name + ".num_batches_tracked"] = torch.tensor(7)

    def block(prefix, inp, planes, downsample):
        conv(prefix + "conv1", planes, inp, 1), bn(prefix + "bn1", planes)
        conv(prefix + "conv2", planes, planes, 3), bn(prefix + "bn2", planes)
        conv(prefix + "conv3", 4 * planes, planes, 1), bn(prefix + "bn3", 4 * planes)
        if downsample:
            conv(prefix + "downsample.0", 4 * planes, inp, 1), bn(prefix + "downsample.1", 4 * planes)

    base = "image_feature_extractor."
    conv(base + "backbone.conv1", 4, 3, 7), bn(base + "backbone.bn1", 4)
    channels = 4
    for stage, planes in zip((1, 2, 3), (2, 4, 8)):
        block(f"{base}backbone.layer{stage}.0.", channels, planes, True)
        channels = 4 * planes
    block(base + "roi_head_feature_extractor.0.", channels, 16, True)
    block(base + "roi_head_feature_extractor.1.", 64, 16, False)
    for name in [n for n in state if n.startswith(base + "roi_head_feature_extractor.")]:
        state[name.replace("roi_head_feature_extractor.", "head.0.")] = state[name]  # the reference's alias
    return state


def official_pretraining_checkpoint(seed=0):
    g = torch.Generator().manual_seed(seed)
    state = _random_official_vlbert(g, with_pooler=False)
    state.update({
        "vlbert.mlm_head.predictions.bias": torch.randn(VOCAB, generator=g) * 0.1,
        "vlbert.mlm_head.predictions.transform.dense.weight": torch.randn(HIDDEN, HIDDEN, generator=g) * 0.2,
        "vlbert.mlm_head.predictions.transform.dense.bias": torch.randn(HIDDEN, generator=g) * 0.1,
        "vlbert.mlm_head.predictions.transform.LayerNorm.weight": 1 + torch.randn(HIDDEN, generator=g) * 0.1,
        "vlbert.mlm_head.predictions.transform.LayerNorm.bias": torch.randn(HIDDEN, generator=g) * 0.1,
        "vlbert.mvrc_head.transform.dense.weight": torch.randn(HIDDEN, HIDDEN, generator=g) * 0.2,
        "vlbert.mvrc_head.transform.dense.bias": torch.randn(HIDDEN, generator=g) * 0.1,
        "vlbert.mvrc_head.region_cls_pred.weight": torch.randn(CLASSES, HIDDEN, generator=g) * 0.2,
        "vlbert.mvrc_head.region_cls_pred.bias": torch.randn(CLASSES, generator=g) * 0.1,
        "object_mask_word_embedding.weight": torch.randn(1, HIDDEN, generator=g) * 0.2,
        "aux_text_visual_embedding.weight": torch.randn(1, HIDDEN, generator=g) * 0.2,
    })
    state["vlbert.mlm_head.predictions.decoder.weight"] = state["vlbert.word_embeddings.weight"]
    state.update(_random_fast_rcnn(g))
    return {"module." + name: tensor for name, tensor in state.items()}


def official_vqa_checkpoint(seed=1):
    g = torch.Generator().manual_seed(seed)
    state = _random_official_vlbert(g, with_pooler=True)
    state.update({
        "final_mlp.0.dense.weight": torch.randn(HIDDEN, HIDDEN, generator=g) * 0.2,
        "final_mlp.0.dense.bias": torch.randn(HIDDEN, generator=g) * 0.1,
        "final_mlp.0.LayerNorm.weight": 1 + torch.randn(HIDDEN, generator=g) * 0.1,
        "final_mlp.0.LayerNorm.bias": torch.randn(HIDDEN, generator=g) * 0.1,
        "final_mlp.2.weight": torch.randn(ANSWERS, HIDDEN, generator=g) * 0.2,
        "final_mlp.2.bias": torch.randn(ANSWERS, generator=g) * 0.1,
    })
    return {"module." + name: tensor for name, tensor in state.items()}


# ---- independent forward over the official layout ---------------------------------------------


def _layer_norm(x, state, prefix):
    mean = x.mean(-1, keepdim=True)
    variance = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(variance + 1e-12) * state[prefix + "weight"] + state[prefix + "bias"]


def _linear(x, state, prefix):
    return x @ state[prefix + "weight"].t() + state[prefix + "bias"]


def _gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _coordinate_embedding(boxes, image_wh):
    x1, y1, x2, y2 = boxes.unbind(-1)
    w, h = image_wh.unbind(-1)
    position = torch.stack(((x1 + x2) / 2 / w * 100, (y1 + y2) / 2 / h * 100, (x2 - x1) / w * 100, (y2 - y1) / h * 100), 1)
    dim_mat = 1000 ** (torch.arange(FREQUENCIES, dtype=torch.float32) / FREQUENCIES)
    angles = position.view(-1, 4, 1) / dim_mat.view(1, 1, -1)
    return torch.cat((angles.sin(), angles.cos()), -1).view(len(boxes), -1)


def official_forward(state, text, boxes, box_mask, features, im_info, mvrc_ops):
    """Packed hidden states (B, L, H), with each sample's text length and number of objects."""
    s = {name.removeprefix("module."): tensor for name, tensor in state.items()}
    batch = len(text)
    index = box_mask.nonzero()
    down_input = torch.cat((_coordinate_embedding(boxes[box_mask], im_info[index[:, 0]]), features[box_mask]), 1)
    objects = torch.zeros(batch, boxes.shape[1], HIDDEN)
    objects[box_mask] = F.relu(_linear(down_input, s, "image_feature_extractor.obj_downsample.1."))
    sequences, types, positions = [], [], []
    for b in range(batch):
        t_len, n_obj = int((text[b] > 0).sum()), int(box_mask[b].sum())
        if n_obj:
            text_visual = objects[b, 0].expand(t_len, -1)
        else:
            text_visual = s["aux_text_visual_embedding.weight"][0].expand(t_len, -1)
        text_vl = s["vlbert.word_embeddings.weight"][text[b, :t_len]] + _layer_norm(text_visual, s, "vlbert.visual_ln_text.")
        linguistic = s["object_linguistic_embeddings.weight"][0].expand(n_obj, -1).clone()
        if "object_mask_word_embedding.weight" in s:
            linguistic[mvrc_ops[b, :n_obj] == 1] = s["object_mask_word_embedding.weight"][0]
        object_vl = linguistic + _layer_norm(objects[b, :n_obj], s, "vlbert.visual_ln_object.")
        sequences.append(torch.cat((text_vl, object_vl, s["vlbert.end_embedding.weight"]), 0))
        types.append(torch.tensor([0] * t_len + [2] * (n_obj + 1)))
        positions.append(torch.tensor(list(range(t_len)) + [t_len] * n_obj + [t_len + 1]))
    length = max(len(x) for x in sequences)
    x = torch.zeros(batch, length, HIDDEN)
    mask = torch.zeros(batch, length)
    for b, (seq, typ, pos) in enumerate(zip(sequences, types, positions)):
        n = len(seq)
        x[b, :n] = seq + s["vlbert.position_embeddings.weight"][pos] + s["vlbert.token_type_embeddings.weight"][typ]
        mask[b, :n] = 1
    x = _layer_norm(x, s, "vlbert.embedding_LayerNorm.")
    additive = ((1.0 - mask) * -10000.0)[:, None, None, :]
    head_size = HIDDEN // HEADS
    for i in range(LAYERS):
        p = f"vlbert.encoder.layer.{i}."

        def heads(y):
            return y.view(batch, length, HEADS, head_size).transpose(1, 2)

        q, k, v = (heads(_linear(x, s, p + f"attention.self.{n}.")) for n in ("query", "key", "value"))
        probabilities = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_size) + additive, -1)
        context = (probabilities @ v).transpose(1, 2).reshape(batch, length, HIDDEN)
        attended = _layer_norm(_linear(context, s, p + "attention.output.dense.") + x, s, p + "attention.output.LayerNorm.")
        inner = _gelu(_linear(attended, s, p + "intermediate.dense."))
        x = _layer_norm(_linear(inner, s, p + "output.dense.") + attended, s, p + "output.LayerNorm.")
    text_lengths = (text > 0).sum(1)
    return s, x, text_lengths, box_mask.sum(1)


def official_pretraining_logits(state, inputs):
    s, hidden, text_lengths, object_counts = official_forward(state, **inputs)
    transformed = _layer_norm(_gelu(_linear(hidden, s, "vlbert.mlm_head.predictions.transform.dense.")), s,
                              "vlbert.mlm_head.predictions.transform.LayerNorm.")
    mlm = transformed @ s["vlbert.mlm_head.predictions.decoder.weight"].t() + s["vlbert.mlm_head.predictions.bias"]
    mvrc = _linear(_gelu(_linear(hidden, s, "vlbert.mvrc_head.transform.dense.")), s, "vlbert.mvrc_head.region_cls_pred.")
    return mlm, mvrc, text_lengths, object_counts


def official_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    text_lengths, object_counts = [7, 5, 6, 4], [5, 3, 4, 0]  # the last sample is text-only
    text = torch.zeros(4, 7, dtype=torch.long)
    for b, n in enumerate(text_lengths):
        text[b, :n] = torch.randint(5, VOCAB, (n,), generator=g)
    im_info = torch.tensor([[120.0, 90.0], [64.0, 100.0], [100.0, 100.0], [80.0, 60.0]])
    corners = torch.rand(4, 5, 2, 2, generator=g).sort(2).values * im_info.view(4, 1, 1, 2)
    boxes = corners.flatten(2)[..., [0, 2, 1, 3]].clone()
    boxes[:, 0] = torch.cat((torch.zeros(4, 2), im_info - 1), 1)
    box_mask = torch.arange(5) < torch.tensor(object_counts).unsqueeze(1)
    features = torch.rand(4, 5, FEATURE, generator=g) * 3
    mvrc_ops = torch.zeros(4, 5, dtype=torch.long)
    mvrc_ops[0, 2] = mvrc_ops[2, 1] = 1
    return dict(text=text, boxes=boxes, box_mask=box_mask, features=features, im_info=im_info, mvrc_ops=mvrc_ops)


def our_inputs(official):
    return dict(
        input_ids=official["text"],
        token_type_ids=torch.zeros_like(official["text"]),
        text_mask=official["text"] > 0,
        appearance=official["features"],
        boxes=official["boxes"],
        box_mask=official["box_mask"],
        image_size=official["im_info"],
        masked_regions=official["mvrc_ops"] == 1,
    )


@pytest.fixture(scope="module")
def converted_pretraining(tmp_path_factory):
    directory = tmp_path_factory.mktemp("official")
    state = official_pretraining_checkpoint()
    torch.save({"state_dict": state, "epoch": 9}, directory / "vl-bert_base_res101_pretrain_multitask_cc-0009.model")
    result = convert_official_checkpoint(directory / "vl-bert_base_res101_pretrain_multitask_cc-0009.model",
                                         directory / "out", **TINY)
    return state, directory / "out", result


@pytest.mark.parametrize("layers", ENCODER_LAYERS)
def test_converted_pretraining_checkpoint_matches_the_official_forward(converted_pretraining, layers):
    state, out, result = converted_pretraining
    assert result.architecture == "VLBertForPreTraining"
    assert result.initialised == ["vlbert.embeddings.masked_appearance"]  # e2e models mask pixels instead
    model = load_pretrained(out).eval()
    model.use_encoder_layers(layers)
    assert isinstance(model, VLBertForPreTraining)
    inputs = official_inputs()
    with torch.no_grad():
        ours = model(**our_inputs(inputs))
        mlm, mvrc, text_lengths, object_counts = official_pretraining_logits(state, inputs)
    t = inputs["text"].shape[1]
    compared = 0
    for b in range(4):
        length, objects = int(text_lengths[b]), int(object_counts[b])
        assert torch.allclose(ours.mlm_logits[b, :length], mlm[b, :length], atol=1e-4, rtol=0)
        assert torch.allclose(ours.region_logits[b, :objects], mvrc[b, length : length + objects], atol=1e-4, rtol=0)
        assert torch.allclose(ours.vlbert.last_hidden_state[b, t + inputs["boxes"].shape[1]],
                              official_forward(state, **inputs)[1][b, length + objects], atol=1e-4, rtol=0)
        compared += length + objects
    assert compared == 22 + 12


def test_the_converted_detector_reads_under_detectron2_names(converted_pretraining):
    state, out, result = converted_pretraining
    assert result.has_detector
    detector = detectron2_names(load_file(out / "detector.safetensors"), PRESETS["vlbert-official"])
    official = {name.removeprefix("module.image_feature_extractor."): tensor for name, tensor in state.items()}
    expected = {
        "backbone.stem.conv1.weight": "backbone.conv1.weight",
        "backbone.stem.conv1.norm.running_var": "backbone.bn1.running_var",
        "backbone.res2.0.conv1.weight": "backbone.layer1.0.conv1.weight",
        "backbone.res3.0.conv3.norm.weight": "backbone.layer2.0.bn3.weight",
        "backbone.res4.0.shortcut.weight": "backbone.layer3.0.downsample.0.weight",
        "backbone.res4.0.shortcut.norm.running_mean": "backbone.layer3.0.downsample.1.running_mean",
        "roi_heads.res5.0.conv2.weight": "roi_head_feature_extractor.0.conv2.weight",
        "roi_heads.res5.1.conv3.norm.bias": "roi_head_feature_extractor.1.bn3.bias",
    }
    for ours, theirs in expected.items():
        assert torch.equal(detector[ours], official[theirs]), ours
    # 1 stem conv + 3 trunk blocks and 1 res5 block with shortcut (4 convs) + 1 res5 block (3 convs),
    # each conv with a 4-tensor norm.
    assert len(detector) == (1 + 4 * 4 + 3) * 5
    assert yaml.safe_load((out / "detector.yaml").read_text()) == {"base": "vlbert-official"}
    settings = PRESETS["vlbert-official"]
    assert settings.stem_pool == "standard" and settings.stride_in_1x1 is True
    assert (settings.res5_stride, settings.res5_dilation, settings.pooler_resolution) == (1, 2, 14)
    assert settings.pixel_mean == (102.9801, 115.9465, 122.7717) and settings.input_format == "BGR"


def test_detector_yaml_and_weights_load_into_the_extractor(converted_pretraining):
    from extract import Detector, load_config

    _, out, _ = converted_pretraining
    config = load_config(str(out / "detector.yaml"))
    assert (config.stem_pool, config.stride_in_1x1, config.res5_stride, config.res5_dilation) == ("standard", True, 1, 2)
    assert (config.pooler, config.pooler_resolution, config.pooler_sampling_ratio) == ("roialign_legacy", 14, 1)
    weights = load_file(out / "detector.safetensors")
    # This tiny checkpoint's widths and depths, read off its tensors; the rest is the YAML's.
    detector = Detector.build(str(out / "detector.yaml"), res_blocks=(1, 1, 1, 2),
                              stem_out_channels=weights["image_feature_extractor.backbone.conv1.weight"].shape[0],
                              res2_out_channels=weights["image_feature_extractor.backbone.layer1.0.conv3.weight"].shape[0],
                              bottleneck_channels=weights["image_feature_extractor.backbone.layer1.0.conv1.weight"].shape[0])
    detector.load_checkpoint(out / "detector.safetensors", trunk_only=True)
    assert torch.equal(detector.state_dict()["roi_heads.res5.1.conv3.weight"],
                       weights["image_feature_extractor.roi_head_feature_extractor.1.conv3.weight"])


@pytest.mark.parametrize("layers", ENCODER_LAYERS)
def test_converted_vqa_checkpoint_matches_the_official_forward(tmp_path, layers):
    state = official_vqa_checkpoint()
    torch.save({"state_dict": state}, tmp_path / "vqa.model")
    result = convert_official_checkpoint(tmp_path / "vqa.model", tmp_path / "out", **TINY)
    assert result.architecture == "VLBertForQuestionAnswering" and not result.has_detector
    model = load_pretrained(tmp_path / "out").eval()
    model.use_encoder_layers(layers)
    assert isinstance(model, VLBertForQuestionAnswering) and model.config.num_answers == ANSWERS
    inputs = official_inputs(seed=3)
    inputs["box_mask"][3, :2] = True  # VQA samples all have an image
    inputs["mvrc_ops"].zero_()
    answer_positions = (inputs["text"] > 0).sum(1) - 2
    with torch.no_grad():
        ours = model(**our_inputs(inputs), answer_positions=answer_positions).logits
        s, hidden, _, _ = official_forward(state, **inputs)
        at_mask = hidden[torch.arange(4), answer_positions]
        transformed = _layer_norm(_gelu(_linear(at_mask, s, "final_mlp.0.dense.")), s, "final_mlp.0.LayerNorm.")
        theirs = _linear(transformed, s, "final_mlp.2.")
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=0)


def test_unknown_keys_are_an_error_that_lists_them(tmp_path):
    state = official_pretraining_checkpoint()
    state["module.vlbert.visual_1x1_text.weight"] = torch.zeros(HIDDEN, HIDDEN)
    state["module.something_else"] = torch.zeros(1)
    torch.save({"state_dict": state}, tmp_path / "odd.model")
    with pytest.raises(ValueError, match=r"2 keys .*something_else.*visual_1x1_text"):
        convert_official_checkpoint(tmp_path / "odd.model", tmp_path / "out", **TINY)


def test_a_broken_alias_is_an_error(tmp_path):
    state = official_pretraining_checkpoint()
    state["module.vlbert.mlm_head.predictions.decoder.weight"] = state["module.vlbert.word_embeddings.weight"] + 1
    torch.save({"state_dict": state}, tmp_path / "untied.model")
    with pytest.raises(ValueError, match="decoder.weight should equal"):
        convert_official_checkpoint(tmp_path / "untied.model", tmp_path / "out", **TINY)


def _convert(*arguments) -> Result:
    return CliRunner().invoke(main, ["convert-official", *map(str, arguments)])


def test_cli_reports_an_unconvertible_checkpoint(tmp_path):
    torch.save({"state_dict": official_vqa_checkpoint()}, tmp_path / "vqa.model")
    # The checkpoint is tiny, so the official base sizes (2048-d appearance, 256 frequencies) do not fit.
    result = _convert(tmp_path / "vqa.model", "--out", tmp_path / "out")
    assert result.exit_code == 2 and result.output == (
        f"Error: {tmp_path / 'vqa.model'}: obj_downsample takes 56 inputs, expected appearance 2048 + geometry 2048\n")
    assert not (tmp_path / "out").exists()


def test_a_conversion_that_fails_while_writing_leaves_no_folder_and_a_folder_in_use_is_refused(tmp_path, monkeypatch):
    import vlbert.convert_official

    def half_written(source, out_dir, **options):
        (out_dir / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(vlbert.convert_official, "convert_official_checkpoint", half_written)
    torch.save({"state_dict": official_vqa_checkpoint()}, tmp_path / "vqa.model")
    result = _convert(tmp_path / "vqa.model", "--out", tmp_path / "out")
    assert result.exit_code != 0 and "No space left on device" in result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["vqa.model"]  # no output, no staging folder

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("kept")
    result = _convert(tmp_path / "vqa.model", "--out", tmp_path / "out")
    assert result.exit_code == 2 and result.output == (
        f"Error: {tmp_path / 'out'}: exists and is not an empty folder; convert into a new one\n")
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["mine.txt"]


NOT_TORCH_SAVE = ("not a PyTorch checkpoint; expected a file written by torch.save (a zip archive, or the legacy "
                  "pickle format of the official vl-bert-*.model files)")


def _half_of_a_checkpoint(path):
    torch.save({"state_dict": official_vqa_checkpoint()}, path)
    path.write_bytes(path.read_bytes()[:4096])


# Files given in place of an official checkpoint (written to the path given) → what the one line says.
NOT_CHECKPOINTS = {
    "empty": (lambda path: path.write_text(""), NOT_TORCH_SAVE),
    "json": (lambda path: path.write_text('{"state_dict": {}}'), NOT_TORCH_SAVE),
    "truncated": (_half_of_a_checkpoint, "a damaged PyTorch checkpoint (PytorchStreamReader failed reading zip "
                                         "archive: failed finding central directory"),
    "another model": (lambda path: torch.save({"state_dict": {"module.fc.weight": torch.zeros(2, 2)}}, path),
                      "not an official VL-BERT checkpoint, it lacks vlbert.word_embeddings.weight"),
    # The official files' own format, before PyTorch 1.6: read as such.
    "another model, legacy format": (
        lambda path: torch.save({"state_dict": {"fc.weight": torch.zeros(2)}}, path,
                                _use_new_zipfile_serialization=False),
        "not an official VL-BERT checkpoint, it lacks vlbert.word_embeddings.weight"),
    "a list": (lambda path: torch.save([torch.zeros(2)], path),
               "not a VL-BERT checkpoint; expected a state dict of tensors, or a dict with one under 'state_dict', "
               "found list"),
}


@pytest.mark.parametrize("case", NOT_CHECKPOINTS)
def test_a_file_that_is_no_official_checkpoint_is_one_line_naming_it(tmp_path, case):
    write, problem = NOT_CHECKPOINTS[case]
    source = tmp_path / "vl-bert-base-e2e.model"
    write(source)
    result = _convert(source, "--out", tmp_path / "out")
    assert result.exit_code == 2 and result.output.startswith(f"Error: {source}: {problem}")
    assert result.output.count("\n") == 1 and not (tmp_path / "out").exists()


def test_cli_converts_an_official_size_projection(tmp_path):
    state = official_vqa_checkpoint()
    # Official appearance (2048) and geometry (4 × 2 × 256) sizes around a tiny transformer.
    state["module.image_feature_extractor.obj_downsample.1.weight"] = torch.randn(HIDDEN, 2048 + 2048)
    torch.save({"state_dict": state}, tmp_path / "vqa.model")
    result = _convert(tmp_path / "vqa.model", "--out", tmp_path / "out", "--num-attention-heads", "4")
    assert result.exit_code == 0, result.output
    assert "VLBertForQuestionAnswering" in result.output
    model = load_pretrained(tmp_path / "out")
    projection = model.vlbert.embeddings.visual_feature_embedding.projection.weight
    official = state["module.image_feature_extractor.obj_downsample.1.weight"]
    assert torch.equal(projection[:, :2048], official[:, 2048:])  # appearance first here, geometry first there
    assert torch.equal(projection[:, 2048:], official[:, :2048])


def test_pickled_objects_need_trust(tmp_path):
    state = official_vqa_checkpoint()
    state["module.image_feature_extractor.obj_downsample.1.weight"] = torch.randn(HIDDEN, 2048 + 2048)
    torch.save({"state_dict": state, "validation_monitor": {"best_val": _Score(0.7)}}, tmp_path / "vqa.model")
    arguments = [tmp_path / "vqa.model", "--out", tmp_path / "out", "--num-attention-heads", "4"]
    refused = _convert(*arguments)
    assert refused.exit_code == 2 and refused.output == (
        f"Error: {tmp_path / 'vqa.model'} holds objects beyond tensors ({_Score.__module__}._Score); convert it with "
        "--trust-pickle (trust_pickle=True) only if you trust the file\n")
    assert _convert(*arguments, "--trust-pickle").exit_code == 0


class _Score(float):
    """Stands for the non-tensor objects (numpy scalars) the official files pickle."""
