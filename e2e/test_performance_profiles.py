"""End to end: performance profiles learned from the cluster, on the real control plane.

The operator (``gpuscaler run``, kwok provider, progress annotations only) plans a nightly job on
one A10G (g5.xlarge). The training is played by :class:`spot_harness.Harness`: real processes
running the runtime library at 70% of the plan's predicted throughput, the runtime's
KubeReporter writing the progress annotations. What is checked:

* the finished job leaves a PerformanceProfile whose throughput is the rate the workers really
  ran at (the truth is the workers' own step log, not anything the operator computed);
* the same job applied again is planned from it: ``status.plan.throughputSource`` says
  "measured in 1 run", its P10-P90 band is at most half as wide (in log space) as the first
  plan's, and its predicted training hours are within 10% of the hours the second run measured
  (the project's "Profiles" target); after it, the profile has 2 runs;
* ``gpuscaler profiles export`` / ``import`` round-trip the profile through a file, and
  ``gpuscaler plan --profiles FILE`` plans from it offline;
* a forged progress report (the writer's pod claims twice the rate the job achieves) does not
  reach a profile, and the workers' ServiceAccount cannot write one.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e_helpers import E2ECluster, wait_for
from gpuscaler.testing import pinned, training_job, worker_template
from operator_helpers import OperatorProcess, apply, event_reasons, get_job, job_pods, kubectl, wait_phase
from spot_harness import Harness, Harnesses

pytestmark = pytest.mark.timeout(420)


GROUP, VERSION, PROFILES = "gpuscaler.io", "v1alpha1", "performanceprofiles"
SLOWER = 0.7
"""The workers' real throughput / the model's prediction."""
SAMPLES_PER_STEP = 256
STEPS = 90
"""About 50 s of training at 70% of the A10G's predicted ~650 images/s."""
ENV = {
    "GPUSCALER_OBSERVE_INTERVAL_S": "1",
    "GPUSCALER_OBSERVE_WARMUP_S": "3",
    "GPUSCALER_CORRECTION_MIN_WINDOW_S": "15",
    "GPUSCALER_REPLAN_MIN_INTERVAL_S": "100000",  # the job is pinned to one plan; no move is wanted
}
ROOT = Path(__file__).resolve().parents[1]


def job(name: str, steps: int = STEPS) -> dict[str, Any]:
    return training_job(
        name,
        globalBatch=SAMPLES_PER_STEP,
        training={"steps": steps},
        constraints=pinned("g5.xlarge"),
        checkpoint={"restartSeconds": 30, "writeSeconds": 0.1, "dir": "/checkpoints"},
        template=worker_template(),
    )


@pytest.fixture
def played(core: Any, namespace: str, tmp_path: Path, dev_cluster: E2ECluster) -> Iterator[Harnesses]:
    made = Harnesses(core, namespace, tmp_path, str(dev_cluster.kubeconfig))
    yield made
    made.stop_all()


def true_rate(h: Harness) -> float:
    """Samples/s the workers really trained at, from their own step log (the process's clock)."""
    steps = [e for pl in h.played.values() for e in h.events(pl) if e["e"] == "step"]
    steps.sort(key=lambda e: e["t"])
    assert len(steps) >= 10, steps
    return (len(steps) - 1) * SAMPLES_PER_STEP / (steps[-1]["t"] - steps[0]["t"])


def profiles(custom: Any, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PROFILES)["items"]
    return items


def log_width(plan: dict[str, Any]) -> float:
    return math.log(plan["throughputP90"] / plan["throughputP10"])


def cli(dev_cluster: E2ECluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuscaler.cli", *args], check=False, env=dev_cluster.env,
                          capture_output=True, text=True, timeout=120)


def run_job(custom: Any, namespace: str, name: str, played: Harnesses, dev_cluster: E2ECluster) -> tuple[dict[str, Any], Harness]:
    apply(dev_cluster, namespace, job(name))
    plan = wait_for(lambda: (get_job(custom, namespace, name).get("status") or {}).get("plan"), timeout=60,
                    what=f"{name}'s plan")
    assert plan["instanceType"] == "g5.xlarge" and plan["gpuType"] == "A10G", plan
    step_s = SAMPLES_PER_STEP / (SLOWER * plan["throughput"] / plan["efficiencyFactor"]) - 0.001
    h = played(name, STEPS, step_sleep=step_s, samples_per_step=SAMPLES_PER_STEP)
    wait_phase(custom, namespace, name, "Succeeded", timeout=180)
    return plan, h


def test_a_finished_job_leaves_a_profile_and_the_next_run_is_planned_from_it(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
    played: Harnesses, tmp_path: Path,
) -> None:
    operator(**ENV)
    first, h1 = run_job(custom, namespace, "nightly-1", played, dev_cluster)
    assert "throughputSource" not in first and first["efficiencyFactor"] == 1.0  # no profile yet: the model
    rate1 = true_rate(h1)
    got = wait_for(lambda: profiles(custom, namespace), timeout=30, what="a PerformanceProfile")
    assert len(got) == 1
    p = got[0]["spec"]
    # kopf posts Events from a queue, after the handler wrote the profile: wait for it as for the profile
    wait_for(lambda: "ProfileRecorded" in event_reasons(core, namespace, "nightly-1"), timeout=30,
             what="the ProfileRecorded Event")  # fmt: skip
    assert (p["gpuType"], p["gpus"], p["nodes"], p["runs"]) == ("A10G", 1, 1, 1)
    assert (p["microBatch"], p["accumulation"], p["precision"]) == (first["microBatch"], first["accumulation"], first["precision"])
    assert p["signature"]["workload"] == "resnet50" and p["signature"]["shape"]["model"] == "resnet50"
    assert p["throughput"] == pytest.approx(rate1, rel=0.1), (p, rate1)

    # the same job again: planned from the measurement
    second, h2 = run_job(custom, namespace, "nightly-2", played, dev_cluster)
    rate2 = true_rate(h2)
    assert second["throughputSource"] == "measured in 1 run", second
    assert second["throughput"] == pytest.approx(p["throughput"], rel=1e-3)
    band_ratio = log_width(second) / log_width(first)
    assert band_ratio <= 0.5, (first, second)
    predicted_h = second["totalSamples"] / second["throughput"] / 3600
    measured_h = second["totalSamples"] / rate2 / 3600
    assert predicted_h == pytest.approx(measured_h, rel=0.10), (predicted_h, measured_h)
    model_h = first["totalSamples"] / first["throughput"] / 3600
    after = wait_for(lambda: [x for x in profiles(custom, namespace) if x["spec"]["runs"] == 2], timeout=30,
                     what="the profile with 2 runs")
    print(f"\nprofiles e2e: the workers ran at {rate1:.1f} and {rate2:.1f} images/s (model {first['throughput']:.1f}); "
          f"profile {p['throughput']:.1f}/s; P10-P90 band {math.exp(log_width(first)):.2f}x -> "
          f"{math.exp(log_width(second)):.2f}x wide ({band_ratio:.2f} of the first, log space); predicted training "
          f"hours {model_h * 3600:.1f} s (model) -> {predicted_h * 3600:.1f} s vs measured {measured_h * 3600:.1f} s "
          f"({predicted_h / measured_h - 1:+.1%})")

    # export / import round trip, then an offline plan from the file
    out = tmp_path / "profiles.yaml"
    r = cli(dev_cluster, "profiles", "export", "-n", namespace, "-o", str(out))
    assert r.returncode == 0, r.stderr
    exported = yaml.safe_load(out.read_text())
    assert exported["kind"] == "List" and len(exported["items"]) == 1
    name = after[0]["metadata"]["name"]
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PROFILES, name)
    wait_for(lambda: not profiles(custom, namespace), timeout=30, what="the profile deleted")
    r = cli(dev_cluster, "profiles", "import", str(out), "-n", namespace)
    assert r.returncode == 0 and "1 created" in r.stdout, (r.stdout, r.stderr)
    back = profiles(custom, namespace)
    assert [b["spec"] for b in back] == [after[0]["spec"]] and back[0]["metadata"]["name"] == name
    r = cli(dev_cluster, "profiles", "list", "-n", namespace)
    assert r.returncode == 0 and name in r.stdout and "resnet50" in r.stdout, r.stderr
    spec_file = tmp_path / "nightly.yaml"
    spec_file.write_text(yaml.safe_dump(job("nightly-3")))
    r = cli(dev_cluster, "plan", str(spec_file), "--profiles", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["chosen"]["throughputSource"] == "measured in 2 runs"


def test_a_forged_progress_report_does_not_reach_a_profile(
    dev_cluster: E2ECluster, core: Any, custom: Any, namespace: str, operator: Callable[..., OperatorProcess],
) -> None:
    """The writer's pod claims twice the rate the job achieves: the operator believes the progress
    (it passed every report check) but the run it saw finish contradicts it: no profile."""
    from gpuscaler.runtime.progress import Progress

    operator(**ENV)
    apply(dev_cluster, namespace, job("forged"))
    plan = wait_phase(custom, namespace, "forged", "Running", timeout=90)["status"]["plan"]
    total = plan["totalSamples"]
    real = SLOWER * plan["throughput"]
    done_at = total / real
    (pod,) = job_pods(core, namespace, "forged")
    t0 = time.time()
    while (elapsed := time.time() - t0) < done_at:
        samples = int(min(total, 2 * real * elapsed))
        progress = Progress(step=int(samples // SAMPLES_PER_STEP), samples=samples, last_checkpoint_step=None,
                            last_checkpoint_time=None, checkpoint_ack=None, phase="training", updated_at=time.time())
        core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"annotations": progress.annotations()}})
        time.sleep(0.5)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    term = {"exitCode": 0, "reason": "Completed", "startedAt": stamp, "finishedAt": stamp}
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {"phase": "Succeeded", "containerStatuses": [
        {"name": "train", "image": "x", "imageID": "", "ready": False, "restartCount": 0, "state": {"terminated": term}}]}})
    wait_phase(custom, namespace, "forged", "Succeeded", timeout=60)
    observed = get_job(custom, namespace, "forged")["status"]["observed"]
    assert observed["throughput"] == pytest.approx(2 * real, rel=0.15), observed  # the operator believed the reports
    msgs = [e for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=forged").items
            if e.reason == "ProfileNotRecorded"]
    assert msgs and msgs[0].type == "Warning" and "not what the job achieved" in msgs[0].message, msgs
    time.sleep(2)
    assert profiles(custom, namespace) == []
    # nor can the workers write one themselves
    worker = f"system:serviceaccount:{namespace}:gpuscaler-worker"
    for verb in ("create", "update", "patch"):
        r = kubectl(dev_cluster, "auth", "can-i", verb, "performanceprofiles.gpuscaler.io", "-n", namespace,
                    "--as", worker, check=False)
        assert r.stdout.strip() == "no", (verb, r.stdout, r.stderr)
