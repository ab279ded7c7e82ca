#!/usr/bin/env python3
"""Training FLOPs per image of Mask R-CNN (ResNet-50-FPN) as NVIDIA DeepLearningExamples trains it.

An architecture fact the performance model reads from ``catalog/data/workloads.csv``
(``flops_per_sample`` of ``maskrcnn``), computed here from the layer shapes so it can be checked and
redone. The published figure for the model (about 260 GMACs at 1333x800, MMDetection's model zoo)
is an inference count: 1,000 proposals through the box head and 100 detections through the mask
head, every layer forward only. Training as DLE's TensorFlow 2 implementation does it
(``TensorFlow2/Segmentation/MaskRCNN/mrcnn_tf2``, ``config.py`` and ``model/``) differs in what
runs and what is differentiated:

- images padded to 832 x 1344 (``image_size``);
- the stem and the first stage of ResNet-50 are frozen (``trainable=False`` in
  ``models/resnet50/resnet.py``): forward only, and nothing upstream of them needs a gradient, so
  the layers that read the first stage's output (the second stage's first block and FPN's P2
  lateral) compute weight gradients only;
- FPN levels 2-6 with 256 channels, P6 a stride-2 pooling of P5 (``models/fpn.py``); the RPN head
  (3x3 conv, 3 anchors) on every level (``models/heads.py``);
- 512 sampled proposals per image through the box head (``batch_size_per_im``: two 1,024-wide
  fully connected layers on 7x7x256 RoI features, 91 classes);
- the mask head on 128 foreground proposals per image (``batch_size_per_im x fg_fraction``, padded
  to that fixed count by ``select_fg_for_masks``): four 3x3 convolutions at 14x14, a 2x2 stride-2
  transposed convolution and a 1x1 classifier at 28x28.

A trainable layer's backward pass is twice its forward (data and weight gradients); 1 MAC = 2
FLOPs. RoIAlign, NMS, anchor matching and losses are not multiply-accumulates and are left out
(the model's share of FLOPs off the tensor cores and its fixed time per micro-batch cover them).
The inference count at MMDetection's settings comes out at 258 GMACs against the zoo's ~260, so
the layer shapes are right.

    python scripts/maskrcnn_flops.py
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

TRAIN_SIZE = (832, 1344)
"""DLE config.py ``image_size``."""
TRAIN_BOX_ROIS = 512
"""DLE config.py ``batch_size_per_im``."""
TRAIN_MASK_ROIS = 128
"""DLE config.py ``batch_size_per_im x fg_fraction`` (512 x 0.25)."""
INFER_SIZE = (800, 1333)
INFER_BOX_ROIS = 1000
INFER_MASK_ROIS = 100
CLASSES = 91
FPN = 256
ANCHORS = 3


@dataclass
class Count:
    """Forward MACs by role: frozen (forward only), weight-gradient only, fully trainable."""

    frozen: float = 0.0
    weight_grad_only: float = 0.0
    trainable: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)

    def add(self, part: str, macs: float, role: str = "trainable") -> None:
        setattr(self, role, getattr(self, role) + macs)
        self.parts[part] = self.parts.get(part, 0.0) + macs

    @property
    def forward(self) -> float:
        return self.frozen + self.weight_grad_only + self.trainable

    @property
    def training_macs(self) -> float:
        """Forward everywhere, plus weight gradients where trainable, plus data gradients where
        something upstream is trainable."""
        return self.forward + self.weight_grad_only + 2 * self.trainable


def conv(h: int, w: int, cin: int, cout: int, k: int) -> float:
    """MACs of a k x k convolution producing an h x w x cout map."""
    return h * w * cin * cout * k * k


def resnet50(count: Count, size: tuple[int, int], frozen_stem: bool) -> dict[int, tuple[int, int, int]]:
    """ResNet-50 v1.5 (stride on the 3x3) MACs; returns the (h, w, channels) of C2-C5."""
    h, w = math.ceil(size[0] / 2), math.ceil(size[1] / 2)
    count.add("backbone", conv(h, w, 3, 64, 7), "frozen" if frozen_stem else "trainable")
    h, w = math.ceil(h / 2), math.ceil(w / 2)  # max pool
    cin, out = 64, {}
    for level, (blocks, width, stride) in enumerate([(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)], start=2):
        for b in range(blocks):
            s = stride if b == 0 else 1
            oh, ow = math.ceil(h / s), math.ceil(w / s)
            if frozen_stem and level == 2:
                first = rest = "frozen"
            elif frozen_stem and level == 3 and b == 0:
                first, rest = "weight_grad_only", "trainable"  # reads the frozen stage's output
            else:
                first = rest = "trainable"
            count.add("backbone", conv(h, w, cin, width, 1), first)
            count.add("backbone", conv(oh, ow, width, width, 3), rest)
            count.add("backbone", conv(oh, ow, width, 4 * width, 1), rest)
            if b == 0:
                count.add("backbone", conv(oh, ow, cin, 4 * width, 1), first)
            h, w, cin = oh, ow, 4 * width
        out[level] = (h, w, cin)
    return out


def mask_rcnn(size: tuple[int, int], box_rois: int, mask_rois: int, training: bool) -> Count:
    """Forward MACs per image by role (inference: every layer counted as trainable, forward only)."""
    count = Count()
    feats = resnet50(count, size, frozen_stem=training)
    levels = {}
    for level, (h, w, c) in feats.items():
        role = "weight_grad_only" if training and level == 2 else "trainable"
        count.add("fpn", conv(h, w, c, FPN, 1), role)  # lateral
        count.add("fpn", conv(h, w, FPN, FPN, 3))  # post-hoc 3x3
        levels[level] = (h, w)
    h5, w5 = levels[5]
    levels[6] = (math.ceil(h5 / 2), math.ceil(w5 / 2))  # stride-2 pooling of P5: no MACs
    for h, w in levels.values():
        count.add("rpn", conv(h, w, FPN, FPN, 3) + conv(h, w, FPN, ANCHORS, 1) + conv(h, w, FPN, 4 * ANCHORS, 1))
    fc = 7 * 7 * FPN * 1024 + 1024 * 1024 + 1024 * CLASSES + 1024 * 4 * CLASSES
    count.add("box head", box_rois * fc)
    mask = 4 * conv(14, 14, FPN, FPN, 3) + conv(28, 28, FPN, FPN, 1) + conv(28, 28, FPN, CLASSES, 1)
    # the 2x2 stride-2 transposed convolution: each of the 14x14 inputs meets 2x2 outputs: 14*14*256*256*4
    count.add("mask head", mask_rois * mask)
    return count


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    infer = mask_rcnn(INFER_SIZE, INFER_BOX_ROIS, INFER_MASK_ROIS, training=False)
    train = mask_rcnn(TRAIN_SIZE, TRAIN_BOX_ROIS, TRAIN_MASK_ROIS, training=True)
    print(f"inference at {INFER_SIZE[1]}x{INFER_SIZE[0]}, {INFER_BOX_ROIS} boxes, {INFER_MASK_ROIS} masks: "
          f"{infer.forward / 1e9:.0f} GMACs forward")
    print(f"DLE training at {TRAIN_SIZE[1]}x{TRAIN_SIZE[0]}, {TRAIN_BOX_ROIS} boxes, {TRAIN_MASK_ROIS} masks: "
          f"{train.forward / 1e9:.0f} GMACs forward "
          + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in train.parts.items()))
    print(f"  frozen {train.frozen / 1e9:.1f}, weight gradient only {train.weight_grad_only / 1e9:.1f}, "
          f"trainable {train.trainable / 1e9:.1f} GMACs")
    print(f"  training FLOPs per image: {2 * train.training_macs:.3g} "
          f"(3 x forward would be {6 * train.forward:.3g})")


if __name__ == "__main__":
    main()
