"""Operator scale: apply N TrainingJobs at once, measure apply-to-Running latency and operator memory.

Starts a dev cluster (or uses ``--kubeconfig``), installs the CRD, runs ``gpuscaler run`` as a
subprocess (kwok provider), applies N one-node jobs in one ``kubectl apply`` and polls their
phases. Prints the median and p95 of apply-to-Running latency, the time until all ran, and the
operator's peak resident memory (``VmHWM`` from ``/proc``).

    python benchmarks/operator_scale.py --jobs 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from gpuscaler.devcluster.cluster import apply_crds, existing_or_private

ROOT = Path(__file__).resolve().parents[1]


def job(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "gpuscaler.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": f"bench-{i}"},
        "spec": {
            "workload": {"model": "resnet50"},
            "globalBatch": 256,
            "training": {"epochs": 1},
            "constraints": {"instanceTypes": ["p3.2xlarge"], "minGpus": 1, "maxGpus": 1, "spot": "never"},
        },
    }


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--kubeconfig", help="use this running cluster instead of starting one")
    ap.add_argument("--delay", default="1", help="kwok provisioning delay, seconds")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    ns = f"bench-{os.getpid()}"
    with existing_or_private(args.kubeconfig, f"bench-op-{os.getpid()}") as (_kubeconfig, env):
        def run(*a: str, **kw: Any) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["kubectl", *a], env=env, check=True, capture_output=True, text=True, **kw)

        apply_crds(env, [ROOT / "crds" / "trainingjob.yaml"], ["trainingjobs.gpuscaler.io"])
        run("create", "namespace", ns)
        op_env = dict(
            env,
            GPUSCALER_NAMESPACE=ns,
            GPUSCALER_METRICS_PORT="0",
            GPUSCALER_HEALTH_PORT="0",
            GPUSCALER_KWOK_PROVISIONING_DELAY_S=args.delay,
            GPUSCALER_RECONCILE_INTERVAL_S="1",
        )
        log = tempfile.NamedTemporaryFile(prefix="operator-", suffix=".log", delete=False)  # noqa: SIM115
        op = subprocess.Popen(
            [sys.executable, "-m", "gpuscaler.cli", "run", "--standalone"], env=op_env, stdout=log, stderr=log
        )
        try:
            time.sleep(3)
            docs = yaml.safe_dump_all([job(i) for i in range(args.jobs)])
            t0 = time.monotonic()
            run("apply", "-n", ns, "-f", "-", input=docs)
            applied = time.monotonic() - t0
            running: dict[str, float] = {}
            while len(running) < args.jobs and time.monotonic() - t0 < args.timeout:
                out = run(
                    "get",
                    "trainingjobs",
                    "-n",
                    ns,
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name} {.metadata.creationTimestamp} {.status.phase}{'\\n'}{end}",
                ).stdout
                now = time.time()
                for line in out.splitlines():
                    name, created, phase = [*line.split(" "), "", ""][:3]
                    if phase == "Running" and name not in running:
                        born = datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
                        running[name] = now - born  # latency from the API server's creation time
                time.sleep(0.5)
            lat = sorted(running.values())
            peak = peak_rss_mib(op.pid)
        finally:
            op.terminate()
            op.wait(30)
        if not lat:
            print("no job reached Running; operator log:", log.name)
            return 1
        p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
        print(f"jobs: {args.jobs} applied in {applied:.1f}s (one kubectl apply); Running: {len(lat)}")
        print(
            f"creation-to-Running latency (1 s timestamp resolution): median {statistics.median(lat):.1f}s, p95 {p95:.1f}s, all {lat[-1]:.1f}s"
        )
        print(f"kwok provisioning delay {args.delay}s, reconcile interval 1s")
        print(f"operator peak RSS: {peak:.0f} MiB")
        if not args.kubeconfig:
            return 0 if len(lat) == args.jobs else 1
        run("delete", "namespace", ns, "--wait=false")
        return 0 if len(lat) == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
