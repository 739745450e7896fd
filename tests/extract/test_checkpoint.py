"""Loading detectron2-named checkpoints: formats, strictness, and the trunk against torchvision's ResNet."""

import pickle

import numpy as np
import pytest
import torch
import torchvision
from torchvision.ops import roi_align

from extract import CheckpointError, Detector, load_weights, read_state_dict
from extract.presets import PRESETS
from extract.synthetic import synthetic_image
from tests.helpers.detection import randomized_state


def test_butd_keys_are_detectron2_names():
    keys = set(Detector(PRESETS["butd-vg"]).state_dict())
    for key in ("backbone.stem.conv1.weight", "backbone.stem.conv1.norm.running_var",
                "backbone.res4.22.conv2.norm.running_var", "backbone.res2.0.shortcut.weight",
                "roi_heads.res5.2.conv3.weight", "roi_heads.res5.0.shortcut.norm.bias",
                "proposal_generator.rpn_head.conv.weight", "proposal_generator.rpn_head.objectness_logits.bias",
                "proposal_generator.rpn_head.anchor_deltas.weight", "roi_heads.box_predictor.cls_score.weight",
                "roi_heads.box_predictor.bbox_pred.bias", "roi_heads.box_predictor.cls_embedding.weight",
                "roi_heads.box_predictor.fc_attr.weight", "roi_heads.box_predictor.attr_score.bias"):
        assert key in keys, key
    assert not any("num_batches_tracked" in k or "anchor" in k.replace("anchor_deltas", "") for k in keys)


@pytest.mark.parametrize("suffix", [".pkl", ".pth", ".safetensors"])
def test_checkpoint_formats_round_trip(tmp_path, suffix):
    source = Detector.build("tiny")
    state = randomized_state(source)
    path = tmp_path / f"model{suffix}"
    if suffix == ".pkl":
        with path.open("wb") as f:
            pickle.dump({"model": state, "__author__": "test"}, f)
    elif suffix == ".pth":
        torch.save({"model": {k: torch.from_numpy(v) for k, v in state.items()}}, path)
    else:
        from safetensors.torch import save_file

        save_file({k: torch.from_numpy(v) for k, v in state.items()}, str(path))
    loaded = Detector.build("tiny", weights=path)
    for key, value in loaded.state_dict().items():
        assert np.array_equal(value.numpy(), state[key]), key
    image = loaded.prepare(synthetic_image(80, 100))
    assert not torch.allclose(loaded.detect([image])[0].image_feature, source.detect([image])[0].image_feature)


def write_pkl(path, state):
    with path.open("wb") as f:
        pickle.dump({"model": state}, f)
    return path


def test_missing_unexpected_and_misshaped_keys_are_all_named(tmp_path):
    detector = Detector.build("tiny")
    state = randomized_state(detector)
    del state["backbone.res3.0.conv2.norm.running_var"]
    state["roi_heads.box_predictor.extra.weight"] = np.zeros(3, np.float32)
    state["roi_heads.box_predictor.cls_score.weight"] = np.zeros((5, 256), np.float32)
    path = write_pkl(tmp_path / "bad.pkl", state)
    before = {k: v.clone() for k, v in detector.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_weights(detector, read_state_dict(path), source=str(path))
    message = str(info.value)
    assert "1 missing key(s):\n    backbone.res3.0.conv2.norm.running_var" in message
    assert "1 unexpected key(s):\n    roi_heads.box_predictor.extra.weight" in message
    assert "roi_heads.box_predictor.cls_score.weight: checkpoint (5, 256), model (7, 256)" in message
    assert all(torch.equal(before[k], v) for k, v in detector.state_dict().items())


@pytest.mark.parametrize("content, message", [
    (b"not a pickle", "broken.pkl: not a readable pickle"),
    (pickle.dumps({"model": {"a": "text"}}), "entry 'a' is a str"),
    (pickle.dumps([1, 2, 3]), "expected a mapping"),
])
def test_unreadable_checkpoints_are_named(tmp_path, content, message):
    path = tmp_path / "broken.pkl"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        read_state_dict(path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        read_state_dict(tmp_path / "absent.pkl")
    with pytest.raises(CheckpointError, match="unknown checkpoint format"):
        read_state_dict(path.rename(tmp_path / "model.bin"))


def detectron2_name(torchvision_name: str) -> str:
    name = torchvision_name.replace("conv1.", "stem.conv1.", 1) if torchvision_name.startswith("conv1") else torchvision_name
    name = name.replace("bn1.", "stem.conv1.norm.", 1) if name.startswith("bn1") else name
    for i, stage in enumerate(("res2", "res3", "res4", "res5")):
        name = name.replace(f"layer{i + 1}.", f"{stage}.", 1)
    for old, new in ((".downsample.0.", ".shortcut."), (".downsample.1.", ".shortcut.norm."),
                     (".bn1.", ".conv1.norm."), (".bn2.", ".conv2.norm."), (".bn3.", ".conv3.norm.")):
        name = name.replace(old, new)
    return ("roi_heads." if name.startswith("res5") else "backbone.") + name


def test_trunk_and_res5_match_torchvision_resnet():
    """With the stride in the 3x3 conv and the standard stem, a C4 detector is torchvision's ResNet
    cut after layer3 (trunk) with layer4 as the RoI head: an independent numerical reference."""
    reference = torchvision.models.resnet.ResNet(torchvision.models.resnet.Bottleneck, [1, 2, 1, 1]).eval()
    detector = Detector.build("tiny", res_blocks=(1, 2, 1, 1), stem_out_channels=64, res2_out_channels=256,
                              bottleneck_channels=64, stride_in_1x1=False, stem_pool="standard",
                              res5_stride=2, res5_dilation=1, pooler="roialign", pooler_sampling_ratio=0)
    state = randomized_state(detector, seed=4)
    reference_state = {
        name: torch.from_numpy(state[detectron2_name(name)])
        for name in reference.state_dict() if "num_batches_tracked" not in name and not name.startswith("fc.")
    }
    assert len(reference_state) == len([k for k in state if k.startswith(("backbone.", "roi_heads.res5."))])
    reference.load_state_dict(reference_state, strict=False)
    load_weights(detector, {k: torch.from_numpy(v) for k, v in state.items()})

    image = detector.prepare(synthetic_image(64, 96))
    x = image.tensor[None]
    with torch.no_grad():
        ref_res4 = reference.layer3(reference.layer2(reference.layer1(
            reference.maxpool(reference.relu(reference.bn1(reference.conv1(x)))))))
        boxes = torch.tensor([[0.0, 0.0, 90.0, 60.0], [10.0, 12.0, 50.0, 40.0]])
        rois = torch.cat((torch.zeros(2, 1), image.to_input(boxes)), dim=1)
        ref_features = reference.layer4(roi_align(ref_res4, rois, 14, 1 / 16, 0, aligned=True)).mean(dim=(2, 3))
    assert torch.allclose(detector.backbone(x), ref_res4, atol=1e-4, rtol=1e-4)
    region = detector.describe([image], [boxes])[0]
    assert torch.allclose(region.features, ref_features, atol=1e-4, rtol=1e-4)


def test_recorded_anchors_and_pixel_means_are_checked_then_dropped(tmp_path):
    detector = Detector.build("tiny")
    state = randomized_state(detector)
    state["proposal_generator.anchor_generator.cell_anchors.0"] = detector.proposal_generator.cell_anchors.numpy()
    state["pixel_mean"] = np.array(detector.cfg.pixel_mean, np.float32).reshape(3, 1, 1)
    loaded = Detector.build("tiny", weights=write_pkl(tmp_path / "ok.pkl", state))
    assert np.array_equal(loaded.state_dict()["backbone.stem.conv1.weight"].numpy(), state["backbone.stem.conv1.weight"])

    # anchors in torchvision's ratio-major order are a different model: refused, not silently used
    ratio_major = detector.proposal_generator.cell_anchors.view(4, 3, 4).transpose(0, 1).reshape(12, 4)
    state["proposal_generator.anchor_generator.cell_anchors.0"] = ratio_major.numpy()
    with pytest.raises(CheckpointError, match="cell_anchors.0 in the checkpoint"):
        Detector.build("tiny", weights=write_pkl(tmp_path / "anchors.pkl", state))
    del state["proposal_generator.anchor_generator.cell_anchors.0"]
    state["pixel_mean"] = np.array([103.53, 116.28, 123.675], np.float32)
    with pytest.raises(CheckpointError, match="pixel_mean in the checkpoint"):
        Detector.build("tiny", weights=write_pkl(tmp_path / "means.pkl", state))


def test_folded_batch_norms_load_as_identity_statistics(tmp_path):
    detector = Detector.build("tiny")
    state = randomized_state(detector)
    folded = {k: v for k, v in state.items() if not k.endswith(("running_mean", "running_var"))}
    loaded = Detector.build("tiny", weights=write_pkl(tmp_path / "folded.pkl", folded))
    norm = loaded.backbone.res2[0].conv1.norm
    assert torch.equal(norm.running_mean, torch.zeros_like(norm.running_mean))
    assert torch.equal(norm.running_var, torch.ones_like(norm.running_var))
    partial = dict(folded, **{"backbone.stem.conv1.norm.running_var": state["backbone.stem.conv1.norm.running_var"]})
    with pytest.raises(CheckpointError, match="missing key"):
        Detector.build("tiny", weights=write_pkl(tmp_path / "partial.pkl", partial))


def test_trunk_only_checkpoints_load_for_end_to_end_tuning(tmp_path):
    detector = Detector.build("tiny")
    state = randomized_state(detector)
    trunk = {k: v for k, v in state.items() if k.startswith(("backbone.", "roi_heads.res5."))}
    path = write_pkl(tmp_path / "trunk.pkl", trunk)
    with pytest.raises(CheckpointError, match="missing key"):
        Detector.build("tiny", weights=path)
    detector.load_checkpoint(path, trunk_only=True)
    assert np.array_equal(detector.state_dict()["roi_heads.res5.0.conv2.weight"].numpy(),
                          state["roi_heads.res5.0.conv2.weight"])
    partial = dict(trunk)
    del partial["backbone.res3.0.conv1.weight"]
    with pytest.raises(CheckpointError, match="backbone.res3.0.conv1.weight"):
        detector.load_checkpoint(write_pkl(tmp_path / "partial.pkl", partial), trunk_only=True)


def test_legacy_roialign_matches_torchvision_unaligned():
    """`roialign_legacy` pools without the half-pixel offset, as maskrcnn-benchmark did."""
    aligned = Detector.build("tiny", pooler="roialign", pooler_sampling_ratio=1)
    legacy = Detector.build("tiny", pooler="roialign_legacy", pooler_sampling_ratio=1)
    res4 = torch.randn(1, aligned.backbone.output_shape.channels, 6, 8)
    rois = torch.tensor([[0.0, 8.0, 8.0, 72.0, 60.0]])
    expected = roi_align(res4, rois, 14, 1 / 16, 1, aligned=False)
    assert torch.equal(legacy.roi_heads.pool(res4, rois), expected)
    assert not torch.allclose(aligned.roi_heads.pool(res4, rois), expected)
