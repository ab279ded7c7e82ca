#!/usr/bin/env python3
"""Share of the multiply-accumulates in depthwise convolutions of the EfficientNets in the catalog.

An architecture fact the performance model reads from ``catalog/data/workloads.csv``
(``depthwise_flop_share``): depthwise convolutions run on CUDA cores, not tensor cores. Computed
here from the published layer tables, so the figures can be checked and redone:

- EfficientNet-B0: Tan & Le 2019, "EfficientNet: Rethinking Model Scaling for Convolutional
  Neural Networks", Table 1 (stages of MBConv blocks: expansion, kernel, stride, channels,
  repeats), squeeze-excitation ratio 0.25 of the block's input channels; B4 scales width by 1.4
  and depth by 1.8 at 380 px (the paper's compound-scaling coefficients; channels rounded to
  multiples of 8 as the reference implementation does).
- EfficientNetV2-S: Tan & Le 2021, "EfficientNetV2: Smaller Models and Faster Training",
  Table 4 (Fused-MBConv stages have no depthwise convolution).

An MBConv block: 1x1 expansion (skipped at expansion 1), k x k depthwise convolution, squeeze-
excitation, 1x1 projection. The share counts forward MACs; backward repeats each layer's pattern
(data and weight gradients), so it is also the share of the training FLOPs. The totals land on
the papers' (B0 0.386 vs 0.39 GMACs, B4 3.99 vs 4.2, V2-S 8.37 vs 8.8 at 384 px).

    python scripts/depthwise_share.py
"""

from __future__ import annotations

import math

B0_STAGES = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]  # fmt: skip
"""Tan & Le 2019 Table 1, stages 2-8: (expansion, kernel, stride, output channels, repeats)."""
V2S_STAGES = [("fused", 1, 3, 1, 24, 2), ("fused", 4, 3, 2, 48, 4), ("fused", 4, 3, 2, 64, 4), ("mbconv", 4, 3, 2, 128, 6), ("mbconv", 6, 3, 1, 160, 9), ("mbconv", 6, 3, 2, 256, 15)]  # fmt: skip
"""Tan & Le 2021 Table 4, stages 1-6: (block, expansion, kernel, stride, output channels, repeats)."""
SE_RATIO = 0.25
HEAD_CHANNELS = 1280
CLASSES = 1000


def round_filters(channels: int, width: float, divisor: int = 8) -> int:
    """Channels after width scaling, rounded to a multiple of ``divisor`` (never below 90%)."""
    scaled = channels * width
    out = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * scaled else out


def efficientnet_v1(width: float, depth: float, resolution: int) -> tuple[float, float]:
    """Total and depthwise forward MACs of an EfficientNet (v1) at a width, depth and resolution."""
    side = resolution // 2
    cin = round_filters(32, width)
    total = side * side * 3 * cin * 9  # stem: 3x3 stride 2
    depthwise = 0.0
    for expansion, kernel, stride, channels, repeats in B0_STAGES:
        cout = round_filters(channels, width)
        for i in range(math.ceil(repeats * depth)):
            out_side = side // (stride if i == 0 else 1)
            mid = cin * expansion
            if expansion != 1:
                total += side * side * cin * mid
            depthwise += out_side * out_side * mid * kernel * kernel
            total += 2 * mid * max(1, int(cin * SE_RATIO)) + out_side * out_side * mid * cout
            side, cin = out_side, cout
    head = round_filters(HEAD_CHANNELS, width)
    total += side * side * cin * head + head * CLASSES
    return total + depthwise, depthwise


def efficientnet_v2_s(resolution: int) -> tuple[float, float]:
    """Total and depthwise forward MACs of EfficientNetV2-S at a resolution."""
    side = resolution // 2
    cin = 24
    total = side * side * 3 * cin * 9
    depthwise = 0.0
    for block, expansion, kernel, stride, cout, repeats in V2S_STAGES:
        for i in range(repeats):
            out_side = side // (stride if i == 0 else 1)
            mid = cin * expansion
            if block == "fused":
                if expansion == 1:
                    total += out_side * out_side * cin * cout * kernel * kernel
                else:
                    total += out_side * out_side * (cin * mid * kernel * kernel + mid * cout)
            else:
                total += side * side * cin * mid
                depthwise += out_side * out_side * mid * kernel * kernel
                total += 2 * mid * max(1, int(cin * SE_RATIO)) + out_side * out_side * mid * cout
            side, cin = out_side, cout
    total += side * side * cin * HEAD_CHANNELS + HEAD_CHANNELS * CLASSES
    return total + depthwise, depthwise


def main() -> None:
    for name, (total, depthwise) in {
        "efficientnet-b0 (224 px)": efficientnet_v1(1.0, 1.0, 224),
        "efficientnet-b4 (380 px)": efficientnet_v1(1.4, 1.8, 380),
        "efficientnet-v2-s (384 px)": efficientnet_v2_s(384),
    }.items():
        print(f"{name}: {total / 1e9:.3f} GMACs, depthwise {depthwise / 1e9:.4f} GMACs, share {depthwise / total:.4f}")


if __name__ == "__main__":
    main()
