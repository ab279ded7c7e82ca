"""Hypothesis over sequences of worker reports, through the real reconcile loop (tests/loop_harness.py).

The world: one spot worker whose runtime trains at a rate within the plan's throughput, reports
(or loses its report), checkpoints, crashes (exit 1 or 75, writing ``runtime-phase=preempted``
first or not), loses its node without a notice, and answers checkpoint requests with a real
checkpoint, while an attacker with ``patch`` on the pod writes any reported annotation in between
(in range or not, a false step, a checkpoint ahead, a time in the future, an ack the operator never
asked for, a forged ``preempted`` phase). The runtime's own report overwrites every annotation it
writes, as :class:`gpuscaler.runtime.kube_reporter.KubeReporter` patches them.

Two properties:

* the operator never refuses the runtime's real acknowledgement of the request it made (the answer
  ends the handshake with ``checkpointAcked``), whatever was reported before;
* a worker that fails with no evidence of the operator's own (no notice, its node there, no
  request of the operator on the pod, no ``DisruptionTarget``) counts as a failure, never as a
  preemption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from gpuscaler.api.status import Phase
from gpuscaler.controller.reconcile import Job
from gpuscaler.runtime import constants as rc
from loop_harness import SPOT_SPEC, World, make_job, spot_world

SPEC = {**SPOT_SPEC, "training": {"steps": 20000}, "maxDuration": "24h"}
"""The interruption tests' spot job, long enough never to finish in a sequence."""
BATCH = 256
SPOT_ITN = [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}]


def stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Runtime:
    """The real runtime of the current gang: what it has done and what it writes."""

    step: int = 0
    checkpoint: int | None = None
    checkpoint_at: datetime | None = None
    ack: str | None = None
    wrote: bool = False
    """This process wrote a checkpoint (it then reports how long that took)."""

    def annotations(self) -> dict[str, str]:
        """What its reporter writes (gpuscaler.runtime.progress.Progress.annotations)."""
        out = {
            rc.ANNOTATION_PROGRESS_STEP: str(self.step),
            rc.ANNOTATION_PROGRESS_SAMPLES: str(float(self.step * BATCH)),
            rc.ANNOTATION_RUNTIME_PHASE: "running",
            rc.ANNOTATION_CHECKPOINT_WRITING: "",
        }
        if self.wrote:
            out[rc.ANNOTATION_CHECKPOINT_DURATION] = "1.250"
        if self.checkpoint is not None and self.checkpoint_at is not None:
            out[rc.ANNOTATION_CHECKPOINT_STEP] = str(self.checkpoint)
            out[rc.ANNOTATION_CHECKPOINT_TIME] = stamp(self.checkpoint_at)
        if self.ack is not None:
            out[rc.ANNOTATION_CHECKPOINT_ACK] = self.ack
        return out

    def resume(self) -> None:
        """A new gang: a new process resumes from the last complete checkpoint."""
        self.step = self.checkpoint or 0
        self.ack = None
        self.wrote = False


def writer(w: World) -> dict[str, Any]:
    (body,) = [b for b in w.workers.pods() if b["metadata"]["labels"].get("gpuscaler.io/rank") == "0"]
    return body


def write(w: World, annotations: dict[str, str]) -> None:
    writer(w)["metadata"].setdefault("annotations", {}).update(annotations)


def train(w: World, rt: Runtime, seconds: float, fraction: float) -> None:
    """The runtime's progress over ``seconds`` at ``fraction`` of the plan's throughput (the clock moves)."""
    assert w.status.plan is not None
    rate = w.status.plan.throughput / BATCH
    rt.step += math.floor(fraction * rate * seconds)


def resume_running(w: World, job: Job, rt: Runtime) -> None:
    w.run_to(job, Phase.RUNNING, limit=60)
    rt.resume()


in_range = hs.integers(min_value=0, max_value=20000).map(str)
forged_value = {
    rc.ANNOTATION_PROGRESS_STEP: hs.one_of(in_range, hs.sampled_from(["-1", "1e9", "x", "99999999999999999"])),
    rc.ANNOTATION_PROGRESS_SAMPLES: hs.one_of(hs.integers(0, 20000 * BATCH).map(str), hs.sampled_from(["nan", "inf", "-5"])),
    rc.ANNOTATION_CHECKPOINT_STEP: hs.one_of(in_range, hs.just("abc")),
    rc.ANNOTATION_CHECKPOINT_TIME: hs.sampled_from(["2026-01-01T00:00:00Z", "2030-01-01T00:00:00Z", "2026-01-01T00:00:00", "now"]),
    rc.ANNOTATION_CHECKPOINT_ACK: hs.sampled_from(["made-up", "20260101T000000-000-a1", "x y"]),
    rc.ANNOTATION_RUNTIME_PHASE: hs.sampled_from([rc.RUNTIME_PHASE_PREEMPTED, "finished", "running"]),
    rc.ANNOTATION_CHECKPOINT_WRITING: hs.sampled_from(["2026-01-01T00:00:00Z", "soon", ""]),
    rc.ANNOTATION_CHECKPOINT_DURATION: hs.sampled_from(["3.5", "-1", "1e9"]),
}
forgery = hs.fixed_dictionaries({}, optional=forged_value)

action = hs.one_of(
    hs.tuples(hs.just("train"), hs.floats(1, 40), hs.floats(0.05, 1.0), hs.booleans()),
    hs.tuples(hs.just("checkpoint")),
    hs.tuples(hs.just("forge"), forgery),
    hs.tuples(hs.just("lose-node")),
    hs.tuples(hs.just("notice"), hs.floats(1, 100), hs.floats(0.05, 1.0), forgery),
    hs.tuples(hs.just("crash"), hs.sampled_from([1, 75, 137]), hs.booleans()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.lists(action, min_size=1, max_size=12))
def test_no_report_sequence_rejects_a_real_ack_or_makes_a_failure_a_preemption(actions: list[tuple[Any, ...]]) -> None:
    w = spot_world(backoff_limit=1000)
    job = make_job(SPEC)
    w.run_to(job, Phase.RUNNING)
    rt = Runtime()
    for act in actions:
        kind = act[0]
        if kind == "train":
            _, seconds, fraction, reported = act
            train(w, rt, seconds, fraction)
            if reported:  # else: the patch was lost (the API server refused it, the watch missed it)
                write(w, rt.annotations())
            w.step(job, seconds=seconds)
        elif kind == "checkpoint":
            rt.checkpoint, rt.checkpoint_at, rt.wrote = rt.step, w.now, True
            write(w, rt.annotations())
            w.step(job)
        elif kind == "forge":
            write(w, act[1])
            w.step(job)
        elif kind == "lose-node":
            w.lose_nodes()
            w.step(job)
            assert w.status.phase is Phase.RECOVERING, w.status.message
            resume_running(w, job, rt)
        elif kind == "notice":
            _, delay, fraction, between = act
            name = next(iter(w.nodes))
            w.nodes[name]["spec"]["taints"] = SPOT_ITN
            w.step(job)
            assert w.status.phase is Phase.CHECKPOINTING and w.status.notice is not None, w.status.message
            rid = w.status.notice.request_id
            write(w, {k: v for k, v in between.items() if k != rc.ANNOTATION_CHECKPOINT_ACK})
            # the runtime sees the request, trains to its next step boundary and answers with a
            # checkpoint there (the loop is not stepped meanwhile: the answer is what it reads next)
            train(w, rt, delay, fraction)
            w.now += timedelta(seconds=delay)
            rt.step += 1
            rt.checkpoint, rt.checkpoint_at, rt.ack, rt.wrote = rt.step, w.now, rid, True
            write(w, rt.annotations())
            reasons = w.step(job)
            assert "Checkpointed" in reasons and "CheckpointMissed" not in reasons, (w.status.message, w.events)
            assert w.status.interruption_history[-1].checkpoint_acked
            resume_running(w, job, rt)
        elif kind == "crash":
            _, code, says_preempted = act
            before = (w.status.failures, w.status.interruptions)
            if says_preempted:
                write(w, {rc.ANNOTATION_RUNTIME_PHASE: rc.RUNTIME_PHASE_PREEMPTED})
            body = writer(w)
            w.phases[body["metadata"]["name"]] = "Failed"
            w.statuses[body["metadata"]["name"]] = {
                "containerStatuses": [{"name": "train", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]
            }
            reasons = w.step(job)
            assert (w.status.failures, w.status.interruptions) == (before[0] + 1, before[1]), w.status.message
            assert "WorkerFailed" in reasons and w.status.phase is Phase.RECOVERING
            w.phases.clear()
            w.statuses.clear()
            resume_running(w, job, rt)
        assert w.status.phase is Phase.RUNNING, (kind, w.status.message)
        # never believed beyond what the runtime could have done since the last believed report
        assert w.status.progress.step <= 20000
