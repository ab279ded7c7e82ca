"""The pure helpers of benchmarks/operator_scale.py: reading API-server counters and subtracting phases."""

from __future__ import annotations

from types import ModuleType

import repo_scripts


def _bench() -> ModuleType:
    return repo_scripts.load("benchmarks/operator_scale.py", "operator_scale_bench")


METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="gpuscaler.io",resource="trainingjobs",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="gpuscaler.io",resource="trainingjobs",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 1
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="binding",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 2
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 9
# HELP apiserver_flowcontrol_dispatched_requests_total [BETA] Number of requests executed.
# TYPE apiserver_flowcontrol_dispatched_requests_total counter
apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",priority_level="exempt"} 40
apiserver_flowcontrol_dispatched_requests_total{flow_schema="kube-scheduler",priority_level="workload-high"} 3
# HELP gpuscaler_planner_latency_seconds Duration of one planner call.
# TYPE gpuscaler_planner_latency_seconds histogram
gpuscaler_planner_latency_seconds_bucket{le="0.001"} 0.0
gpuscaler_planner_latency_seconds_bucket{le="+Inf"} 5.0
gpuscaler_planner_latency_seconds_count 5.0
gpuscaler_planner_latency_seconds_sum 0.25
"""


def test_requests_by_verb_resource_sums_codes_and_skips_non_resource() -> None:
    b = _bench()
    got = b.requests_by_verb_resource(METRICS)
    assert got == {
        ("PATCH", "trainingjobs.gpuscaler.io/status"): 8,
        ("POST", "pods/binding"): 3,
        ("LIST", "nodes"): 2,
    }
    assert got[b.STATUS_WRITE] == 8


def test_flow_schemas_histogram_totals_and_delta() -> None:
    b = _bench()
    assert b.by_label(METRICS, b.FLOWS, "flow_schema") == {"exempt": 40, "kube-scheduler": 3}
    assert b.total(METRICS, "gpuscaler_planner_latency_seconds_count") == 5
    assert b.total(METRICS, "gpuscaler_planner_latency_seconds_sum") == 0.25
    assert b.total("", "gpuscaler_planner_latency_seconds_count") == 0
    assert b.delta({"a": 5, "b": 2, "c": 1}, {"a": 2, "b": 2, "d": 1}) == {"a": 3, "c": 1, "d": -1}


def test_quantile_nearest_rank() -> None:
    b = _bench()
    values = [float(i) for i in range(1, 101)]
    assert b.quantile(values, 0.95) == 96.0
    assert b.quantile([3.0], 0.95) == 3.0


def test_the_target_line_is_the_apply_against_the_ideal_baselines_and_the_p95() -> None:
    b = _bench()
    assert b.verdict(36.0, 24.0, 4.0) == (
        "apply with operator 36.0 s = 1.50 x the ideal baseline's 24.0 s (target <= 1.5x); p95 4.0 s (target <= 10 s): met"
    )
    assert b.verdict(52.9, 24.7, 3.9).startswith("apply with operator 52.9 s = 2.14 x the ideal baseline's 24.7 s")
    assert b.verdict(52.9, 24.7, 3.9).endswith(": NOT met")
    assert b.verdict(30.0, 24.0, 10.5).endswith("p95 10.5 s (target <= 10 s): NOT met")
    assert "= inf x" in b.verdict(30.0, 0.0, 1.0)


def test_failed_requests_only_counts_codes_from_400() -> None:
    b = _bench()
    assert b.requests_by_verb_resource(METRICS, failed=True) == {
        ("PATCH", "trainingjobs.gpuscaler.io/status"): 1
    }


def test_rss_reads_peak_and_current_and_nan_for_a_process_that_is_gone() -> None:
    import math
    import os

    b = _bench()
    peak, now = b.rss_mib(os.getpid()), b.rss_mib(os.getpid(), "VmRSS")
    assert 0 < now <= peak
    assert math.isnan(b.rss_mib(2**22 + 12345))  # above the default pid_max: no such process


def _audit(verb: str, stage: str, user: str, agent: str, resource: str = "pods", **ref: str) -> str:
    import json

    return json.dumps(
        {
            "stage": stage,
            "verb": verb,
            "user": {"username": user},
            "userAgent": agent,
            "objectRef": {"resource": resource, **ref} if resource else {},
            "responseStatus": {"code": int(ref.pop("code", "200")) if "code" in ref else 200},
            "requestReceivedTimestamp": "2026-12-01T16:00:10.500000Z",
        }
    )


def test_audit_clients_are_told_apart_by_user_and_agent() -> None:
    b = _bench()
    who = lambda user, agent: b.audit_client({"user": {"username": user}, "userAgent": agent})  # noqa: E731
    assert who("kubernetes-admin", "gpuscaler-operator/0.1.0") == "operator"
    assert who("system:serviceaccount:gpuscaler:gpuscaler", "kopf/1.37") == "operator"
    assert who("kubernetes-admin", "gpuscaler-benchmark") == "benchmark"
    assert who("system:serviceaccount:kube-system:node-controller", "kube-controller-manager/v1.32") == "kcm/node-controller"
    assert who("system:kube-scheduler", "kube-scheduler/v1.32") == "scheduler"
    assert who("kwok-controller", "kwok/v0.6.1 (linux/amd64)") == "kwok"
    assert who("kubernetes-admin", "kubectl/v1.32.0 (linux/amd64)") == "kubectl"
    assert who("someone", "curl/8.0") == "curl"


def test_audit_counts_each_request_once_in_the_window() -> None:
    from datetime import datetime

    b = _bench()
    t = datetime.fromisoformat("2026-12-01T16:00:10.500000+00:00").timestamp()
    lines = [
        _audit("create", "ResponseComplete", "admin", "gpuscaler-operator/0.1.0", "nodes"),
        _audit("patch", "ResponseComplete", "admin", "kopf/1.37", "trainingjobs", apiGroup="gpuscaler.io", subresource="status"),
        _audit("watch", "ResponseStarted", "admin", "kopf/1.37", "pods"),
        _audit("watch", "ResponseComplete", "admin", "kopf/1.37", "pods"),  # the same watch ending
        _audit("get", "ResponseComplete", "admin", "kubectl/v1.32", "", code="200"),  # non-resource
        _audit("patch", "ResponseComplete", "system:serviceaccount:kube-system:node-controller", "kcm", "nodes", code="409"),
        "",
    ]
    counts, failed = b.audit_counts(lines, t - 1, t + 1)
    assert counts == {
        ("operator", "POST", "nodes"): 1,
        ("operator", "PATCH", "trainingjobs.gpuscaler.io/status"): 1,
        ("operator", "WATCH", "pods"): 1,
        ("kcm/node-controller", "PATCH", "nodes"): 1,
    }
    assert failed == {("kcm/node-controller", "PATCH", "nodes"): 1}
    assert b.audit_counts(lines, t + 1, t + 2) == ({}, {})
