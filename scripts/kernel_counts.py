#!/usr/bin/env python3
"""Kernels one training micro-batch launches, per catalog workload: a micro-benchmark of the real
PyTorch, run on CPU.

An architecture fact the performance model reads from ``catalog/data/workloads.csv``
(``kernels_per_step``): the forward and backward pass of one micro-batch run op by op, and each op
that computes something is one GPU kernel launch (and one pass through PyTorch's dispatcher on the
host). That count, not the FLOPs, sets the fixed time per micro-batch that does not get faster with
the GPU: a Mask R-CNN step (anchors, proposals, NMS, RoIAlign per FPN level, sampling, four losses)
launches several times the kernels of a ResNet-50 step of far more FLOPs.

How it counts: a ``TorchDispatchMode`` sees every ATen op below autograd (so the backward pass's
ops too) after composite ops are decomposed, as a CUDA run would launch them. Ops that only make a
view or read metadata (``view``, ``t``, ``expand``, ``slice``, ``detach``, ``empty``, sizes) launch
nothing and are not counted. The optimizer step is not counted: it is the model's separate update
time, and DLE's fused optimizers launch a handful of multi-tensor kernels for it.

What it cannot see: cuDNN or cuBLAS splitting one op into several kernels, and fusion by a
compiler (XLA in DLE's TensorFlow runs, ``torch.compile``). The model carries a fitted framework
and workload factor for that; this count gives each workload its starting point, which is what a
workload the calibration never saw gets.

The models are built at their real depth and layer structure; widths, image and sequence sizes are
cut where the count does not depend on them (an op is one launch whatever its size), so the script
runs in about a minute on two CPU cores. Counted at micro-batch 2 and 4 (at 1 some reshapes are
free views that copy at any larger batch): torchvision's detection loops over the images of a batch
in places, so its count grows with the batch; the catalog keeps the part that does not (the count
at 2 less twice the growth per item) and the script prints the growth.

Workloads not counted (GNMT: cuDNN runs a whole LSTM layer as one kernel, which a CPU run
decomposes per time step; Transformer-XL: no maintained PyTorch implementation to count) and custom
workloads get ``compute.kernels_per_layer`` (BERT-large's count per layer) x their layers, else
``compute.default_kernels_per_step`` (constants.yaml).

Needs ``torch``, ``torchvision`` and ``transformers`` (the ``train`` extra; CI's torch venv has
them)::

    python scripts/kernel_counts.py            # the table
    python scripts/kernel_counts.py --csv      # id,kernels_per_step,kernels_per_item lines for workloads.csv
    python scripts/kernel_counts.py --check    # exit 1 when workloads.csv differs from the counts
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

NO_KERNEL = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "detach",
    "alias",
    "lift_fresh",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_same_size",
    "_local_scalar_dense_no_sync",
    "set_",
    "resize_",
    "_unsafe_view",
}
"""Ops that allocate or read metadata only (no kernel), besides views (``OpOverload.is_view``)."""


def _count(step: Callable[[], None]) -> Counter[str]:
    """The kernel-launching ATen ops of one call of ``step``, by op name."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter[str] = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = func.overloadpacket.__name__
            if not func.is_view and name not in NO_KERNEL:
                counts[name] += 1
            return func(*args, **(kwargs or {}))

    # CUDA runs dropout as one fused kernel (``native_dropout``) and its backward as one; PyTorch's
    # CPU path decomposes it into bernoulli_, div_ and mul. Count it as CUDA runs it.
    functional = torch.nn.functional
    plain = functional.dropout

    def fused(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if not training or p == 0.0:
            return input
        return torch.ops.aten.native_dropout(input, p, True)[0]

    functional.dropout = fused
    try:
        with Count():
            step()
    finally:
        functional.dropout = plain
    return counts


def _train_step(model: Any, make_batch: Callable[[int], tuple[Any, Callable[[Any], Any]]], batch: int) -> Callable[[], None]:
    """Forward and backward of one micro-batch (no optimizer step)."""
    inputs, loss_of = make_batch(batch)

    def step() -> None:
        import torch

        torch.manual_seed(0)  # the same sampled proposals every time: a reproducible count
        model.zero_grad(set_to_none=True)
        loss_of(model(*inputs) if isinstance(inputs, tuple) else model(**inputs)).backward()

    return step


# ------------------------------------------------------------------------------ the models


def _classifier(build: Callable[[], Any], size: int) -> tuple[Any, Callable[[int], Any]]:
    import torch

    model = build()

    def batch(b: int) -> Any:
        x = torch.rand(b, 3, size, size)
        y = torch.randint(0, 1000, (b,))
        return (x,), lambda out: torch.nn.functional.cross_entropy(out, y)

    return model, batch


def _resnext(se: bool) -> Any:
    """ResNeXt-101 32x4d as DLE's ConvNets build it (torchvision's ResNet with 32 groups of width 4);
    with ``se``, a squeeze-and-excitation module (reduction 16) on every block's residual branch."""
    from torch import nn
    from torchvision.models.resnet import Bottleneck, ResNet

    class SEBottleneck(Bottleneck):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            c = self.conv3.out_channels
            self.se = nn.Sequential(
                nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c // 16, 1), nn.ReLU(inplace=True), nn.Conv2d(c // 16, c, 1), nn.Sigmoid()
            )

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            out = out * self.se(out)
            return self.relu(out + identity)

    return ResNet(SEBottleneck if se else Bottleneck, [3, 4, 23, 3], groups=32, width_per_group=4)


def _ssd300() -> tuple[Any, Callable[[int], Any]]:
    """DLE's PyTorch SSD300 v1.1 (``PyTorch/Detection/SSD/ssd/model.py``): ResNet-50 to its third
    stage with that stage's stride set to 1, five extra feature blocks, a 3x3 location and a
    confidence head on each of the six maps (4-6 default boxes, 81 classes), and its ``Loss``: smooth
    L1 on the matched boxes and cross-entropy with 3:1 hard-negative mining by a double sort. Boxes
    are encoded in the data pipeline (DALI), not in the step."""
    import torch
    from torch import nn
    from torchvision.models import resnet50

    backbone = resnet50()
    backbone.layer3[0].conv2.stride = (1, 1)
    backbone.layer3[0].downsample[0].stride = (1, 1)
    feature = nn.Sequential(*list(backbone.children())[:7])
    channels = [1024, 512, 512, 256, 256, 256]
    boxes = [4, 6, 6, 6, 4, 4]
    mids = [256, 256, 128, 128, 128]

    class SSD(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.feature = feature
            extra = []
            for i, (cin, mid, cout) in enumerate(zip(channels[:-1], mids, channels[1:], strict=True)):
                stride, pad = (2, 1) if i < 3 else (1, 0)
                extra.append(
                    nn.Sequential(
                        nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                        nn.Conv2d(mid, cout, 3, padding=pad, stride=stride, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                    )
                )
            self.extra = nn.ModuleList(extra)
            self.loc = nn.ModuleList(nn.Conv2d(c, n * 4, 3, padding=1) for c, n in zip(channels, boxes, strict=True))
            self.conf = nn.ModuleList(nn.Conv2d(c, n * 81, 3, padding=1) for c, n in zip(channels, boxes, strict=True))

        def forward(self, x: Any) -> Any:
            maps = [self.feature(x)]
            for block in self.extra:
                maps.append(block(maps[-1]))
            b = x.shape[0]
            locs = torch.cat([loc(m).view(b, 4, -1) for loc, m in zip(self.loc, maps, strict=True)], 2).contiguous()
            confs = torch.cat([conf(m).view(b, 81, -1) for conf, m in zip(self.conf, maps, strict=True)], 2).contiguous()
            return locs, confs

    def batch(b: int) -> Any:
        x = torch.rand(b, 3, 300, 300)
        n_boxes = 8732
        gloc = torch.rand(b, 4, n_boxes)
        glabel = torch.randint(0, 81, (b, n_boxes))

        def loss(out: Any) -> Any:
            ploc, plabel = out
            mask = glabel > 0
            pos_num = mask.sum(dim=1)
            sl1 = nn.functional.smooth_l1_loss(ploc, gloc, reduction="none").sum(dim=1)
            sl1 = (mask.float() * sl1).sum(dim=1)
            con = nn.functional.cross_entropy(plabel, glabel, reduction="none")
            con_neg = con.clone()
            con_neg[mask] = 0
            _, con_idx = con_neg.sort(dim=1, descending=True)
            _, con_rank = con_idx.sort(dim=1)
            neg_num = torch.clamp(3 * pos_num, max=mask.size(1)).unsqueeze(-1)
            neg_mask = con_rank < neg_num
            closs = (con * (mask.float() + neg_mask.float())).sum(dim=1)
            total = sl1 + closs
            num_mask = (pos_num > 0).float()
            pos_num = pos_num.float().clamp(min=1e-6)
            return (total * num_mask / pos_num).mean(dim=0)

        return (x,), loss

    return SSD(), batch


def _maskrcnn(height: int = 256, width: int = 320) -> tuple[Any, Callable[[int], Any]]:
    """torchvision's Mask R-CNN ResNet-50-FPN at its training settings (2,000 proposals per image
    after NMS, 512 sampled RoIs, 91 classes); small images by default (the count does not depend on
    their size), ``height`` x ``width`` pixels (DLE trains 832 x 1344)."""
    import torch
    from torchvision.models import resnet50
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    from torchvision.ops import FrozenBatchNorm2d

    # Frozen batch norm everywhere, stem and first stage not trained (DLE's TF2 ResNet-50 and
    # torchvision's pretrained-backbone default alike).
    backbone = _resnet_fpn_extractor(resnet50(norm_layer=FrozenBatchNorm2d), trainable_layers=3)
    model = MaskRCNN(backbone, num_classes=91, min_size=height, max_size=width)
    model.train()

    def batch(b: int) -> Any:
        torch.manual_seed(0)
        images = [torch.rand(3, height, width) for _ in range(b)]
        targets = []
        for _ in range(b):
            masks = torch.zeros(4, height, width, dtype=torch.uint8)
            boxes = torch.tensor([[10.0, 10.0, 100.0, 120.0], [50.0, 60.0, 200.0, 220.0], [120.0, 30.0, 300.0, 140.0], [5.0, 150.0, 90.0, 250.0]])
            for m, (x0, y0, x1, y1) in zip(masks, boxes.int().tolist(), strict=True):
                m[y0:y1, x0:x1] = 1
            targets.append({"boxes": boxes, "labels": torch.tensor([1, 2, 3, 4]), "masks": masks})
        return (images, targets), lambda losses: sum(losses.values())

    return model, batch


def _hf(config_name: str, head: str, seq: int, attention: str = "eager", **overrides: Any) -> tuple[Any, Callable[[int], Any]]:
    """A Hugging Face transformers model at its real depth (``overrides`` shrink widths only).

    ``attention``: ``eager`` (matmul, softmax, dropout, matmul) as DLE's BERT and ELECTRA run it, or
    ``sdpa`` for the catalog workloads that assume flash attention (one fused kernel forward, one
    backward; on CPU SDPA takes that path only without attention dropout, which the CUDA kernel
    fuses, so those models are counted with it off)."""
    import torch
    import transformers

    cfg = getattr(transformers, config_name)(attn_implementation=attention, **overrides)
    model = getattr(transformers, head)(cfg)
    model.train()

    def batch(b: int) -> Any:
        ids = torch.randint(0, cfg.vocab_size, (b, seq))
        if head.endswith("ForPreTraining"):
            inputs = {"input_ids": ids, "labels": ids, "next_sentence_label": torch.zeros(b, dtype=torch.long)}
        elif head.endswith("ForQuestionAnswering"):
            inputs = {"input_ids": ids, "start_positions": torch.zeros(b, dtype=torch.long), "end_positions": torch.ones(b, dtype=torch.long)}
        else:
            inputs = {"input_ids": ids, "labels": ids}
        return inputs, lambda out: out.loss

    return model, batch


SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}


def models() -> dict[str, Callable[[], tuple[Any, Callable[[int], Any]]]]:
    """Catalog workload id -> builder of (model, batch maker)."""
    from torchvision import models as tv

    return {
        "resnet50": lambda: _classifier(tv.resnet50, 64),
        "resnext101-32x4d": lambda: _classifier(lambda: _resnext(se=False), 64),
        "se-resnext101-32x4d": lambda: _classifier(lambda: _resnext(se=True), 64),
        # WideSE-B0/B4 differ from B0/B4 only in the width of their squeeze-and-excitation layers,
        # not in the ops a step runs, so they share the count.
        "efficientnet-b0": lambda: _classifier(tv.efficientnet_b0, 64),
        "efficientnet-b4": lambda: _classifier(tv.efficientnet_b4, 64),
        "efficientnet-v2-s": lambda: _classifier(tv.efficientnet_v2_s, 64),
        "ssd300": _ssd300,
        "maskrcnn": _maskrcnn,
        "bert-large-pretrain": lambda: _hf("BertConfig", "BertForPreTraining", 32, num_hidden_layers=24, **SMALL),
        "bert-large-squad": lambda: _hf("BertConfig", "BertForQuestionAnswering", 32, num_hidden_layers=24, **SMALL),
        "bert-base-squad": lambda: _hf("BertConfig", "BertForQuestionAnswering", 32, num_hidden_layers=12, **SMALL),
        "electra-base-squad": lambda: _hf("ElectraConfig", "ElectraForQuestionAnswering", 32, num_hidden_layers=12, embedding_size=64, **SMALL),
        "gpt2-small": lambda: _hf("GPT2Config", "GPT2LMHeadModel", 32, "sdpa", n_layer=12, n_embd=64, n_head=4, attn_pdrop=0.0),
        "llama-7b": lambda: _hf("LlamaConfig", "LlamaForCausalLM", 32, "sdpa", num_hidden_layers=32, num_key_value_heads=4, vocab_size=1000, **SMALL),
    }


SHARED = {
    "efficientnet-b0": ("efficientnet-b0", "efficientnet-widese-b0"),
    "efficientnet-b4": ("efficientnet-b4", "efficientnet-widese-b4"),
    "bert-large-pretrain": ("bert-large-seq128", "bert-large-seq512"),
}
"""Catalog workloads whose step runs the same ops as a counted one (only widths or lengths differ)."""


def count(name: str, batch: int) -> Counter[str]:
    import torch

    # Seeded before the weights are drawn: detection's proposals after NMS, and so its count, depend on them.
    torch.manual_seed(0)
    model, make = models()[name]()
    step = _train_step(model, make, batch)
    step()  # warm up: lazy initialisation is not part of a step
    return _count(step)


def split(at2: Counter[str], at4: Counter[str]) -> tuple[int, float]:
    """Kernels of a micro-batch apart from its size, and per batch item, from the counts at 2 and 4 items."""
    per_item = (sum(at4.values()) - sum(at2.values())) / 2
    return round(sum(at2.values()) - 2 * per_item), per_item


def measure(name: str) -> tuple[int, float]:
    """Kernels of one micro-batch of ``name`` apart from its size, and per batch item (counted at 2 and 4)."""
    return split(count(name, 2), count(name, 4))


def catalog_drift(name: str, fixed: int, per_item: float) -> list[str]:
    """How the catalog's figures of ``name`` (and the workloads that share its ops) differ from the count."""
    from gpuscaler.catalog import load_catalog

    catalog = load_catalog()
    out = []
    for wid in SHARED.get(name, (name,)):
        w = catalog.workload(wid)
        if (w.kernels_per_step, w.kernels_per_item) != (fixed, per_item):
            out.append(f"{wid}: catalog {w.kernels_per_step} + {w.kernels_per_item:g}/item, counted {fixed} + {per_item:g}/item")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="exit codes: 0 counted (with --check: the catalog agrees), 1 --check found the catalog out of date, 2 usage or torch missing",
    )
    parser.add_argument("--csv", action="store_true", help="print id,kernels_per_step,kernels_per_item lines for catalog/data/workloads.csv")
    parser.add_argument("--check", action="store_true", help="exit 1 when catalog/data/workloads.csv differs from the counts")
    parser.add_argument("--top", type=int, default=0, metavar="N", help="also print each model's N most frequent ops")
    parser.add_argument("workloads", nargs="*", help=f"which to count (default all: {', '.join(models())})")
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w not in models()]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(models())}")
    if args.top < 0:
        parser.error(f"--top {args.top}: give 0 or more ops to list")
    try:
        import torch

        import gpuscaler  # noqa: F401  (--check reads its catalog)
    except ImportError as err:
        print(
            f"kernel_counts: {err}: needs gpuscaler, torch, torchvision and transformers: pip install -e '.[train]' "
            "(or use the venv scripts/ci-torch-venv.sh prints, with gpuscaler installed as scripts/test.sh does)",
            file=sys.stderr,
        )
        return 2
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    drift: list[str] = []
    for name in args.workloads or list(models()):
        started = time.monotonic()
        at2 = count(name, 2)
        fixed, per_item = split(at2, count(name, 4))
        rows.append((name, fixed, per_item))
        print(f"{name:22s} {fixed:6d} kernels per micro-batch, {per_item:+6.1f} per item  ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        if args.top:
            print("   " + ", ".join(f"{op} {n}" for op, n in at2.most_common(args.top)), file=sys.stderr)
        if args.check:
            drift += catalog_drift(name, fixed, per_item)
    if args.csv:
        for name, fixed, per_item in rows:
            for wid in SHARED.get(name, (name,)):
                print(f"{wid},{fixed},{per_item:g}")
    if drift:
        print("kernel_counts: the catalog is out of date (update kernels_per_step,kernels_per_item in workloads.csv from --csv):", file=sys.stderr)
        for line in drift:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
