"""Plays the kubelet and the training container for the spot e2e tests and benchmark.

kwok never runs a worker's image, so the dev cluster's worker runner
(:mod:`gpuscaler.devcluster.workers`, what ``gpuscaler dev-cluster workers`` and the demo run) does
what the node would, with this module's worker as the command: when kwok marks a worker pod
Running, it starts a local process (``python e2e/spot_harness.py worker ...``) that runs the real
runtime library: a deterministic numpy SGD loop under :class:`TrainingGuard`, with
the pod's ``GPUSCALER_*`` env, a shared checkpoint directory (the "persistent volume"), and the
:class:`~gpuscaler.runtime.kube_reporter.KubeReporter` patching the pod's annotations through the
API server, as the pod would. The harness keeps a downward-API-like ``annotations`` file per pod
in sync from the API (``GPUSCALER_PODINFO_DIR``), which is where the runtime sees
``gpuscaler.io/checkpoint-requested``.

It plays the node's end too: a deleted pod gets SIGTERM (the runtime checkpoints and exits 75);
a pod whose node is gone gets SIGKILL (a hard loss); :meth:`Harness.terminate` SIGTERMs a
process whose pod stays (a kubelet's graceful node shutdown, an eviction the operator did not
ask for). A process that exits 0 turns its pod Succeeded, any other code Failed with that exit
code, as a kubelet would.

With ``torchrun=True`` each pod's process is a real ``torchrun`` launcher (one worker) around the
same training: torchrun exits 1 when its worker exits 75, so the operator must know the
preemption from its own evidence (the pod's ``DisruptionTarget`` condition), not the exit code.

The batch of step ``s`` comes from ``numpy.random.default_rng([seed, s])`` and the update does
not depend on the plan (micro-batch, accumulation, nodes), so an interrupted, re-planned run must
end with the same weights, bit for bit, as :func:`reference_weights`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuscaler.devcluster.workers import Process, RunnerConfig, WorkerRunner, signal_tree

HERE = Path(__file__).resolve()
JOB_LABEL = "gpuscaler.io/job"


# ------------------------------------------------------------------------------ the training process


def batch(seed: int, step: int, size: int, w_true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((size, w_true.shape[0]))
    y = x @ w_true + 0.01 * rng.standard_normal(size)
    return x, y


def sgd_step(state: dict[str, Any], x: np.ndarray, y: np.ndarray, lr: float) -> dict[str, Any]:
    grad = x.T @ (x @ state["w"] - y) / len(y)
    v = 0.9 * state["v"] + grad
    return {"w": state["w"] - lr * v, "v": v, "step": state["step"] + 1}


def reference_weights(total_steps: int, seed: int = 1234, dim: int = 16, size: int = 16, lr: float = 0.01) -> np.ndarray:
    """The weights of an uninterrupted run (no guard, no checkpoints)."""
    w_true = np.random.default_rng(seed).standard_normal(dim)
    state: dict[str, Any] = {"w": np.zeros(dim), "v": np.zeros(dim), "step": 0}
    for step in range(total_steps):
        state = sgd_step(state, *batch(seed, step, size, w_true), lr)
    w: np.ndarray = state["w"]
    return w


def worker_main(argv: list[str]) -> int:
    """One worker: resume, train, checkpoint through the guard, report to the pod."""
    from gpuscaler.runtime import TrainingGuard
    from gpuscaler.runtime.kube_reporter import KubeReporter

    ap = argparse.ArgumentParser()
    ap.add_argument("--total-steps", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--samples-per-step", type=int, default=256)
    ap.add_argument("--step-sleep", type=float, default=0.03)
    ap.add_argument("--events-log", dest="log", type=Path, required=True)
    args = ap.parse_args(argv)
    seed, dim, size, lr = 1234, 16, 16, 0.01
    w_true = np.random.default_rng(seed).standard_normal(dim)
    log = args.log.open("a", buffering=1)

    def emit(**kv: Any) -> None:
        log.write(json.dumps({"t": time.time(), **kv}) + "\n")

    def save(state: dict[str, Any], path: Path) -> None:
        buf = io.BytesIO()
        np.savez(buf, w=state["w"], v=state["v"], step=state["step"])
        path.write_bytes(buf.getvalue())

    def load(path: Path) -> dict[str, Any]:
        with np.load(path) as z:
            return {"w": z["w"].copy(), "v": z["v"].copy(), "step": int(z["step"])}

    guard: TrainingGuard[dict[str, Any]] = TrainingGuard.from_env(
        save=save, load=load, reporter=KubeReporter.from_env(), report_interval_s=0.5, writer=args.rank == 0
    )
    state, start = guard.resume({"w": np.zeros(dim), "v": np.zeros(dim), "step": 0})
    emit(e="resume", start=start, pid=os.getpid())
    try:
        for step in guard.steps(start, args.total_steps):
            state = sgd_step(state, *batch(seed, step, size, w_true), lr)
            time.sleep(args.step_sleep)
            guard.completed(step, state, samples=args.samples_per_step)
            emit(e="step", done=step + 1)
    except SystemExit:
        emit(e="preempted", step=guard.step, checkpoint=guard.last_checkpoint.step if guard.last_checkpoint else None)
        raise
    if args.rank == 0:
        np.save(args.out, state["w"])
    emit(e="finished", step=guard.step)
    return 0


# ------------------------------------------------------------------------------ the harness


@dataclass
class Harness:
    """Runs one process per Running worker pod of a job, until stopped: the dev cluster's worker
    runner (:class:`gpuscaler.devcluster.workers.WorkerRunner`, the code ``gpuscaler dev-cluster
    workers`` runs) with this module's worker as every pod's command."""

    core: Any
    namespace: str
    job: str
    work: Path
    kubeconfig: str
    total_steps: int
    step_sleep: float = 0.03
    samples_per_step: int = 256
    poll_s: float = 0.1
    torchrun: bool = False
    """Launch each worker under ``torchrun --nproc-per-node 1`` (needs torch)."""
    resumed_step_sleep: float | None = None
    """Sleep per step of a process started once the checkpoint directory holds a complete checkpoint
    (``step-N``: a run that resumes); None: ``step_sleep``. For a test whose interruption is timed
    by the clock (a capacity block's window) and whose checks of the resumed run do not depend on
    its pace."""
    runner: WorkerRunner | None = None

    @property
    def ckpt_dir(self) -> Path:
        return self.work / "checkpoints"

    @property
    def weights(self) -> Path:
        return self.work / "weights.npy"

    @property
    def played(self) -> dict[str, Process]:
        return self.runner.processes if self.runner else {}

    @property
    def errors(self) -> list[str]:
        return self.runner.errors if self.runner else []

    def _events_log(self, name: str, uid: str) -> Path:
        return self.work / f"worker-{name}-{uid[:8]}.jsonl"

    def _command(self, pod: Any, argv: list[str], env: dict[str, str]) -> list[str]:
        """The harness's worker instead of the pod's image, with the shared checkpoint directory."""
        env["GPUSCALER_CHECKPOINT_DIR"] = str(self.ckpt_dir)
        rank = int((pod.metadata.labels or {}).get("gpuscaler.io/rank", "0"))
        resumes = self.resumed_step_sleep is not None and any(self.ckpt_dir.glob("step-*"))  # a complete one
        pace = self.resumed_step_sleep if resumes else self.step_sleep
        launcher = (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "--max-restarts", "0"]
            if self.torchrun
            else [sys.executable]
        )
        return [
            *launcher, str(HERE), "worker",
            "--total-steps", str(self.total_steps), "--out", str(self.weights), "--rank", str(rank),
            "--samples-per-step", str(self.samples_per_step), "--step-sleep", str(pace),
            "--events-log", str(self._events_log(pod.metadata.name, pod.metadata.uid)),
        ]

    def start(self) -> Harness:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        config = RunnerConfig(
            work_dir=self.work / "runner",
            kubeconfig=Path(self.kubeconfig),
            namespace=self.namespace,
            selector=f"{JOB_LABEL}={self.namespace}.{self.job}",
            poll_s=self.poll_s,
            env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
            command=self._command,
        )
        self.runner = WorkerRunner(self.core, config).start()
        return self

    def stop(self) -> None:
        if self.runner:
            self.runner.stop(grace_s=0.0)
            logs = sorted(self.work.glob("runner/*/pods/*/container.log"))
            with (self.work / "workers.stderr").open("a") as out:
                for log in logs:
                    out.write(f"--- {log.parent.name}\n{log.read_text(errors='replace')}")

    def terminate(self, played: Process) -> None:
        """SIGTERM a process whose pod is not deleted, as a kubelet's graceful node shutdown does:
        the pod first gets the ``DisruptionTarget`` condition (reason ``TerminationByKubelet``,
        Kubernetes >= 1.26), the cluster's evidence that the stop is no failure of the worker."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                "message": "Pod was terminated in response to imminent node shutdown.", "lastTransitionTime": stamp}
        self.core.patch_namespaced_pod_status(played.name, self.namespace, {"status": {"conditions": [cond]}})
        played.signalled = "TERM"
        assert played.proc is not None
        signal_tree(played.proc, signal.SIGTERM)

    def events(self, played: Process) -> list[dict[str, Any]]:
        log = self._events_log(played.name, played.uid)
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    # --- what the tests read

    def steps_reached(self) -> list[tuple[int, int | None]]:
        """Per process, in start order: (last step done, the step it resumed at)."""
        out = []
        for pl in sorted(self.played.values(), key=lambda p: p.started):
            ev = self.events(pl)
            done = max((e.get("done", e.get("step", 0)) for e in ev if e["e"] in ("step", "preempted")), default=0)
            start = next((e["start"] for e in ev if e["e"] == "resume"), None)
            out.append((done, start))
        return out

    def rank0_running(self) -> Process | None:
        live = [p for p in self.played.values() if p.rank == 0 and p.alive]
        return live[-1] if live else None

    def rank0_step(self) -> int:
        pl = self.rank0_running()
        if pl is None:
            return 0
        return max((e["done"] for e in self.events(pl) if e["e"] == "step"), default=0)


@dataclass
class Harnesses:
    """Harnesses of one test, started by name and stopped together (their workers' stderr printed)."""

    core: Any
    namespace: str
    work: Path
    kubeconfig: str
    made: list[Harness] = field(default_factory=list)

    def __call__(self, job: str, total_steps: int, **kw: Any) -> Harness:
        h = Harness(self.core, self.namespace, job, self.work / job, self.kubeconfig, total_steps, **kw)
        self.made.append(h.start())
        return h

    def stop_all(self) -> None:
        for h in self.made:
            h.stop()
            err = h.work / "workers.stderr"
            if err.exists():
                print(err.read_text(errors="replace")[-3000:])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit("usage: spot_harness.py worker --total-steps N --out W.npy --events-log L.jsonl [--rank R]")
