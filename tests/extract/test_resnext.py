"""A ResNeXt C4 detector (VinVL's X152-C4 layout) is one preset: grouped bottlenecks from the same block
factory in the trunk and in res5, shapes read from the backbone, and weights under maskrcnn-benchmark's
key names loaded through its key map."""

import pytest
import torch
from safetensors.torch import save_file

from extract import Detector
from extract.checkpoint import CheckpointError
from extract.presets import PRESETS
from extract.synthetic import synthetic_image

RESNEXT = dict(num_groups=4, bottleneck_channels=16, stride_in_1x1=False, stem_pool="standard", res5_stride=2,
               res5_dilation=1, pooler="roialign_legacy", anchor_sizes=(32.0, 64.0, 128.0))


def maskrcnn_benchmark_state(detector: Detector) -> dict[str, torch.Tensor]:
    """The detector's weights as maskrcnn-benchmark (scene_graph_benchmark) writes them: its module
    names, background and "no attribute" first, a background box regression, ratio-major anchors,
    the attribute head's copy of the box feature extractor, and a DataParallel prefix."""
    cfg, state = detector.cfg, detector.state_dict()
    sizes, ratios = len(cfg.anchor_sizes), len(cfg.anchor_ratios)

    def ratio_major(tensor):
        per_anchor = tensor.shape[0] // (sizes * ratios)
        return tensor.reshape(sizes, ratios, per_anchor, *tensor.shape[1:]).transpose(0, 1).reshape(tensor.shape)

    def background_first(tensor):
        return torch.cat((tensor[-1:], tensor[:-1]))

    theirs = {}
    for key, value in state.items():
        parts = key.split(".")
        if key.startswith("backbone.stem."):
            name = "backbone.body.stem." + ("conv1.weight" if parts[-1] == "weight" and "norm" not in parts
                                            else f"bn1.{parts[-1]}")
        elif key.startswith(("backbone.res", "roi_heads.res5.")):
            stage = "roi_heads.box.feature_extractor.head.layer4" if key.startswith("roi_heads") else \
                f"backbone.body.layer{int(parts[1][3]) - 1}"
            block, layer = parts[2], parts[3]
            if layer == "shortcut":
                name = f"{stage}.{block}.downsample.{1 if 'norm' in parts else 0}.{parts[-1]}"
            else:
                name = f"{stage}.{block}.{'bn' if 'norm' in parts else 'conv'}{layer[-1]}.{parts[-1]}"
        elif key.startswith("proposal_generator.rpn_head."):
            module = {"conv": "conv", "objectness_logits": "cls_logits", "anchor_deltas": "bbox_pred"}[parts[2]]
            name = f"rpn.head.{module}.{parts[-1]}"
            value = value if module == "conv" else ratio_major(value)
        elif parts[2] in ("cls_score", "bbox_pred"):
            name = f"roi_heads.box.predictor.{parts[2]}.{parts[-1]}"
            value = background_first(value) if parts[2] == "cls_score" else torch.cat((torch.randn(4, *value.shape[1:]), value))
        else:
            name = f"roi_heads.attribute.predictor.{parts[2]}.{parts[-1]}"
            value = background_first(value) if parts[2] in ("cls_embedding", "attr_score") else value
        theirs["module." + name] = value.clone()
    for key in [k for k in theirs if k.startswith("module.roi_heads.box.feature_extractor.")]:
        theirs[key.replace(".box.feature_extractor.", ".attribute.feature_extractor.")] = theirs[key].clone()
    theirs["module.rpn.anchor_generator.cell_anchors.0"] = torch.zeros(sizes * ratios, 4)
    return theirs


@pytest.fixture(scope="module")
def resnext():
    return Detector.build("tiny", init_seed=3, **RESNEXT)


def test_a_resnext_c4_detector_has_grouped_convolutions_in_the_trunk_and_in_res5(resnext):
    assert resnext.backbone.res2[0].conv2.groups == resnext.roi_heads.res5[0].conv2.groups == 4
    assert resnext.backbone.res4[0].conv2.weight.shape == (64, 64 // 4, 3, 3)
    assert resnext.roi_heads.res5[0].conv2.weight.shape == (128, 128 // 4, 3, 3)
    assert resnext.backbone.output_shape.channels == resnext.roi_heads.res5[0].conv1.in_channels == 128
    assert resnext.cfg.feature_dim == resnext.roi_heads.box_predictor.cls_score.in_features == 256


def test_maskrcnn_benchmark_weights_load_through_the_key_map(resnext, tmp_path):
    path = tmp_path / "vinvl-like.pth"  # as VinVL publishes its detector: {"model": state dict}
    torch.save({"model": maskrcnn_benchmark_state(resnext), "iteration": 1}, path)
    loaded = Detector.build("tiny", **RESNEXT)
    loaded.load_checkpoint(path)
    ours = resnext.state_dict()
    assert all(torch.equal(value, ours[key]) for key, value in loaded.state_dict().items())
    image = loaded.prepare(synthetic_image(96, 128, seed=2))
    a, b = resnext.detect([image])[0], loaded.detect([image])[0]
    assert torch.equal(torch.as_tensor(a.features), torch.as_tensor(b.features))


def test_a_key_the_map_does_not_know_is_named(resnext, tmp_path):
    state = maskrcnn_benchmark_state(resnext)
    state["module.roi_heads.mask.predictor.weight"] = torch.zeros(1)
    path = tmp_path / "extra.safetensors"
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match="1 maskrcnn-benchmark key.*roi_heads.mask.predictor.weight"):
        Detector.build("tiny", **RESNEXT).load_checkpoint(path)


def test_the_vinvl_x152c4_preset_has_vinvl_s_shapes():
    cfg = PRESETS["vinvl-x152c4"]
    assert (cfg.res_blocks, cfg.num_groups, cfg.bottleneck_channels // cfg.num_groups) == ((3, 8, 36, 3), 32, 8)
    assert (cfg.num_classes, cfg.num_attributes, cfg.feature_dim) == (1594, 524, 2048)
    with torch.device("meta"):  # shapes only: ~90M parameters need no memory
        detector = Detector(cfg)
    state = detector.state_dict()
    assert state["backbone.res4.35.conv2.weight"].shape == (1024, 1024 // 32, 3, 3)
    assert state["roi_heads.res5.2.conv2.weight"].shape == (2048, 2048 // 32, 3, 3)
    assert state["roi_heads.box_predictor.cls_score.weight"].shape == (1595, 2048)
    assert state["roi_heads.box_predictor.bbox_pred.weight"].shape == (1594 * 4, 2048)
    assert state["roi_heads.box_predictor.attr_score.weight"].shape == (525, cfg.attr_hidden_dim)
    assert state["proposal_generator.rpn_head.objectness_logits.weight"].shape == (15, 1024, 1, 1)
