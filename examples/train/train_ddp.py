"""A real ``torchrun`` training job under gpuscaler's TrainingGuard: DDP (or FSDP2 with --sharded).

What the TrainingJob examples run (``examples/*.yaml`` point their image and command at it; the
image is built from ``examples/train/Dockerfile``), and what the runtime's real-torch tests
interrupt. An MLP regression on a synthetic data set, DistributedSampler, SGD with momentum and a
cosine learning-rate schedule; every rank:

* resumes from the newest complete checkpoint the ranks agree on (``guard.resume``);
* agrees with the others at every step boundary (``TorchAgreement``: one tiny all-reduce), so on
  a SIGTERM to any rank or to torchrun, or on the operator's checkpoint request, all ranks
  checkpoint and stop at the same step and exit 75 (torchrun itself then exits 1: the operator
  knows the preemption from the ``gpuscaler.io/runtime-phase`` annotation, not the exit code);
* checkpoints on the planned interval: rank 0 alone with ``torch.save`` (DDP: the state is
  replicated), or every rank its shard with ``torch.distributed.checkpoint`` (``--sharded``:
  FSDP2 ``fully_shard``), committed by a manifest written last;
* reports progress to its pod (``KubeReporter``; rank 0, and the first process of every other pod).

The batch of step ``s`` depends only on ``s`` (the sampler's epoch and offset), so an interrupted
run ends with the same weights, bit for bit, as an uninterrupted one.

Run it locally: ``GPUSCALER_CHECKPOINT_DIR=/tmp/ck torchrun --standalone --nproc-per-node 2
examples/train/train_ddp.py --total-steps 200``. In a pod the operator sets ``WORLD_SIZE`` (pods),
``NODE_RANK``, ``NPROC_PER_NODE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the ``GPUSCALER_*`` plan
(micro-batch per GPU, checkpoint directory and interval).
"""

# expect: run-by=tests/test_runtime_torch_ddp.py   (killed, resumed and compared bit for bit there; tests/test_examples.py)

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

from gpuscaler.runtime import PlanEnv, TrainingGuard
from gpuscaler.runtime.distributed import TorchAgreement, dcp_callbacks, torch_load, torch_save
from gpuscaler.runtime.kube_reporter import KubeReporter

DIM = 16
"""Input features of the synthetic regression."""
HIDDEN = 32
"""Hidden units of the MLP."""
SAMPLES = 4096
"""Rows in the synthetic data set (an epoch)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--total-steps", type=int, default=1000, help="optimizer steps in all")
    ap.add_argument("--batch-per-rank", type=int, default=16,
                    help="micro-batch per rank when GPUSCALER_MICRO_BATCH is not set")
    ap.add_argument("--lr", type=float, default=0.05, help="peak learning rate (cosine decay to 0)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--sharded", action="store_true",
                    help="FSDP2 fully_shard + torch.distributed.checkpoint: every rank writes its shard")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (tests)")
    ap.add_argument("--out", type=Path, help="rank 0 writes the final parameters here (raw float32 bytes)")
    ap.add_argument("--events", type=Path, help="directory for per-rank JSON-lines progress logs (tests)")
    return ap.parse_args(argv)


def build_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))


def dataset(seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, DIM, generator=g)
    w = torch.randn(DIM, 1, generator=g)
    y = torch.tanh(x @ w) + 0.01 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    plan = PlanEnv.from_env()
    per_rank = plan.micro_batch or args.batch_per_rank
    data = dataset(args.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    per_epoch = len(sampler) // per_rank

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, k = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        idx = list(sampler)[k * per_rank : (k + 1) * per_rank]
        x, y = data[idx]
        return x.to(device), y.to(device)

    net = build_model(args.seed).to(device)
    if args.sharded:
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        model: nn.Module = fully_shard(net)
    else:
        model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.total_steps)

    if args.sharded:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        def state() -> dict[str, Any]:
            model_sd, optim_sd = get_state_dict(model, opt)
            return {"model": model_sd, "optim": optim_sd, "sched": sched.state_dict()}

        def apply(s: dict[str, Any]) -> None:
            set_state_dict(model, opt, model_state_dict=s["model"], optim_state_dict=s["optim"])
            sched.load_state_dict(s["sched"])

        save_state, load = dcp_callbacks(state)
    else:

        def state() -> dict[str, Any]:
            return {"model": net.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict()}

        def apply(s: dict[str, Any]) -> None:
            net.load_state_dict(s["model"])
            opt.load_state_dict(s["optim"])
            sched.load_state_dict(s["sched"])

        save_state, load = torch_save, torch_load

    def save(snapshot: Any, path: Path) -> None:
        # The guard passes what completed() got: the state() function, called only when a
        # checkpoint is taken (building a sharded state dict every step would cost a step).
        save_state(snapshot() if callable(snapshot) else snapshot, path)

    log = None
    if args.events is not None:
        args.events.mkdir(parents=True, exist_ok=True)
        log = (args.events / f"rank{rank}.jsonl").open("a", buffering=1)

    def emit(**kv: Any) -> None:
        if log is not None:
            log.write(json.dumps({"t": time.time(), "rank": rank, **kv}) + "\n")

    guard: TrainingGuard[Any] = TrainingGuard.from_env(
        save=save, load=load, agree=TorchAgreement(), sharded=args.sharded, reporter=KubeReporter.from_env()
    )
    resumed, start = guard.resume(state)
    if start > 0:
        apply(resumed)
    emit(e="resume", start=start, pid=os.getpid())
    loss_fn = nn.MSELoss()
    try:
        for step in guard.steps(start, args.total_steps):
            x, y = batch(step)
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            guard.completed(step, state, samples=per_rank * world)
            emit(e="step", done=step + 1, loss=float(loss.detach()))
    except SystemExit as stop:
        emit(e="preempted", step=guard.step, code=stop.code)
        dist.destroy_process_group()
        raise
    if args.sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        full = net.state_dict()
    if rank == 0 and args.out is not None:
        flat = torch.cat([t.detach().cpu().flatten() for t in full.values()])
        args.out.write_bytes(flat.numpy().tobytes())
    emit(e="finished", step=guard.step)
    # Every rank reaches here after the same last step: meet before tearing the group down, so no
    # rank's gloo threads see a peer (or rank 0's store) go away mid-teardown and abort at exit.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
