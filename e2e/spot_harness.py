"""Plays the kubelet and the training container for the spot e2e tests and benchmark.

kwok never runs a worker's image, so this harness does what the node would: when kwok marks a
worker pod Running, it starts a local process (``python e2e/spot_harness.py worker ...``) that
runs the real runtime library: a deterministic numpy SGD loop under :class:`TrainingGuard`, with
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
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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


def annotations_file(annotations: dict[str, str]) -> str:
    """The downward API projection: ``key="value"`` lines sorted by key, values quoted like Go's %q."""
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(annotations.items()))


@dataclass
class Played:
    """One pod played by one local process."""

    uid: str
    name: str
    rank: int
    node: str
    proc: subprocess.Popen[bytes]
    podinfo: Path
    log: Path
    started: float
    signalled: str = ""
    last_annotations: str = ""
    exit_code: int | None = None


@dataclass
class Harness:
    """Runs one process per Running worker pod of a job, until stopped."""

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
    played: dict[str, Played] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def ckpt_dir(self) -> Path:
        return self.work / "checkpoints"

    @property
    def weights(self) -> Path:
        return self.work / "weights.npy"

    def start(self) -> Harness:
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._loop, name="spot-harness", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        for p in self.played.values():
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(5)
            self._kill_worker(p)

    def _kill_worker(self, played: Played) -> None:
        """torchrun starts its worker in a session of its own: kill it too (by the pid it logged)."""
        if not self.torchrun:
            return
        for e in self.events(played):
            if e["e"] == "resume":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(e["pid"]), signal.SIGKILL)

    def terminate(self, played: Played) -> None:
        """SIGTERM a process whose pod is not deleted, as a kubelet's graceful node shutdown does:
        the pod first gets the ``DisruptionTarget`` condition (reason ``TerminationByKubelet``,
        Kubernetes >= 1.26), the cluster's evidence that the stop is no failure of the worker."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                "message": "Pod was terminated in response to imminent node shutdown.", "lastTransitionTime": stamp}
        self.core.patch_namespaced_pod_status(played.name, self.namespace, {"status": {"conditions": [cond]}})
        played.signalled = "TERM"
        played.proc.send_signal(signal.SIGTERM)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as err:  # keep playing; the test reads errors
                self.errors.append(repr(err))
            time.sleep(self.poll_s)

    def events(self, played: Played) -> list[dict[str, Any]]:
        if not played.log.exists():
            return []
        return [json.loads(line) for line in played.log.read_text().splitlines() if line.strip()]

    def tick(self) -> None:
        label = f"{JOB_LABEL}={self.namespace}.{self.job}"
        pods = {p.metadata.uid: p for p in self.core.list_namespaced_pod(self.namespace, label_selector=label).items}
        nodes = {n.metadata.name for n in self.core.list_node(label_selector=JOB_LABEL).items}
        for uid, pl in list(self.played.items()):
            pod = pods.get(uid)
            alive = pl.proc.poll() is None
            if alive and pl.node not in nodes and pl.signalled != "KILL":
                pl.proc.kill()  # the machine is gone: no SIGTERM, no last checkpoint
                self._kill_worker(pl)
                pl.signalled = "KILL"
            elif alive and (pod is None or pod.metadata.deletion_timestamp) and not pl.signalled:
                pl.proc.send_signal(signal.SIGTERM)  # the kubelet stops a deleted pod
                pl.signalled = "TERM"
            elif alive and pod is not None:
                text = annotations_file(dict(pod.metadata.annotations or {}))
                if text != pl.last_annotations:
                    tmp = pl.podinfo / ".annotations.tmp"
                    tmp.write_text(text)
                    os.replace(tmp, pl.podinfo / "annotations")
                    pl.last_annotations = text
            if not alive and pl.exit_code is None:
                pl.exit_code = pl.proc.returncode
                if pod is not None and not pod.metadata.deletion_timestamp and pl.node in nodes:
                    self._finish(pod, pl.exit_code)
        busy = {pl.rank for pl in self.played.values() if pl.proc.poll() is None}
        for uid, pod in pods.items():
            if uid in self.played or pod.metadata.deletion_timestamp or pod.status.phase != "Running":
                continue
            rank = int(pod.metadata.labels.get("gpuscaler.io/rank", "0"))
            if rank in busy or pod.spec.node_name not in nodes:
                continue  # the previous process of this rank still runs (shared volume: one at a time)
            self._spawn(pod, rank)

    def _spawn(self, pod: Any, rank: int) -> None:
        uid = pod.metadata.uid
        podinfo = self.work / "podinfo" / uid
        podinfo.mkdir(parents=True, exist_ok=True)
        text = annotations_file(dict(pod.metadata.annotations or {}))
        (podinfo / "annotations").write_text(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCALER_")}
        for e in pod.spec.containers[0].env or []:
            if e.value is not None:
                env[e.name] = e.value
        env.update(
            GPUSCALER_CHECKPOINT_DIR=str(self.ckpt_dir),
            GPUSCALER_PODINFO_DIR=str(podinfo),
            POD_NAME=pod.metadata.name,
            POD_NAMESPACE=self.namespace,
            KUBECONFIG=self.kubeconfig,
            OMP_NUM_THREADS="1",
            OPENBLAS_NUM_THREADS="1",
        )
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = self.work / f"worker-{pod.metadata.name}-{uid[:8]}.jsonl"
        launcher = (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "--max-restarts", "0"]
            if self.torchrun
            else [sys.executable]
        )
        cmd = [
            *launcher, str(HERE), "worker",
            "--total-steps", str(self.total_steps), "--out", str(self.weights), "--rank", str(rank),
            "--samples-per-step", str(self.samples_per_step), "--step-sleep", str(self.step_sleep), "--events-log", str(log),
        ]
        out = (self.work / "workers.stderr").open("ab")
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out)
        self.played[uid] = Played(uid, pod.metadata.name, rank, pod.spec.node_name, proc, podinfo, log, time.time(),
                                  last_annotations=text)

    def _finish(self, pod: Any, code: int) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": stamp, "finishedAt": stamp}
        statuses = [
            {"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0, "state": {"terminated": term}}
            for c in pod.spec.containers
        ]
        phase = "Succeeded" if code == 0 else "Failed"
        self.core.patch_namespaced_pod_status(
            pod.metadata.name, self.namespace, {"status": {"phase": phase, "containerStatuses": statuses}}
        )

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

    def rank0_running(self) -> Played | None:
        live = [p for p in self.played.values() if p.rank == 0 and p.proc.poll() is None]
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
