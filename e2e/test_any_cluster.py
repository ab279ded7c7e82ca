"""The existing-cluster plumbing (:mod:`any_cluster`) on the real API server.

Each test looks at the session's cluster the way a run with ``GPUSCALER_E2E_KUBECONFIG`` does (an
:class:`E2ECluster` without a private cluster, with a session id of its own), so the probes,
the refusal to replace a cluster's own CRDs and the end-of-session sweep are tested in every run,
on the private dev cluster as well as on an existing one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import any_cluster
import kind_manifest_helpers
import operator_helpers
from e2e_helpers import E2ECluster
from gpuscaler.cloud import JOB_LABEL, job_label_value
from gpuscaler.devcluster import chart
from gpuscaler.names import FINALIZER

stage_crd = kind_manifest_helpers.stage_crd

"""kwok's Stage CRD, installed for the test if the cluster lacks it."""


@pytest.fixture
def existing(dev_cluster: E2ECluster) -> E2ECluster:
    """The session's cluster seen as an existing one, with a session id of its own."""
    return E2ECluster(
        dev_cluster.kubeconfig, dev_cluster.api, dev_cluster.env, dev_cluster.binaries,
        session=any_cluster.new_session_id(),
    )


def crd_body(plural: str) -> dict[str, Any]:
    """A minimal namespaced CRD ``<plural>.e2e.gpuscaler.io``."""
    group = "e2e.gpuscaler.io"
    kind = plural.capitalize().rstrip("s")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


@pytest.fixture
def crds(dev_cluster: E2ECluster) -> Iterator[list[str]]:
    """Names for test CRDs; whichever of them exist afterwards are deleted."""
    names: list[str] = []
    yield names
    ext: Any = client.ApiextensionsV1Api(dev_cluster.api)
    for name in names:
        try:
            ext.delete_custom_resource_definition(name)
        except ApiException as err:
            if err.status != 404:
                raise


def test_namespace_fixture_labels_the_session(dev_cluster: E2ECluster, core: Any, namespace: str) -> None:
    labels = core.read_namespace(namespace).metadata.labels
    assert labels[any_cluster.SESSION_LABEL] == dev_cluster.session
    assert labels[any_cluster.E2E_LABEL] == "true"
    assert namespace in any_cluster.session_namespaces(dev_cluster)


def test_kwok_probe_finds_kwok_and_leaves_no_probe_node(existing: E2ECluster, kwok: None, core: Any) -> None:
    assert any_cluster.missing(existing, "kwok") is None
    assert existing.missing == {"kwok": None}  # probed once, remembered for the session
    assert not core.list_node(label_selector=f"{any_cluster.SESSION_LABEL}={existing.session}").items


def test_kwok_probe_says_why_when_no_kwok_plays_the_node(existing: E2ECluster, core: Any) -> None:
    """A node no kwok manages (another annotation value) never turns Ready: the reason says so."""
    reason = any_cluster.probe_kwok(existing, timeout=3, annotation_value="not-managed-here")
    assert reason is not None
    assert reason.startswith("needs kwok: a Node annotated kwok.x-k8s.io/node=fake did not turn Ready in 3s")
    assert not core.list_node(label_selector=f"{any_cluster.SESSION_LABEL}={existing.session}").items


def test_private_control_plane_is_missing_on_an_existing_cluster(existing: E2ECluster, dev_cluster: E2ECluster) -> None:
    reason = any_cluster.missing(existing, "private")
    assert reason is not None and any_cluster.KUBECONFIG_ENV in reason
    assert (any_cluster.missing(dev_cluster, "private") is None) == (dev_cluster.cluster is not None)
    with pytest.raises(pytest.skip.Exception, match="restarts the control plane"):
        any_cluster.require(existing, "private")
    with pytest.raises(ValueError, match="unknown capability"):
        any_cluster.missing(existing, "gpus")


def test_a_crd_the_cluster_has_of_its_own_is_never_replaced(existing: E2ECluster, crds: list[str]) -> None:
    ext: Any = client.ApiextensionsV1Api(existing.api)
    theirs = crd_body(f"widgets{uuid.uuid4().hex[:4]}")
    crds.append(theirs["metadata"]["name"])
    ext.create_custom_resource_definition(theirs)
    with pytest.raises(pytest.skip.Exception, match=r"has its own CRD widgets.* \(not installed by this suite\): not replacing it"):
        any_cluster.claim_crds(existing, [crd_body(theirs["metadata"]["name"].split(".")[0])])
    assert existing.created_crds == []
    ours = crd_body(f"gadgets{uuid.uuid4().hex[:4]}")
    any_cluster.claim_crds(existing, [ours])
    assert ours["metadata"]["labels"] == {any_cluster.MANAGED_BY_LABEL: any_cluster.MANAGED_BY}
    assert existing.created_crds == [ours["metadata"]["name"]]


def test_kwok_stages_are_installed_where_kwok_reads_stage_objects(existing: E2ECluster, stage_crd: None) -> None:
    custom: Any = client.CustomObjectsApi(existing.api)
    names = [d["metadata"]["name"] for d in any_cluster.stage_documents()]
    before = {
        s["metadata"]["name"]
        for s in custom.list_cluster_custom_object(
            any_cluster.STAGE_GROUP, any_cluster.STAGE_VERSION, any_cluster.STAGE_PLURAL
        )["items"]
    }
    created = any_cluster.install_kwok_stages(existing)
    assert sorted(created) == sorted(set(names) - before)  # what was there is left as it was
    assert any_cluster.install_kwok_stages(existing) == []
    for name in created:
        stage = custom.get_cluster_custom_object(
            any_cluster.STAGE_GROUP, any_cluster.STAGE_VERSION, any_cluster.STAGE_PLURAL, name
        )
        assert stage["metadata"]["labels"][any_cluster.MANAGED_BY_LABEL] == any_cluster.MANAGED_BY
    removed = any_cluster.sweep(existing, timeout=30)
    assert sorted(removed) == sorted(f"stage/{n}" for n in created)
    after = {
        s["metadata"]["name"]
        for s in custom.list_cluster_custom_object(
            any_cluster.STAGE_GROUP, any_cluster.STAGE_VERSION, any_cluster.STAGE_PLURAL
        )["items"]
    }
    assert after == before


def test_sweep_removes_what_a_failed_test_left_and_nothing_else(
    existing: E2ECluster, core: Any, crd: None, namespace: str, crds: list[str]
) -> None:
    """A test that died before its teardown left a namespace with a finalized TrainingJob (its
    operator gone), the job's node, a Helm release's ClusterRole and a CRD; the sweep removes
    those, and not what belongs to a namespace outside the swept session."""
    left = f"left-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": left, "labels": {any_cluster.SESSION_LABEL: existing.session}}})
    job = operator_helpers.job_manifest("stuck")
    job["metadata"]["finalizers"] = [FINALIZER]
    custom: Any = client.CustomObjectsApi(existing.api)
    custom.create_namespaced_custom_object(operator_helpers.GROUP, operator_helpers.VERSION, left, operator_helpers.PLURAL, job)
    nodes, roles = {}, {}
    rbac: Any = client.RbacAuthorizationV1Api(existing.api)
    for ns in (left, namespace):  # the second belongs to this test, not to the swept session
        name = f"sweep-{uuid.uuid4().hex[:5]}"
        core.create_node({"metadata": {"name": name, "labels": {JOB_LABEL: job_label_value(ns, "stuck")}}})
        nodes[ns] = name
        annotations = {any_cluster.HELM_RELEASE_NAMESPACE: ns}
        rbac.create_cluster_role({"metadata": {"name": name, "annotations": annotations}, "rules": []})
        roles[ns] = name
    expected = []
    if chart.serves_mutating_policies(existing.env):  # the chart's finalizer policy binding (Kubernetes >= 1.36)
        binding = f"sweep-{uuid.uuid4().hex[:5]}"
        annotations = {any_cluster.HELM_RELEASE_NAMESPACE: left}
        body = {"metadata": {"name": binding, "annotations": annotations}, "spec": {"policyName": "gone"}}
        client.AdmissionregistrationV1Api(existing.api).create_mutating_admission_policy_binding(body)
        expected.append(f"mutatingadmissionpolicybinding/{binding}")
    gadgets = crd_body(f"gadgets{uuid.uuid4().hex[:4]}")
    crds.append(gadgets["metadata"]["name"])
    any_cluster.claim_crds(existing, [gadgets])
    ext: Any = client.ApiextensionsV1Api(existing.api)
    ext.create_custom_resource_definition(gadgets)
    try:
        removed = any_cluster.sweep(existing, timeout=90)
        assert sorted(removed) == sorted(
            [
                f"node/{nodes[left]}",
                f"namespace/{left}",
                f"clusterrole/{roles[left]}",
                f"crd/{gadgets['metadata']['name']}",
                *expected,
            ]
        )
        assert not any_cluster.session_namespaces(existing)  # waited for: gone, not just Terminating
        with pytest.raises(ApiException) as err:
            core.read_node(nodes[left])
        assert err.value.status == 404
        assert core.read_node(nodes[namespace]).metadata.name == nodes[namespace]
        assert rbac.read_cluster_role(roles[namespace]).metadata.name == roles[namespace]
        names = {c.metadata.name for c in ext.list_custom_resource_definition().items}
        assert gadgets["metadata"]["name"] not in names
    finally:
        core.delete_node(nodes[namespace])
        rbac.delete_cluster_role(roles[namespace])
        any_cluster.sweep(existing, timeout=30)  # again, should an assertion above have failed
