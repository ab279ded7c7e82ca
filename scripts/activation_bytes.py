#!/usr/bin/env python3
"""Activation memory one training item keeps for the backward pass, per catalog workload: a
measurement of the real PyTorch model, run on CPU.

An architecture fact the memory model reads from ``catalog/data/workloads.csv``
(``activation_bytes_per_sample``, at 16 bits): with the micro-batch it sets the activation memory
per GPU, so it decides which micro-batches fit. (The DRAM traffic of the memory-bound layers is
counted in the row's ``traffic_bytes_per_sample``, which for the rows measured here is still the
estimate the model was fitted on: the header of workloads.csv and docs/model-notes.md say why.)

How it measures: ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd saves for
the backward pass during the forward pass of one micro-batch. Their storages are summed once each
(several saved views of one tensor share it), without the parameters, floating-point only (boolean
ReLU and dropout masks are a few percent and stay out); halved for the catalog's 16 bits; per item
at micro-batch 2. The models are the ones ``scripts/kernel_counts.py`` builds, here at full width
and at the image size the catalog's FLOPs assume (224 px for the ResNets and EfficientNet-B0, 380
for B4, 384 for EfficientNetV2-S, 300 for SSD300, 832 x 1344 for Mask R-CNN, whose RoI sampler is
given 128 positives, as a trained model has).

What it cannot see: cuDNN's workspaces and what a fused kernel keeps instead of its inputs (they
change the peak, not what autograd keeps), and the allocator's fragmentation (the memory model's
``fragmentation`` constant). Under autocast a few saved tensors stay fp32 (normalisation
statistics), so halving the fp32 bytes slightly undercounts.

Transformers are not measured here: their activations follow from their shape
(``catalog.workloads.TransformerShape``, whose docstring gives the formulas). The WideSE
EfficientNets widen only the squeeze-and-excitation layers, which keep a pooled vector per channel,
so they take B0's and B4's measurement.

Needs ``torch`` and ``torchvision`` (the ``train`` extra; CI's torch venv has them)::

    python scripts/activation_bytes.py           # measured against the catalog, per workload
    python scripts/activation_bytes.py --check   # exit 1 when a catalog figure is off by more than TOLERANCE
    python scripts/activation_bytes.py --csv     # id,activation_bytes_per_sample lines for workloads.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernel_counts  # the model builders

TOLERANCE = 0.03
"""--check: largest |catalog / measured - 1|. The catalog holds the measurement rounded to 0.1 MB; the
margin is for another torch or torchvision version saving a little more or less. The estimates the
catalog held before were 2-9% off for the ResNets, 20-50% under for the EfficientNets and SSD300 and
2.2x over for Mask R-CNN."""

MICRO_BATCH = 2


def models() -> dict[str, Callable[[], tuple[Any, Callable[[int], Any]]]]:
    """Catalog workload id -> builder of (model, batch maker), at full size."""
    from torchvision import models as tv

    c = kernel_counts
    return {
        "resnet50": lambda: c._classifier(tv.resnet50, 224),
        "resnext101-32x4d": lambda: c._classifier(lambda: c._resnext(se=False), 224),
        "se-resnext101-32x4d": lambda: c._classifier(lambda: c._resnext(se=True), 224),
        "efficientnet-b0": lambda: c._classifier(tv.efficientnet_b0, 224),
        "efficientnet-b4": lambda: c._classifier(tv.efficientnet_b4, 380),
        "efficientnet-v2-s": lambda: c._classifier(tv.efficientnet_v2_s, 384),
        "ssd300": c._ssd300,
        "maskrcnn": _maskrcnn,
    }


def _maskrcnn() -> tuple[Any, Callable[[int], Any]]:
    """Mask R-CNN at 832 x 1344 with 128 ground-truth instances per image, so that the RoI sampler's
    positives reach its cap of 128 (512 RoIs x 0.25) as in a trained model, whose proposals overlap the
    instances: the mask head, which runs on the positives, then keeps what the catalog's FLOPs assume
    (``scripts/maskrcnn_flops.py``: 128 masks). With random weights and a few instances it would run
    on only those few."""
    import torch

    model, _ = kernel_counts._maskrcnn(832, 1344)
    n = 128

    def batch(b: int) -> Any:
        g = torch.Generator().manual_seed(0)
        images = [torch.rand(3, 832, 1344, generator=g) for _ in range(b)]
        targets = []
        for _ in range(b):
            xy = torch.rand(n, 2, generator=g) * torch.tensor([1100.0, 600.0])
            boxes = torch.cat([xy, xy + 32 + torch.rand(n, 2, generator=g) * 200], 1)
            masks = torch.zeros(n, 832, 1344, dtype=torch.uint8)
            for m, (x0, y0, x1, y1) in zip(masks, boxes.int().tolist(), strict=True):
                m[y0:y1, x0:x1] = 1
            targets.append({"boxes": boxes, "labels": torch.randint(1, 91, (n,), generator=g), "masks": masks})
        return (images, targets), lambda losses: sum(losses.values())

    return model, batch


SHARED = {
    "efficientnet-b0": ("efficientnet-b0", "efficientnet-widese-b0"),
    "efficientnet-b4": ("efficientnet-b4", "efficientnet-widese-b4"),
}
"""Catalog workloads that take a measured one's figure (only their squeeze-and-excitation widths differ)."""


def measure(name: str) -> float:
    """Bytes per item, at 16 bits, that one training micro-batch of ``name`` saves for its backward pass."""
    import torch

    torch.manual_seed(0)
    model, make_batch = models()[name]()
    model.train()
    inputs, loss_of = make_batch(MICRO_BATCH)
    saved: dict[int, int] = {}

    def pack(t: Any) -> Any:
        if t.dtype.is_floating_point:
            storage = t.untyped_storage()
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*inputs) if isinstance(inputs, tuple) else model(**inputs)
        loss_of(out)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    fp32 = sum(n for ptr, n in saved.items() if ptr not in weights)
    return fp32 / 2 / MICRO_BATCH


def catalog_figures() -> dict[str, float]:
    from gpuscaler.catalog import load_catalog

    cat = load_catalog()
    return {wid: cat.workload(wid).activation_bytes_per_sample for names in _ids().values() for wid in names}


def _ids() -> dict[str, tuple[str, ...]]:
    return {name: SHARED.get(name, (name,)) for name in models()}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--check", action="store_true", help=f"exit 1 when a catalog figure is off by more than {TOLERANCE:.0%}")
    ap.add_argument("--csv", action="store_true", help="print id,activation_bytes_per_sample lines for workloads.csv")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError as e:
        print(f"activation_bytes.py needs torch and torchvision: {e}; pip install -e '.[train]'", file=sys.stderr)
        return 2
    catalog = catalog_figures()
    off = []
    lines = []
    table = sys.stderr if args.csv else sys.stdout  # with --csv, stdout carries only the CSV lines
    print(f"{'workload':<24} {'measured MB':>12} {'catalog MB':>11} {'catalog/measured':>17}   (per item, 16-bit)", file=table)
    for name, ids in _ids().items():
        t0 = time.perf_counter()
        got = measure(name)
        for wid in ids:
            ratio = catalog[wid] / got
            flag = "" if abs(ratio - 1) <= TOLERANCE else "  off"
            print(f"{wid:<24} {got / 1e6:>12.1f} {catalog[wid] / 1e6:>11.1f} {ratio:>17.2f}{flag}   {time.perf_counter() - t0:.1f} s", file=table)
            lines.append(f"{wid},{got / 1e6:.1f}e6")
            if flag:
                off.append(wid)
    if args.csv:
        print("\n".join(lines))
    if args.check and off:
        print(f"{len(off)} catalog figure(s) off by more than {TOLERANCE:.0%}: {', '.join(off)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
