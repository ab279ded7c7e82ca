"""The gang of a ``runtime: jobset`` TrainingJob as one JobSet (jobset.x-k8s.io/v1alpha2).

One replicated job (``workers``) whose Job is Indexed with ``parallelism = completions = nodes``:
one pod per node, the same pod as :func:`gpuscaler.kube.workers.worker_pod` builds for
``runtime: pods`` (env, ``nvidia.com/gpu`` requests, node selector, tolerations, downward-API
volume, worker ServiceAccount), except what the JobSet and Job controllers give each pod:

- its rank is the Job's completion index: ``NODE_RANK`` comes from the pod's
  ``batch.kubernetes.io/job-completion-index`` annotation (downward API), and
  :func:`gpuscaler.kube.workers.pod_state` reads the rank from the label of the same name;
- its DNS name is ``<jobset>-workers-0-<index>.<jobset>`` through the headless Service the JobSet
  controller creates (``network.subdomain``), so ``MASTER_ADDR`` is index 0's.

Failures and preemptions are told apart in two places. The Job's ``podFailurePolicy`` ignores a
pod that ends with the ``DisruptionTarget`` condition (evicted, preempted, node shutting down) or
with exit code :data:`gpuscaler.runtime.constants.EXIT_PREEMPTED` (the runtime checkpointed on a
notice and stopped): those do not count as failures. A main container that exits with any other
non-zero code fails the Job at once (reason ``PodFailurePolicy``), and the JobSet's
``failurePolicy`` rule ``TrainingFailed`` fails the whole JobSet for it: the operator then counts
one worker failure. Any other Job failure (the back-off limit spent on pods that failed without
an exit code of their own) restarts the gang, at most ``maxRestarts`` times.

A JobSet's shape cannot change in place: after a re-plan the operator deletes the JobSet (the
foreground deletion takes its Jobs and pods) and creates the new one under the next attempt's
name (:func:`jobset_name`). With a queue, the JobSet carries ``kueue.x-k8s.io/queue-name`` and
starts suspended; Kueue admits it as one Workload and un-suspends it.

Pure functions; the caller sends the manifests.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from gpuscaler.kube import workers as w
from gpuscaler.names import ATTEMPT_LABEL, COMPLETION_INDEX_LABEL, JOB_LABEL, QUEUE_NAME_LABEL, RANK_LABEL
from gpuscaler.runtime import constants as rc

GROUP: Final = "jobset.x-k8s.io"
VERSION: Final = "v1alpha2"
PLURAL: Final = "jobsets"
KIND: Final = "JobSet"
REPLICATED_JOB: Final = "workers"
"""The one replicated job of the gang."""
FAILED_RULE: Final = "TrainingFailed"
"""The failurePolicy rule that fails the JobSet when the training code failed."""
MAX_NAME: Final = 40
"""Longest JobSet name used: the JobSet webhook refuses names whose Job and pod names (with
``-workers-0-<index>-<suffix>``) would pass 63 characters."""


def jobset_name(job_name: str, attempt: int) -> str:
    """The JobSet of one gang start: ``<job>-a<attempt>`` (a DNS-1035 label of at most 40 characters).

    A new attempt (a re-plan after an interruption) gets a new name, so the old JobSet can still be
    going away in the background while the new one is created.
    """
    suffix = f"-a{attempt}"
    base = w.service_name(job_name).removesuffix("-workers")[: MAX_NAME - len(suffix)].rstrip("-")
    return f"{base}{suffix}"


def master_addr(plan: w.WorkerPlan) -> str:
    """DNS name of index 0 of the JobSet's worker Job through the JobSet's headless Service."""
    name = jobset_name(plan.job_name, plan.attempt)
    return f"{name}-{REPLICATED_JOB}-0-0.{name}.{plan.namespace}.svc"


def _env(plan: w.WorkerPlan, env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rank_from_index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_LABEL}']"}}
    out: list[dict[str, Any]] = []
    for e in env:
        if e.get("name") == "NODE_RANK":
            out.append({"name": "NODE_RANK", "valueFrom": rank_from_index})
        elif e.get("name") == "MASTER_ADDR":
            out.append({"name": "MASTER_ADDR", "value": master_addr(plan)})
        else:
            out.append(e)
    return out


def pod_template(plan: w.WorkerPlan) -> dict[str, Any]:
    """The worker pod template of the JobSet: :func:`~gpuscaler.kube.workers.worker_pod` of rank 0
    without what makes a pod one rank (its name, rank label, hostname), and the rank from the index."""
    pod = w.worker_pod(plan, 0)
    meta = pod["metadata"]
    labels = {k: v for k, v in meta["labels"].items() if k != RANK_LABEL}
    spec = copy.deepcopy(pod["spec"])
    spec.pop("hostname", None)
    spec.pop("subdomain", None)  # the JobSet controller sets it to network.subdomain
    main = spec["containers"][0]
    main["env"] = _env(plan, main["env"])
    return {"metadata": {"labels": labels, "annotations": meta["annotations"]}, "spec": spec}


def jobset(
    plan: w.WorkerPlan, *, queue: str | None = None, max_restarts: int = 3, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The JobSet of one gang start.

    Args:
        plan: what every worker gets (as for ``runtime: pods``).
        queue: the Kueue LocalQueue; the JobSet is then created suspended, for Kueue to admit.
        max_restarts: gang restarts the JobSet controller may do on failures that are not the
            training code's (pods lost without an exit code of their own).
        labels: more labels of the JobSet (the TrainingJob's ``kueue.x-k8s.io/`` ones, such as
            ``kueue.x-k8s.io/priority-class``); gpuscaler's own and the queue label win.

    Returns:
        The JobSet manifest, owned by the TrainingJob.
    """
    template = pod_template(plan)
    main = template["spec"]["containers"][0]["name"]
    nodes = max(plan.nodes, 1)
    job_spec = {
        "parallelism": nodes,
        "completions": nodes,
        "completionMode": "Indexed",
        "backoffLimit": max(nodes, 1) * (max_restarts + 1),
        "podFailurePolicy": {
            "rules": [
                {"action": "Ignore", "onPodConditions": [{"type": w.DISRUPTION_TARGET, "status": "True"}]},
                {
                    "action": "Ignore",
                    "onExitCodes": {"containerName": main, "operator": "In", "values": [rc.EXIT_PREEMPTED]},
                },
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": main,
                        "operator": "NotIn",
                        "values": [rc.EXIT_DONE, rc.EXIT_PREEMPTED],
                    },
                },
            ]
        },
        "template": template,
    }
    labels = {**(labels or {}), JOB_LABEL: plan.job_label, ATTEMPT_LABEL: str(plan.attempt), **w.MANAGED_BY}
    if queue:
        labels[QUEUE_NAME_LABEL] = queue
    name = jobset_name(plan.job_name, plan.attempt)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": plan.namespace,
            "labels": labels,
            "ownerReferences": [plan.owner],
        },
        "spec": {
            "suspend": bool(queue),
            "network": {"enableDNSHostnames": True, "subdomain": name, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [REPLICATED_JOB]},
            "failurePolicy": {
                "maxRestarts": max_restarts,
                "restartStrategy": "Recreate",
                "rules": [
                    {
                        "name": FAILED_RULE,
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                        "targetReplicatedJobs": [REPLICATED_JOB],
                    }
                ],
            },
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job_spec}}],
        },
    }


def jobset_phase(body: dict[str, Any]) -> str:
    """``Completed``, ``Failed``, ``Suspended`` or ``Active`` from a JobSet's status conditions."""
    status = body.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conditions.get("Completed") == "True":
        return "Completed"
    if conditions.get("Failed") == "True":
        return "Failed"
    if (body.get("spec") or {}).get("suspend") or conditions.get("Suspended") == "True":
        return "Suspended"
    return "Active"
