"""Turn a TrainingJob spec into what the planner computes with: a workload profile and an amount.

Named workloads come from the catalog; custom ones are built from a transformer shape or from
parameters and FLOPs per sample (activations estimated when not given).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from gpuscaler.api import TrainingJobSpec, WorkloadSpec
from gpuscaler.api.trainingjob import MAX_HORIZON_HOURS, MAX_TRAINING_SAMPLES
from gpuscaler.catalog import Catalog, UnknownIdError, Workload, normalize
from gpuscaler.catalog.models import transformer_workload
from gpuscaler.catalog.workloads import TransformerShape
from gpuscaler.catalog.zones import unknown_zone
from gpuscaler.inputs import InputError, shown

CUSTOM_ACTIVATION_BYTES_PER_PARAM = 0.5
"""Custom workloads without activation bytes: 16-bit activations per sample of about 0.5 byte per
parameter (assumption; ResNet-50's 45 MB/image over 25.6M parameters is 1.8, BERT-large seq128's
142 MB/sequence over 333M is 0.43), stated so a user can override it."""


class JobError(InputError):
    """The job spec cannot be planned as written (the message says what to change)."""


def check_constraints(spec: TrainingJobSpec, catalog: Catalog, largest_plan_gpus: int) -> None:
    """Names and counts in ``spec.constraints`` that no plan could ever meet, refused up front.

    Without this an unknown region or instance type, or more GPUs than any plan has, would read as
    "nothing fits": the job is wrong, not infeasible.

    Args:
        spec: the job.
        catalog: what exists.
        largest_plan_gpus: the most GPUs the planner ever puts in one plan.

    Raises:
        UnknownIdError: an unknown GPU or instance type (with close matches).
        JobError: an unknown region (with close matches), a zone in no known region, or minGpus
            beyond any plan or the batch.
    """
    c = spec.constraints
    for g in c.gpu_types:
        catalog.gpu(g)
    names = {normalize(i.name): i.name for i in catalog.instances}
    for t in c.instance_types:
        if normalize(t) not in names:
            close = difflib.get_close_matches(normalize(t), list(names), n=3, cutoff=0.5)
            raise UnknownIdError("instance", t, [names[k] for k in close])
    regions = sorted({i.region for i in catalog.instances})
    for r in c.regions:
        if r not in regions:
            close = difflib.get_close_matches(r, regions, n=3, cutoff=0.5)
            raise JobError(
                f"constraints.regions: no instance type in region {shown(r)}"
                + (f"; did you mean {', '.join(close)}?" if close else "")
                + f" (regions with instance types: {', '.join(regions)})",
                field="constraints.regions",
                value=shown(r),
            )
    if c.providers and c.regions:  # a region of another provider is named as such, not "nothing fits"
        of = {r: sorted({i.provider for i in catalog.instances if i.region == r}) for r in c.regions}
        foreign = [r for r in c.regions if not set(of[r]) & set(c.providers)]
        if len(foreign) == len(c.regions):
            r = foreign[0]
            raise JobError(
                f"constraints.regions: region {shown(r)} is a region of {', '.join(of[r])}, not of "
                f"constraints.providers ({', '.join(c.providers)}); name a region of those providers or add "
                f"{of[r][0]} to constraints.providers",
                field="constraints.regions",
                value=shown(r),
            )
    for z in c.zones:
        if (problem := unknown_zone(z, catalog.instances)) is not None:
            raise JobError(f"constraints.zones: {problem}", field="constraints.zones", value=shown(z))
    if c.min_gpus > largest_plan_gpus:
        raise JobError(
            f"constraints.minGpus {c.min_gpus}: no plan has that many GPUs (the largest has "
            f"{largest_plan_gpus}); lower it",
            field="constraints.minGpus",
            value=str(c.min_gpus),
        )
    if c.min_gpus > spec.global_batch:
        raise JobError(
            f"constraints.minGpus {c.min_gpus} is more than globalBatch {spec.global_batch}: every GPU needs "
            "at least one sample per step; lower minGpus or raise globalBatch",
            field="constraints.minGpus",
            value=str(c.min_gpus),
        )


@dataclass(frozen=True)
class ResolvedJob:
    """The job in the planner's terms."""

    name: str
    workload: Workload
    global_batch: int
    """Batch items per optimizer step (images, sequences, sentence pairs)."""
    total_samples: float
    """Samples to train on, in the workload's unit (tokens for token-unit workloads)."""
    steps: int
    deadline_h: float | None
    budget_usd: float | None
    channels_last: bool = False
    data_loader: str = "pytorch"


def resolve_workload(spec: WorkloadSpec, catalog: Catalog) -> Workload:
    """The workload profile a spec describes.

    Raises:
        UnknownIdError: a named workload is not in the catalog (with close matches).
    """
    if spec.model is not None:
        w = catalog.workload(spec.model)
        if spec.optimizer and spec.optimizer != w.optimizer:
            from dataclasses import replace

            w = replace(w, optimizer=spec.optimizer)
        return w
    if spec.transformer is not None:
        t = spec.transformer
        shape = TransformerShape(
            t.layers, t.hidden, t.heads, t.seq_len, t.vocab, t.ffn, t.gated, t.head, t.flash_attention
        )
        return transformer_workload(shape, spec.optimizer or "adam", bool(spec.variable_inputs))
    assert spec.params is not None and spec.flops_per_sample is not None
    return Workload(
        id="custom",
        family=spec.family,
        unit=spec.unit,
        params=spec.params,
        flops_per_sample=spec.flops_per_sample,
        activation_bytes_per_sample=spec.activation_bytes_per_sample
        or spec.params * CUSTOM_ACTIVATION_BYTES_PER_PARAM,
        optimizer=spec.optimizer or "adam",
        source="custom parameters and FLOPs",
        depthwise_flop_share=spec.depthwise_flop_share or 0.0,
        variable_inputs=bool(spec.variable_inputs),
    )


def resolve(
    spec: TrainingJobSpec, catalog: Catalog, name: str = "trainingjob", deadline_h: float | None = None
) -> ResolvedJob:
    """Workload, samples, steps, deadline and budget of a spec.

    Raises:
        JobError: epochs without a dataset size, or a deadline already past.
        UnknownIdError: unknown named workload.
    """
    workload = resolve_workload(spec.workload, catalog)
    t = spec.training
    if t.samples is not None:
        samples = t.samples
    elif t.steps is not None:
        samples = float(t.steps * spec.global_batch * workload.samples_per_item)
    else:
        per_epoch = t.samples_per_epoch or workload.samples_per_epoch
        if per_epoch is None:
            raise JobError(
                f"training.epochs: workload {workload.id} has no known dataset size; "
                "add training.samplesPerEpoch or give training.samples"
            )
        samples = (t.epochs or 0) * per_epoch
    if samples > MAX_TRAINING_SAMPLES:
        raise JobError(
            f"training: {samples:.3g} samples is over {MAX_TRAINING_SAMPLES:.0e}, beyond any real training "
            "run; check training.epochs, samplesPerEpoch or steps",
            field="training",
        )
    steps = max(1, math.ceil(samples / (spec.global_batch * workload.samples_per_item)))
    dl = deadline_h if deadline_h is not None else spec.deadline_hours()
    if dl is not None and dl <= 0:
        raise JobError(
            f"spec.deadline is {max(-dl, 0.1):.1f} h in the past; move spec.deadline or use spec.maxDuration",
            field="deadline",
        )
    if dl is not None and dl > MAX_HORIZON_HOURS:
        raise JobError(
            f"spec.deadline is {dl:,.0f} h away, beyond the {MAX_HORIZON_HOURS:,.0f} h (one year) planning "
            "horizon; give a nearer one or omit it for no deadline",
            field="deadline",
        )
    return ResolvedJob(
        name,
        workload,
        spec.global_batch,
        samples,
        steps,
        dl,
        spec.budget_usd,
        channels_last=spec.workload.channels_last,
        data_loader=spec.workload.data_loader,
    )
