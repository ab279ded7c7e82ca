"""A small real training job under gpuscaler's TrainingGuard: what the getting-started demo trains.

A two-layer MLP learns a synthetic regression with SGD and momentum, in PyTorch on CPU when torch
is installed, else the same maths in numpy (so the demo needs nothing beyond the base install).
Every step's batch comes from a generator seeded with ``(seed, step)`` and the update does not
depend on the plan, so a run that is interrupted, checkpointed and resumed on another node ends
with the same weights, bit for bit, as an uninterrupted one. At the end rank 0 writes the SHA-256
of the final weights to ``--digest`` (``/checkpoints/final-weights.sha256`` in the example job).

Under the guard it resumes from the newest complete checkpoint, checkpoints on the plan's
interval (``GPUSCALER_CHECKPOINT_INTERVAL_S``), and on a checkpoint request from the operator or a
SIGTERM it checkpoints and exits 75; it reports its progress to its pod. ``--step-seconds`` paces
the steps so that a person can watch the demo (the maths itself takes microseconds).

Run it alone: ``GPUSCALER_CHECKPOINT_DIR=/tmp/ck python examples/train/demo_train.py --total-steps 300``.
"""

# expect: run-by=e2e/test_dev_cluster_workers.py   (trained, interrupted and compared with an uninterrupted run there; tests/test_examples.py)

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpuscaler.runtime import TrainingGuard
from gpuscaler.runtime.kube_reporter import KubeReporter

DIM = 16
"""Input features."""
HIDDEN = 32
"""Hidden units."""
BATCH = 32
"""Rows per step (fixed: the result does not depend on the plan's micro-batch)."""
LR = 0.01
MOMENTUM = 0.9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--total-steps", type=int, default=600, help="optimizer steps in all")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--step-seconds", type=float, default=0.2, help="pace: seconds per step (0: as fast as it goes)")
    ap.add_argument("--samples-per-step", type=int, default=256, help="samples each step reports (the job's global batch)")
    ap.add_argument("--digest", type=Path, default=None, help="write the final weights' SHA-256 here (rank 0)")
    ap.add_argument("--backend", choices=("auto", "torch", "numpy"), default="auto")
    return ap.parse_args(argv)


def batch(seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Step ``step``'s batch: inputs and targets of a fixed smooth function, seeded by ``(seed, step)``."""
    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((BATCH, DIM))
    y = np.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x.astype(np.float32), y.astype(np.float32)


class NumpyModel:
    """The MLP, its gradients and SGD with momentum in numpy (float32)."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.params = {
            "w1": (rng.standard_normal((DIM, HIDDEN)) / np.sqrt(DIM)).astype(np.float32),
            "b1": np.zeros(HIDDEN, np.float32),
            "w2": (rng.standard_normal((HIDDEN, 1)) / np.sqrt(HIDDEN)).astype(np.float32),
            "b2": np.zeros(1, np.float32),
        }
        self.velocity = {k: np.zeros_like(v) for k, v in self.params.items()}

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        p = self.params
        h = np.maximum(x @ p["w1"] + p["b1"], 0)
        out = h @ p["w2"] + p["b2"]
        err = out - y
        g_out = 2 * err / len(y)
        grads = {"w2": h.T @ g_out, "b2": g_out.sum(0)}
        g_h = (g_out @ p["w2"].T) * (h > 0)
        grads.update(w1=x.T @ g_h, b1=g_h.sum(0))
        for k in p:
            self.velocity[k] = MOMENTUM * self.velocity[k] + grads[k]
            p[k] = p[k] - LR * self.velocity[k]
        return float((err**2).mean())

    def state(self) -> dict[str, np.ndarray]:
        return {**{f"p.{k}": v for k, v in self.params.items()}, **{f"v.{k}": v for k, v in self.velocity.items()}}

    def load(self, state: dict[str, np.ndarray]) -> None:
        for k in self.params:
            self.params[k] = state[f"p.{k}"]
            self.velocity[k] = state[f"v.{k}"]

    def weights_bytes(self) -> bytes:
        return b"".join(self.params[k].tobytes() for k in sorted(self.params))


class TorchModel:
    """The same MLP and optimizer in PyTorch (CPU, one thread, deterministic)."""

    def __init__(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        self.torch = torch
        self.model = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        torch = self.torch
        loss = torch.nn.functional.mse_loss(self.model(torch.from_numpy(x)), torch.from_numpy(y))
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.item())

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])

    def weights_bytes(self) -> bytes:
        sd = self.model.state_dict()
        return b"".join(sd[k].numpy().tobytes() for k in sorted(sd))


def make_model(backend: str, seed: int) -> NumpyModel | TorchModel:
    """The torch model when torch is installed (or asked for), else the numpy one."""
    if backend in ("auto", "torch"):
        try:
            return TorchModel(seed)
        except ImportError:
            if backend == "torch":
                raise
    return NumpyModel(seed)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = make_model(args.backend, args.seed)
    use_torch = isinstance(model, TorchModel)
    rank = int(os.environ.get("RANK", os.environ.get("NODE_RANK", "0")))

    def save(state: dict[str, Any], path: Path) -> None:
        buf = io.BytesIO()
        if use_torch:
            model.torch.save(state, buf)  # type: ignore[union-attr]
        else:
            np.savez(buf, **state["arrays"], step=state["step"])
        path.write_bytes(buf.getvalue())

    def load(path: Path) -> dict[str, Any]:
        if use_torch:
            loaded: dict[str, Any] = model.torch.load(path, weights_only=True)  # type: ignore[union-attr]
            return loaded
        with np.load(path) as z:
            return {"arrays": {k: z[k].copy() for k in z.files if k != "step"}, "step": int(z["step"])}

    def snapshot(step: int) -> dict[str, Any]:
        if use_torch:
            return {**model.state(), "step": step}
        return {"arrays": model.state(), "step": step}

    guard: TrainingGuard[dict[str, Any]] = TrainingGuard.from_env(
        save=save, load=load, reporter=KubeReporter.from_env(), writer=rank == 0
    )
    state, start = guard.resume(snapshot(0))
    if start:
        model.load(state if use_torch else state["arrays"])
    print(f"demo_train: {'torch' if use_torch else 'numpy'} backend, resuming at step {start} of {args.total_steps}",
          flush=True)
    loss = float("nan")
    for step in guard.steps(start, args.total_steps):
        t0 = time.monotonic()
        loss = model.step(*batch(args.seed, step))
        guard.completed(step, snapshot(step + 1), samples=args.samples_per_step)
        if (step + 1) % 50 == 0:
            print(f"demo_train: step {step + 1}, loss {loss:.4f}", flush=True)
        if args.step_seconds > 0:
            time.sleep(max(0.0, args.step_seconds - (time.monotonic() - t0)))
    digest = hashlib.sha256(model.weights_bytes()).hexdigest()
    if rank == 0 and args.digest is not None:
        args.digest.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.digest.with_name(args.digest.name + ".tmp")
        tmp.write_text(digest + "\n")
        os.replace(tmp, args.digest)
    print(f"demo_train: done at step {args.total_steps}, loss {loss:.4f}, weights sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
