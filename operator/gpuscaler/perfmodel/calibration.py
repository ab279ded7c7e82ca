"""The calibration data set and the fit-error report behind ``gpuscaler validate``.

``data/published_throughput.jsonl`` is a copy of the measured training throughputs from NVIDIA's
DeepLearningExamples READMEs (every row carries its source URL pinned to a commit). This module maps
each row onto a catalog workload and a parallel configuration (the DGX system it ran on), predicts
it with the model, and summarises the error: MAPE and median by GPU, precision, family and GPU
count, plus the three relative errors the planner's choices hinge on (speed ratio between GPU
types, mixed-precision speedup per GPU, multi-GPU scaling efficiency).

Used by ``scripts/calibrate.py`` (which fits the parameters) and by the CLI's ``validate``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from gpuscaler.catalog import Catalog, Precision, Workload, load_catalog
from gpuscaler.catalog.models import GPU
from gpuscaler.perfmodel.config import ParallelConfig
from gpuscaler.perfmodel.model import StepTerms, combine, step_terms
from gpuscaler.perfmodel.parameters import FittedParams, constants, fitted

# Source row name -> catalog workload; first match wins; None = not modelled (speech, recsys, sparsity).
ROW_WORKLOADS: list[tuple[str, str | None]] = [
    (r"ASP|sparsity", None),
    (r"^BERT-large.*SQuAD", "bert-large-squad"),
    (r"^BERT-large.*seq128", "bert-large-seq128"),
    (r"^BERT-large.*seq512", "bert-large-seq512"),
    (r"^ELECTRA-base \[Fine-tuning", "electra-base-squad"),
    (r"widese-b0", "efficientnet-widese-b0"),
    (r"widese-b4", "efficientnet-widese-b4"),
    (r"v1-B0|^efficientnet-b0", "efficientnet-b0"),
    (r"v1-B4|^efficientnet-b4", "efficientnet-b4"),
    (r"v2-S", "efficientnet-v2-s"),
    (r"^GNMT", "gnmt"),
    (r"^Transformer-XL \[Base", "transformerxl-base"),
    (r"^Transformer-XL \[Large", "transformerxl-large"),
    (r"^ResNet-50 v1\.5", "resnet50"),
    (r"^ResNeXt-101", "resnext101-32x4d"),
    (r"^SE-ResNeXt-101", "se-resnext101-32x4d"),
    (r"^SSD300", "ssd300"),
    (r"^Mask R-CNN", "maskrcnn"),
]


@dataclass(frozen=True)
class System:
    """A DGX system of the source tables: GPUs per node and the network between nodes."""

    gpus_per_node: int
    network_gbps: float
    """InfiniBand per node: DGX-1 4x100 Gb/s EDR, DGX-2(H) 8x100 Gb/s EDR, DGX A100 8x200 Gb/s HDR
    (NVIDIA DGX system user guides)."""


SYSTEMS = {
    "DGX-1": System(8, 400.0),
    "DGX-2": System(16, 800.0),
    "DGX-2H": System(16, 800.0),
    "DGX-A100": System(8, 1600.0),
}

PRECISIONS = {"FP32": Precision.FP32, "TF32": Precision.FP32, "AMP": Precision.AMP}

DLE_CONVNETS = {
    "resnet50", "resnext101-32x4d", "se-resnext101-32x4d",
    "efficientnet-b0", "efficientnet-b4", "efficientnet-widese-b0", "efficientnet-widese-b4",
}  # fmt: skip
"""PyTorch workloads of DLE's ``PyTorch/Classification/ConvNets`` (one ``launch.py`` and
``configs.yml``), whose AMP configurations set ``memory_format: nhwc`` and whose TF32/FP32 ones keep
PyTorch's NCHW default (configs.yml, e.g. at commit 097c7ff917b7c56246590b1246a8f5bd8957c534);
``main.py --data-backend`` defaults to ``dali-cpu``, the README recommends DALI on DGX systems.
TensorFlow and MXNet run convolutions in NHWC themselves at 16 bits, so their CNN AMP rows are
channels-last too, and their TF32/FP32 rows NCHW: DLE's ``MxNet/Classification/RN50v1.5/runner``
passes ``--conv-layout NHWC`` for float16 only; DLE's TensorFlow ConvNets compute in NCHW by default
(``utils/cmdline_helper.py`` ``--data_format``), and TensorFlow's layout assignment turns float16
convolutions on tensor-core GPUs (compute capability 7.0 and newer) into NHWC and keeps float32 ones
in NCHW (tensorflow ``compiler/mlir/tensorflow/tests/layout_optimization_layout_assignment_gpu_cc_70.mlir``)."""

DLE_CHANNELS_LAST_AMP = DLE_CONVNETS | {"ssd300"}
"""PyTorch workloads whose DLE AMP rows ran channels-last: the ConvNets and SSD300, whose
``PyTorch/Detection/SSD/main.py`` defaults ``--data-layout`` to ``channels_last`` ("It's recommended
to use channels_first with --no-amp"; e.g. at commit 04099020ae68b5767bf5c74db3dcace0c215c730)."""


BINNED_PHASE2_DOCUMENTS = (
    "https://github.com/NVIDIA/DeepLearningExamples/blob/729963dd47e7c8bd462ad10bfac7a7b0b604e6dd/PyTorch/LanguageModeling/BERT/README.md",
    "https://github.com/NVIDIA/DeepLearningExamples/blob/729963dd47e7c8bd462ad10bfac7a7b0b604e6dd/PaddlePaddle/LanguageModeling/BERT/README.md",
)
"""BERT pretraining tables whose phase-2 (sequence length 512) rows ran with sequence binning, so
one of their sequences is fewer than 512 tokens of work. From 2022 DLE's PyTorch and PaddlePaddle BERT
read phase 2 from LDDL parquet shards binned by length (``scripts/run_pretraining.sh``:
``DATASET2=pretrain/phase2/bin_size_64/parquet``, ``phase2_bin_size=64``; PaddlePaddle's
``scripts/run_pretraining_p2.sh``: ``--input-dir=pretrain/phase2/bin_size_64/parquet``), and LDDL
feeds every rank a mini-batch of one bin, "only padded to the longest sequence within this
mini-batch" (github.com/NVIDIA/LDDL README, "Sequence binning"). The earlier PyTorch README (commit
499fb1c) read padded HDF5 sequences of 512, as TensorFlow's. How far below 512 the binned batches
are no source says (it is a property of the corpus), so those rows are their own workload
(``bert-large-seq512-binned``: BERT-large at 512 with its own fitted throughput scale), and their
ratios (GPU, precision, GPU count within the table) still count; phase 1 is unbinned
(``pretrain/phase1/unbinned``)."""
BINNED_SUFFIX = "-binned"


def model_of(workload_id: str) -> str:
    """The model a calibration workload id stands for: a sequence-binned table's workload is its base model's."""
    return workload_id.removesuffix(BINNED_SUFFIX)


def document_of(source: str) -> str:
    """A row's source URL without the table's line anchor: the README at its commit."""
    return source.split("#", 1)[0]


def dle_channels_last(workload: Workload, framework: str, precision: str) -> bool:
    """Whether a DLE row ran its convolutions channels-last (only 16-bit rows are affected)."""
    if precision != "AMP" or workload.family not in constants()["compute"]["channels_last_families"]:
        return False
    return framework != "pytorch" or workload.id in DLE_CHANNELS_LAST_AMP


@dataclass(frozen=True)
class Row:
    """One measured row, mapped onto the model's inputs."""

    workload: Workload
    gpu: GPU
    cfg: ParallelConfig
    measured: float
    precision: str
    source: str
    terms: StepTerms
    """The model's parameter-free terms of this row (computed once; fits only recombine them)."""

    @property
    def document(self) -> str:
        """The source README at its commit, without the table's line anchor: one suite (one version of
        the training code), whose rows' ratios are comparable."""
        return document_of(self.source)

    @property
    def run(self) -> tuple[object, ...]:
        """The row's table and configuration apart from its GPU count: rows that differ only in GPUs
        are one run scaled out (the scaling pairs; the superlinear check)."""
        return (self.document, self.workload.id, self.cfg.framework, self.gpu.id, self.precision, self.cfg.micro_batch, self.cfg.accumulation)

    @property
    def key(self) -> tuple[str, str, str, int, int]:
        """Identifies the run apart from GPU type and precision (for ratio comparisons)."""
        return (self.workload.id, self.cfg.framework, self.gpu.arch, self.cfg.gpus, self.cfg.micro_batch)


def _workload_for(name: str) -> str | None:
    for pattern, workload in ROW_WORKLOADS:
        if re.search(pattern, name):
            return workload
    return None


def _accumulation(notes: str | None) -> int:
    m = re.search(r"accumulation steps\s*=\s*(\d+)", notes or "")
    return int(m.group(1)) if m else 1


def raw_rows() -> list[dict[str, object]]:
    text = (resources.files("gpuscaler.perfmodel") / "data" / "published_throughput.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_rows(catalog: Catalog | None = None) -> tuple[list[Row], dict[str, int]]:
    """The rows the model can predict, and counts of the rows skipped, by reason."""
    cat = catalog or load_catalog()
    rows: list[Row] = []
    skipped: dict[str, int] = defaultdict(int)
    for r in raw_rows():
        wid = _workload_for(str(r["model"]))
        if wid is None:
            skipped["workload not modelled (speech, recsys, sparsity, ELECTRA pre-training)"] += 1
            continue
        if r["batch_per_gpu"] is None:
            skipped["no per-GPU batch in the source"] += 1
            continue
        system = SYSTEMS[str(r["system"])]
        gpus = int(str(r["gpus"]))
        nodes = int(str(r["nodes"])) if r["nodes"] else max(1, math.ceil(gpus / system.gpus_per_node))
        wl = cat.workload(wid)
        if wid == "bert-large-seq512" and document_of(str(r["source"])) in BINNED_PHASE2_DOCUMENTS:
            wl = dataclasses.replace(wl, id=wid + BINNED_SUFFIX)
        framework = str(r["framework"]).lower()
        # Token-unit tables give the batch in sequences (or sentence pairs): batch items, as the model.
        # No vCPUs: the DGX rows were not input-bound (DALI for the PyTorch CNNs), so no input cap.
        cfg = ParallelConfig(
            micro_batch=int(str(r["batch_per_gpu"])),
            precision=PRECISIONS[str(r["precision"])],
            gpus_per_node=gpus // nodes,
            nodes=nodes,
            accumulation=_accumulation(r.get("notes")),  # type: ignore[arg-type]
            network_gbps=system.network_gbps,
            framework=framework,
            channels_last=dle_channels_last(wl, framework, str(r["precision"])),
            data_loader="dali" if framework == "pytorch" and wid in DLE_CONVNETS else "pytorch",
        )
        gpu = cat.gpu(str(r["gpu"]))
        rows.append(
            Row(
                wl,
                gpu,
                cfg,
                float(str(r["throughput"])),
                str(r["precision"]),
                str(r["source"]),
                step_terms(wl, gpu, cfg),
            )
        )
    return _drop_superlinear_bases(rows, skipped), dict(skipped)


SUPERLINEAR_LIMIT = 1.5
"""Largest n-GPU over n x 1-GPU throughput, same table and configuration, that a single-GPU row is
kept at. Data-parallel training with a fixed per-GPU batch does each GPU's work plus communication,
so it cannot run much faster per GPU than one GPU alone (a few percent above linear happens: cache
effects, measurement noise; Transformer-XL base under TensorFlow 1 on V100s scales 1.08x linearly
here). The V100-32GB table of DLE's PyTorch EfficientNet README (L627) quotes 14.7-17.6x on 8 GPUs
for B4, WideSE-B4 and WideSE-B0, and the data file flags those rows ("likely source error"): their
8-GPU rows agree with the V100-16GB table (B4 FP32: 641 against 616 images/s), their 1-GPU rows are
less than half of it (36 against 83), so it is the 1-GPU rows that are wrong."""


def _drop_superlinear_bases(rows: list[Row], skipped: dict[str, int]) -> list[Row]:
    """``rows`` without the single-GPU rows that a multi-GPU row of the same table and
    configuration outruns by more than SUPERLINEAR_LIMIT x linear (counted in ``skipped``)."""
    fastest: dict[tuple[object, ...], float] = defaultdict(float)
    for r in rows:
        if r.cfg.gpus > 1:
            fastest[r.run] = max(fastest[r.run], r.measured / r.cfg.gpus)
    kept = []
    for r in rows:
        if r.cfg.gpus == 1 and fastest.get(r.run, 0.0) > SUPERLINEAR_LIMIT * r.measured:
            skipped[f"single-GPU row its own table's multi-GPU rows outrun over {SUPERLINEAR_LIMIT}x linearly (source error)"] += 1
        else:
            kept.append(r)
    return kept


def predict(rows: Iterable[Row], params: FittedParams | None = None) -> list[float]:
    """Predicted throughput of each row (same as ``estimate(...).throughput``, from cached terms)."""
    p = params or fitted()
    return [combine(r.terms, p).throughput for r in rows]


@dataclass(frozen=True)
class ErrorStats:
    n: int
    mape: float
    """Mean absolute percentage error, %."""
    median: float
    """Median absolute percentage error, %."""


def stats(errors: list[float]) -> ErrorStats:
    absolute = [abs(e) * 100 for e in errors]
    return ErrorStats(
        len(absolute),
        statistics.fmean(absolute) if absolute else math.nan,
        statistics.median(absolute) if absolute else math.nan,
    )


Pair = tuple[int, int, float]
"""Indices (i, j) of two rows and the relative error of the predicted ratio of i to j."""


def _ratio_errors(
    rows: list[Row],
    preds: list[float],
    group: Callable[[Row], tuple[object, ...] | None],
    pair: Callable[[Row, Row], bool],
) -> list[Pair]:
    """Relative error of predicted vs measured ratio over pairs of rows in the same group."""
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        g = group(r)
        if g is not None:
            groups[g].append(i)
    errors: list[Pair] = []
    for idx in groups.values():
        for i in idx:
            for j in idx:
                if i != j and pair(rows[i], rows[j]):
                    measured = rows[i].measured / rows[j].measured
                    predicted = preds[i] / preds[j]
                    errors.append((i, j, predicted / measured - 1))
    return errors


RATIO_METRICS = ("gpu_ratio", "amp_speedup", "scaling")
"""The relative quantities the planner's choices hinge on."""


def ratio_pairs(rows: list[Row], preds: list[float]) -> dict[str, list[Pair]]:
    """The three relative errors over their row pairs, each pair from one source document (a README
    at one commit: one version of the training code). Two versions of the same code can differ by
    more than any model term (the PyTorch BERT README at two commits), and the validation this
    reproduces compares ratios within one suite.

    - ``gpu_ratio``: A100 vs V100 speed, same workload, framework, precision mode, GPU count and
      accumulation.
    - ``amp_speedup``: AMP vs full precision on the same GPU, workload, framework and GPU count.
    - ``scaling``: n GPUs vs 1, same everything else.
    """
    return {
        "gpu_ratio": _ratio_errors(
            rows,
            preds,
            lambda r: (r.document, r.workload.id, r.cfg.framework, r.precision == "AMP", r.cfg.gpus, r.cfg.accumulation),
            lambda a, b: a.gpu.arch == "ampere" and b.gpu.arch == "volta",
        ),
        "amp_speedup": _ratio_errors(
            rows,
            preds,
            lambda r: (r.document, r.workload.id, r.cfg.framework, r.gpu.id, r.cfg.gpus),
            lambda a, b: a.precision == "AMP" and b.precision != "AMP",
        ),
        "scaling": _ratio_errors(
            rows,
            preds,
            lambda r: r.run,
            lambda a, b: a.cfg.gpus > 1 and b.cfg.gpus == 1,
        ),
    }


@dataclass(frozen=True)
class Report:
    """The fit error of the model on the calibration rows."""

    overall: ErrorStats
    by: dict[str, dict[str, ErrorStats]]
    gpu_ratio: ErrorStats
    """A100 vs V100 speed ratio, same workload, framework, precision mode, GPU count and batch."""
    amp_speedup: ErrorStats
    """AMP vs full-precision speedup on the same GPU, workload, framework and GPU count."""
    scaling: ErrorStats
    """Throughput at n GPUs vs 1 GPU, same everything else."""
    skipped: dict[str, int]


def report(params: FittedParams | None = None, catalog: Catalog | None = None) -> Report:
    """The in-sample fit error of ``params`` (the committed calibration when None) on every row."""
    rows, skipped = load_rows(catalog)
    preds = predict(rows, params)
    errors = [p / r.measured - 1 for p, r in zip(preds, rows, strict=True)]
    dims: dict[str, Callable[[Row], str]] = {
        "gpu": lambda r: r.gpu.id,
        "precision": lambda r: r.precision,
        "family": lambda r: r.workload.family,
        "workload": lambda r: r.workload.id,
        "gpus": lambda r: f"{r.cfg.gpus:>4d}",
        "framework": lambda r: r.cfg.framework,
    }
    by: dict[str, dict[str, ErrorStats]] = {}
    for dim, fn in dims.items():
        buckets: dict[str, list[float]] = defaultdict(list)
        for r, e in zip(rows, errors, strict=True):
            buckets[fn(r)].append(e)
        by[dim] = {k: stats(v) for k, v in sorted(buckets.items())}
    pairs = ratio_pairs(rows, preds)
    ratio = {m: stats([e for _, _, e in pairs[m]]) for m in RATIO_METRICS}
    return Report(stats(errors), by, ratio["gpu_ratio"], ratio["amp_speedup"], ratio["scaling"], skipped)


def cross_validation() -> dict[str, Any]:
    """The committed out-of-sample errors (``data/cross_validation.json``, written by
    ``scripts/calibrate.py``): ``metrics`` pooled over the schemes and ``schemes`` one by one, each
    metric as ``{"mape", "median_ape", "log_sigma", "n"}`` with errors as fractions.

    Raises:
        FileNotFoundError: the package ships no cross-validation file.
    """
    text = (resources.files("gpuscaler.perfmodel") / "data" / "cross_validation.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data
