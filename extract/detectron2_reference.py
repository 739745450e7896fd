"""A detectron2 model mirroring one of our detector configs, for the parity tests and the benchmark.

Upstream detectron2 cannot express the bottom-up-attention layout; for such configs this patches
in the two things its fork changed: the caffe max-pool stem, and res5 with stride 1 and dilation 2.
The C4 base config is set field by field (detectron2's model-zoo lookup needs pkg_resources).
"""

import types

import torch.nn.functional as F
from torch import nn

from extract.modeling.parts import part_shape


def caffe_stem_forward(stem, x):
    return F.max_pool2d(F.relu_(stem.conv1(x)), kernel_size=3, stride=2, padding=0, ceil_mode=True)


# detectron2's ResNet depths by their blocks per stage (res2-res5).
DEPTHS = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152}
POOLERS = {"roipool": "ROIPool", "roialign": "ROIAlignV2", "roialign_legacy": "ROIAlign"}


def detectron2_config(ours, device: str = "cpu"):
    """The detectron2 config of a C4 model with the architecture of `ours` (a DetectorConfig),
    up to the bottom-up-attention changes that `detectron2_model` patches in."""
    from detectron2.config import get_cfg

    cfg = get_cfg()  # defaults: res4 features, FrozenBN, stride in 1x1, 14x14 pooling
    cfg.MODEL.META_ARCHITECTURE = "GeneralizedRCNN"  # COCO-Detection/faster_rcnn_R_101_C4_3x:
    cfg.MODEL.ROI_HEADS.NAME = "Res5ROIHeads"
    cfg.MODEL.MASK_ON = False
    cfg.MODEL.WEIGHTS = ""
    cfg.MODEL.DEVICE = device
    cfg.MODEL.RESNETS.DEPTH = DEPTHS[tuple(ours.res_blocks)]  # and where `ours` may differ from it:
    cfg.MODEL.RESNETS.STEM_OUT_CHANNELS = ours.stem_out_channels
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = ours.res2_out_channels
    cfg.MODEL.RESNETS.NUM_GROUPS = ours.num_groups
    cfg.MODEL.RESNETS.WIDTH_PER_GROUP = ours.bottleneck_channels // ours.num_groups
    cfg.MODEL.RESNETS.STRIDE_IN_1X1 = ours.stride_in_1x1
    cfg.MODEL.RPN.PRE_NMS_TOPK_TEST = ours.rpn_pre_nms_topk
    cfg.MODEL.RPN.NMS_THRESH = ours.rpn_nms_thresh
    cfg.MODEL.PIXEL_MEAN = list(ours.pixel_mean)
    cfg.MODEL.PIXEL_STD = list(ours.pixel_std)
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = ours.num_classes
    cfg.MODEL.RPN.CONV_DIMS = [ours.rpn_hidden_channels]
    cfg.MODEL.RPN.POST_NMS_TOPK_TEST = ours.rpn_post_nms_topk
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [list(ours.anchor_sizes)]
    cfg.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS = [list(ours.anchor_ratios)]
    cfg.MODEL.ROI_BOX_HEAD.POOLER_TYPE = POOLERS[ours.pooler]
    cfg.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION = ours.pooler_resolution
    cfg.MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO = ours.pooler_sampling_ratio
    cfg.MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS = tuple(ours.bbox_reg_weights)
    cfg.INPUT.FORMAT = ours.input_format
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = ours.min_size, ours.max_size
    return cfg


def detectron2_model(ours, device: str = "cpu"):
    """An eval-mode detectron2 GeneralizedRCNN with the architecture of `ours` (a DetectorConfig)."""
    from detectron2.modeling import build_model
    from detectron2.modeling.backbone.resnet import BottleneckBlock, ResNet

    model = build_model(detectron2_config(ours, device)).eval()
    if ours.stem_pool == "caffe":
        model.backbone.stem.forward = types.MethodType(caffe_stem_forward, model.backbone.stem)
    if ours.res5_stride != 2 or ours.res5_dilation != 1:
        blocks = ours.res_blocks[3]
        model.roi_heads.res5 = nn.Sequential(*ResNet.make_stage(
            BottleneckBlock, blocks, stride_per_block=[ours.res5_stride] + [1] * (blocks - 1),
            in_channels=part_shape("backbone", ours).channels, bottleneck_channels=ours.bottleneck_channels * 8,
            out_channels=ours.feature_dim, num_groups=ours.num_groups, norm="FrozenBN",
            stride_in_1x1=ours.stride_in_1x1,
            dilation=ours.res5_dilation)).to(device).eval()
    return model
