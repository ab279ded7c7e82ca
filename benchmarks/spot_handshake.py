"""Spot handshake: time from an interruption notice to checkpoint done, and to Running again.

On the local control plane (a dev cluster it starts, or ``--kubeconfig``), with the operator as a
subprocess (kwok provider, 1 s node provisioning delay) and the training played by real runtime
processes (``e2e/spot_harness.py``). For each run: a one-GPU spot job starts, trains 150 steps,
then its node gets a notice taint (GKE's, 30 s, by default). Measured from the taint:

* checkpoint done: the rank-0 pod carries ``gpuscaler.io/checkpoint-ack`` equal to the request id
  (the runtime has committed the checkpoint and patched its pod);
* Running again: the job's phase is Running on the new node (``interruptions == 1``).

Prints the median and p95 over the runs and whether the handshake fits a 30 s notice.

    python benchmarks/spot_handshake.py --runs 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpuscaler.devcluster.cluster import apply_crds, existing_or_private
from gpuscaler.testing import pinned, training_job, worker_template

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

from spot_harness import Harness  # noqa: E402

NOTICE_S = 30.0
"""GKE's notice: the shortest there is, and what the handshake must fit in."""


def job(name: str, steps: int) -> dict[str, Any]:
    return training_job(
        name,
        training={"steps": steps},
        maxDuration="4h",
        constraints=pinned(["g4dn.xlarge", "g5.xlarge", "g6.xlarge"], 1, "preferred"),
        checkpoint={"intervalSeconds": 10, "restartSeconds": 30},
        template=worker_template("registry.invalid/trainer:bench"),
    )


def wait(pred: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--kubeconfig", default=None)
    ap.add_argument("--taint", default="cloud.google.com/impending-node-termination")
    ap.add_argument("--step-sleep", type=float, default=0.03)
    args = ap.parse_args()
    from kubernetes import client, config

    ckpt, running = [], []
    with (
        existing_or_private(args.kubeconfig, f"bench-spot-{os.getpid()}") as (kubeconfig, env),
        tempfile.TemporaryDirectory() as tmp,
    ):
        api = config.new_client_from_config(config_file=kubeconfig)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        apply_crds(env, [ROOT / "crds" / "trainingjob.yaml"], ["trainingjobs.gpuscaler.io"])
        ns = f"bench-spot-{os.getpid()}"
        core.create_namespace({"metadata": {"name": ns}})
        wait(
            lambda: any(
                sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items
            ),
            30,
            "the default ServiceAccount",
        )
        policy = Path(tmp) / "policy.yaml"
        policy.write_text("name: bench\nminCheckpointIntervalS: 10\n")
        op_env = dict(
            env,
            GPUSCALER_NAMESPACE=ns,
            GPUSCALER_METRICS_PORT="0",
            GPUSCALER_HEALTH_PORT="0",
            GPUSCALER_RECONCILE_INTERVAL_S="0.5",
            GPUSCALER_KWOK_PROVISIONING_DELAY_S="1",
            GPUSCALER_POLICY_FILE=str(policy),
        )
        log = (Path(tmp) / "operator.log").open("wb")
        op = subprocess.Popen(
            [sys.executable, "-m", "gpuscaler.cli", "run", "--standalone"], env=op_env, stdout=log, stderr=log
        )
        try:
            for i in range(args.runs):
                name = f"tj-{i}"

                def status(name: str = name) -> dict[str, Any]:
                    obj = custom.get_namespaced_custom_object(
                        "gpuscaler.io", "v1alpha1", ns, "trainingjobs", name
                    )
                    return dict(obj.get("status") or {})

                subprocess.run(
                    ["kubectl", "apply", "-n", ns, "-f", "-"],
                    input=yaml.safe_dump(job(name, 5000)),
                    text=True,
                    env=env,
                    check=True,
                    capture_output=True,
                )
                h = Harness(
                    core, ns, name, Path(tmp) / name, kubeconfig, 5000, step_sleep=args.step_sleep
                ).start()
                try:
                    try:
                        wait(lambda s=status: s().get("phase") == "Running", 60, f"{name} Running")
                    except TimeoutError:
                        print(status(), file=sys.stderr)
                        raise
                    wait(lambda h=h: h.rank0_step() >= 150, 60, "150 steps")
                    node = next(
                        n
                        for n in core.list_node(label_selector="gpuscaler.io/job").items
                        if n.metadata.labels["gpuscaler.io/job"] == f"{ns}.{name}"
                    )
                    taints = [*(node.spec.taints or []), {"key": args.taint, "effect": "NoSchedule"}]
                    t0 = time.monotonic()
                    core.patch_node(node.metadata.name, {"spec": {"taints": taints}})

                    def acked(name: str = name) -> bool:
                        pod = core.read_namespaced_pod(f"{name}-worker-0", ns)
                        ann = pod.metadata.annotations or {}
                        req = ann.get("gpuscaler.io/checkpoint-requested")
                        return bool(req) and ann.get("gpuscaler.io/checkpoint-ack") == req

                    wait(acked, NOTICE_S * 2, "checkpoint ack")
                    ckpt.append(time.monotonic() - t0)
                    wait(
                        lambda s=status: s().get("phase") == "Running" and s().get("interruptions") == 1,
                        120,
                        "Running again",
                    )
                    running.append(time.monotonic() - t0)
                    # the new worker resumes and reports where: then the status has the exact loss
                    wait(lambda h=h: len(h.steps_reached()) > 1 and h.steps_reached()[1][0] > 0, 30, "resume")
                    time.sleep(1.0)
                    rec = status()["interruptionHistory"][0]
                    runs = h.steps_reached()
                    redone = runs[0][0] - (runs[1][1] or 0)
                    print(
                        f"run {i + 1}: checkpoint done {ckpt[-1]:.2f} s, Running again {running[-1]:.2f} s "
                        f"(status: recoverySeconds {rec['recoverySeconds']}, lostSteps {rec['lostSteps']}, "
                        f"steps really redone {redone}; "
                        f"{rec['action'][:90]}...)",
                        flush=True,
                    )
                finally:
                    custom.delete_namespaced_custom_object(
                        "gpuscaler.io", "v1alpha1", ns, "trainingjobs", name
                    )
                    h.stop()
        finally:
            op.terminate()
            op.wait(15)
            core.delete_namespace(ns)
    print()
    print(
        f"notice ({args.taint}) -> checkpoint done: median {statistics.median(ckpt):.2f} s, "
        f"p95 {pct(ckpt, 0.95):.2f} s, max {max(ckpt):.2f} s over {len(ckpt)} runs"
    )
    print(
        f"notice -> Running again:        median {statistics.median(running):.2f} s, "
        f"p95 {pct(running, 0.95):.2f} s, max {max(running):.2f} s"
    )
    fits = max(ckpt) < NOTICE_S
    print(
        f"the checkpoint handshake {'fits' if fits else 'does NOT fit'} a {NOTICE_S:g} s notice "
        f"(worst {max(ckpt):.2f} s; reconcile interval 0.5 s, checkpoint of a toy model)"
    )
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
