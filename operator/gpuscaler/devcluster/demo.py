"""``gpuscaler dev-cluster demo``: a job trains on spot, survives a reclaim and finishes, on this machine.

The getting-started story end to end, with nothing faked but the cloud: a dev cluster (real API
server, scheduler and controllers; kwok's fake GPU nodes), the operator (``gpuscaler run``, its
kwok provider), the worker runner (:mod:`gpuscaler.devcluster.workers`, which runs the pods'
commands here), and ``examples/demo-spot.yaml``: a small real training
(``examples/train/demo_train.py``) on one spot GPU. Part-way, the demo taints the job's node with
the AWS Node Termination Handler's spot-interruption taint, as NTH does on a real reclaim. It prints
a timeline as things happen: planned, node Ready, training progress, the notice, the checkpoint
acknowledged at step N, the re-plan, resumed at step N, Succeeded, the cost. At the end it trains
the same script uninterrupted and compares the final weights' SHA-256.

Exit 0 only when the job succeeded, the final weights equal the uninterrupted run's, and the steps
trained again after the reclaim are within one checkpoint interval; 1 otherwise (the timeline says
what went wrong).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuscaler import names
from gpuscaler.devcluster import build as buildmod
from gpuscaler.devcluster import chart
from gpuscaler.devcluster import cluster as clustermod
from gpuscaler.devcluster.workers import RunnerConfig, WorkerRunner, bind_claim

JOB_FILE = "demo-spot.yaml"
POLICY_FILE = "dev-cluster-demo.yaml"
NAMESPACE = "default"
DEMO_INTERVAL_S = 10
"""The demo's checkpoint interval (``policies/dev-cluster-demo.yaml`` allows it), so a two-minute job
checkpoints on its interval as well as on the notice."""


def repo_root() -> Path:
    """The checkout this package runs from (the demo needs its ``examples/`` and ``policies/``)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "examples" / JOB_FILE).is_file():
        raise clustermod.ClusterError(
            f"examples/{JOB_FILE} not found next to the package ({root}): run the demo from a gpuscaler "
            "checkout installed with `pip install -e .`"
        )
    return root


@dataclass
class Timeline:
    """Prints each step of the story once, with the seconds since the start."""

    t0: float = field(default_factory=time.monotonic)
    out: Callable[[str], None] = lambda line: print(line, flush=True)
    said: set[str] = field(default_factory=set)

    def say(self, text: str, key: str | None = None) -> None:
        key = key or text
        if key in self.said:
            return
        self.said.add(key)
        self.out(f"[{time.monotonic() - self.t0:6.1f}s] {text}")


def job_args(doc: dict[str, Any]) -> tuple[int, Path]:
    """The example's total steps and the container path of its weights digest."""
    command = doc["spec"]["template"]["spec"]["containers"][0]["command"]
    steps = int(command[command.index("--total-steps") + 1])
    digest = Path(command[command.index("--digest") + 1])
    return steps, digest


def _uninterrupted_digest(script: Path, steps: int, work: Path) -> str:
    """Train the example's script once more, alone and uninterrupted, and return its weights' digest."""
    ckpt, digest = work / "reference-checkpoints", work / "reference.sha256"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCALER_", "POD_"))}
    env.update(GPUSCALER_CHECKPOINT_DIR=str(ckpt), GPUSCALER_CHECKPOINT_INTERVAL_S="86400", OMP_NUM_THREADS="1")
    subprocess.run(
        [sys.executable, str(script), "--total-steps", str(steps), "--step-seconds", "0", "--digest", str(digest)],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return digest.read_text().strip()


def resumed_at(runner: WorkerRunner, job: str) -> list[int]:
    """The step each of the job's processes resumed at, in start order (from the script's first line)."""
    out = []
    for p in sorted(runner.processes.values(), key=lambda p: p.started):
        if p.job != job:
            continue
        text = p.log.read_text(errors="replace") if p.log.exists() else ""
        m = re.search(r"resuming at step (\d+)", text)
        if m:
            out.append(int(m.group(1)))
    return out


def run_demo(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """Run the whole demo; 0 when the job finished with nothing lost beyond one interval."""
    from kubernetes import client

    root = repo_root()
    job_doc = yaml.safe_load((root / "examples" / JOB_FILE).read_text())
    command = job_doc["spec"]["template"]["spec"]["containers"][0]["command"]
    if args.step_seconds is not None:
        command[command.index("--step-seconds") + 1] = f"{args.step_seconds:g}"
    step_s = float(command[command.index("--step-seconds") + 1])
    name = job_doc["metadata"]["name"]
    steps, digest_path = job_args(job_doc)
    job_doc["spec"]["checkpoint"]["intervalSeconds"] = DEMO_INTERVAL_S  # what the demo's policy allows
    interval_s = float(DEMO_INTERVAL_S)
    tl = Timeline()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="gpuscaler-demo-"))
    b = buildmod.ensure_all(log=log)
    c = clustermod.Cluster(b, name=args.name, detach=False, log=log)
    c.start()
    tl.say(f"dev cluster up (Kubernetes API at {c.server}); work directory {work}")
    operator: subprocess.Popen[bytes] | None = None
    runner: WorkerRunner | None = None
    try:
        from gpuscaler.api import crd

        paths = crd.write(work / "crds")
        crd_names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in paths]
        env = c.env(dict(os.environ))
        clustermod.apply_crds(env, paths, crd_names)
        chart.install_finalizer_policy(env, NAMESPACE)  # as the Helm chart does beside its operator
        op_env = dict(
            env,
            GPUSCALER_POLICY_FILE=str(root / "policies" / POLICY_FILE),
            GPUSCALER_METRICS_PORT="0",
            GPUSCALER_HEALTH_PORT="0",
            GPUSCALER_RECONCILE_INTERVAL_S="0.5",
            GPUSCALER_KWOK_PROVISIONING_DELAY_S="1",
            PYTHONUNBUFFERED="1",
        )
        with (work / "operator.log").open("ab") as out:
            operator = subprocess.Popen(
                [sys.executable, "-m", "gpuscaler.cli", "run", "--standalone"], env=op_env, stdout=out, stderr=out
            )
        tl.say(f"operator started (log {work / 'operator.log'})")
        api = c.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        runner = WorkerRunner(
            core,
            RunnerConfig(
                work_dir=work / "workers",
                kubeconfig=Path(c.kubeconfig),
                path_maps={"/app": root / "examples" / "train"},
                env={"OMP_NUM_THREADS": "1"},
                log=lambda line: tl.say(f"runner: {line}"),
            ),
        ).start()
        bind_claim(core, NAMESPACE, f"{name}-checkpoints", runner.claim_dir(NAMESPACE, f"{name}-checkpoints"))
        subprocess.run(
            ["kubectl", "apply", "-n", NAMESPACE, "-f", "-"],
            input=yaml.safe_dump(job_doc).encode(), env=env, check=True, capture_output=True,
        )  # fmt: skip
        tl.say(f"applied examples/{JOB_FILE}: {steps} steps, checkpoint every {interval_s:g} s")
        ok = _watch(tl, core, custom, runner, name, steps, interval_s / step_s, args)
        final = runner.claim_dir(NAMESPACE, f"{name}-checkpoints") / digest_path.relative_to("/checkpoints")
        if not ok:
            return 1
        tl.say("training the same script uninterrupted, to compare the final weights ...")
        reference = _uninterrupted_digest(root / "examples" / "train" / "demo_train.py", steps, work)
        got = final.read_text().strip() if final.exists() else "(no digest written)"
        same = got == reference
        tl.say(f"final weights sha256 {got[:16]}...; uninterrupted run {reference[:16]}...: "
               f"{'identical' if same else 'DIFFERENT'}")
        return 0 if same else 1
    finally:
        if runner is not None:
            runner.stop()
        if operator is not None and operator.poll() is None:
            operator.terminate()
            try:
                operator.wait(15)
            except subprocess.TimeoutExpired:
                operator.kill()
        c.stop()


@dataclass
class Watch:
    """What the demo follows of one job, and what it has seen so far."""

    tl: Timeline
    core: Any
    runner: WorkerRunner
    name: str
    steps: int
    notice_step: int
    noticed: bool = False
    last_pct: int = -1

    @property
    def label(self) -> str:
        return f"{names.JOB_LABEL}={NAMESPACE}.{self.name}"

    def plan_and_nodes(self, st: dict[str, Any]) -> None:
        """Say each new plan and each node that became Ready."""
        plan = st.get("plan") or {}
        key = f"plan {plan.get('plannedAt')}"
        if plan and key not in self.tl.said:
            what = "re-planned" if any(k.startswith("plan ") for k in self.tl.said) else "planned"
            self.tl.say(
                f"{what}: {plan.get('summary')} at ${plan.get('usdPerHour', 0):.2f}/h; {plan.get('why', '')[:160]}",
                key=key,
            )
        for node in self.core.list_node(label_selector=self.label).items:
            if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
                labels = node.metadata.labels
                self.tl.say(
                    f"node {node.metadata.name} Ready ({labels.get(names.INSTANCE_TYPE_LABEL)}, "
                    f"{labels.get(names.CAPACITY_TYPE_LABEL)})",
                    key=f"node {node.metadata.name}",
                )

    def progress_and_notice(self, st: dict[str, Any]) -> None:
        """Say the progress every 20%, and taint the running node once the notice step is reached."""
        progress = st.get("progress") or {}
        step = int(progress.get("step") or 0)
        pct = int(100 * step / self.steps) // 20 * 20
        if step and pct != self.last_pct:
            self.last_pct = pct
            self.tl.say(
                f"training: step {step}/{self.steps}, newest checkpoint at step {progress.get('checkpointStep')}",
                key=f"progress {pct}",
            )
        if self.noticed or step < self.notice_step:
            return
        node = _running_node(self.core, self.label)
        if node:
            body = self.core.read_node(node)
            taints = [*(body.spec.taints or []), {"key": names.AWS_SPOT_ITN_TAINT, "effect": "NoSchedule"}]
            self.core.patch_node(node, {"spec": {"taints": taints}})
            self.noticed = True
            self.tl.say(f"spot notice: node {node} tainted {names.AWS_SPOT_ITN_TAINT} at step {step} (AWS: 2 minutes to go)")

    def interruptions(self, st: dict[str, Any]) -> tuple[list[int], list[int]]:
        """Say the acknowledged checkpoints, the recoveries and the resumed steps; return (resumed, acked)."""
        history = st.get("interruptionHistory") or []
        for rec in history:
            if rec.get("checkpointAcked"):
                self.tl.say(
                    f"checkpoint acknowledged at step {rec.get('checkpointStep')} (step reached "
                    f"{rec.get('stepReached')}); {rec.get('action', '')[:120]}",
                    key=f"ack {rec.get('time')}",
                )
            if rec.get("recoverySeconds") is not None:
                self.tl.say(
                    f"running again {rec['recoverySeconds']:.0f} s after the notice; {rec.get('lostSteps')} steps "
                    "trained again",
                    key=f"rec {rec.get('time')}",
                )
        resumed = resumed_at(self.runner, f"{NAMESPACE}.{self.name}")
        acked = [int(r["checkpointStep"]) for r in history if r.get("checkpointAcked") and r.get("checkpointStep") is not None]
        if len(resumed) > 1:
            extra = ""
            if acked and resumed[-1] > acked[-1]:
                extra = (f" (it trained on after the acknowledged step {acked[-1]} until its pod was deleted, "
                         "and checkpointed again on SIGTERM)")
            self.tl.say(f"resumed at step {resumed[-1]} on the new node{extra}", key=f"resumed {len(resumed)}")
        return resumed, acked

    def verdict(self, st: dict[str, Any], resumed: list[int], acked: list[int], steps_per_interval: float) -> bool:
        """Whether a Succeeded job is the story told: noticed, resumed from the acknowledged checkpoint
        or a newer one, at most one interval trained again."""
        lost = int(st.get("lostSteps") or 0)
        per_interval = int(steps_per_interval) + 1
        self.tl.say(
            f"Succeeded: cost ${st.get('costUsd', 0):.4f}, {st.get('interruptions', 0)} interruption(s), "
            f"{lost} steps trained again (one interval is about {per_interval})"
        )
        if not self.noticed:
            self.tl.say("the job finished before the notice could be sent")
            return False
        if len(resumed) < 2 or not acked or resumed[-1] < acked[-1]:
            self.tl.say(f"the job did not resume from the acknowledged checkpoint (resumed at {resumed}, acked {acked})")
            return False
        return lost <= per_interval


def _watch(
    tl: Timeline, core: Any, custom: Any, runner: WorkerRunner, name: str, steps: int, steps_per_interval: float,
    args: argparse.Namespace,
) -> bool:
    """Follow the job to its end, sending the spot notice part-way; True when it Succeeded as told."""
    w = Watch(tl, core, runner, name, steps, int(steps * args.notice_at))
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        job = custom.get_namespaced_custom_object(names.GROUP, "v1alpha1", NAMESPACE, "trainingjobs", name)
        st = job.get("status") or {}
        w.plan_and_nodes(st)
        w.progress_and_notice(st)
        resumed, acked = w.interruptions(st)
        phase = st.get("phase", "")
        tl.say(f"phase {phase}" + (f": {st.get('message')}" if st.get("message") else ""), key=f"phase {phase}")
        if phase == "Succeeded":
            return w.verdict(st, resumed, acked, steps_per_interval)
        if phase == "Failed":
            return False
        time.sleep(0.5)
    tl.say(f"timed out after {args.timeout:.0f} s")
    return False


def _running_node(core: Any, job_label: str) -> str | None:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=job_label).items
    running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    return str(running[0].spec.node_name) if running else None
