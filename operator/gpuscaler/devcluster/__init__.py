"""A real Kubernetes control plane on loopback with fake (kwok) GPU nodes, for tests and demos.

``etcd``, ``kube-apiserver``, ``kube-scheduler`` and ``kube-controller-manager`` run as local
processes (what controller-runtime's envtest does) and ``kwok`` plays the kubelet for fake GPU
nodes created by :mod:`gpuscaler.devcluster.nodes`. Binaries are built once from their Go modules
and cached outside the repo (:mod:`gpuscaler.devcluster.build`); the cluster itself lives in
:mod:`gpuscaler.devcluster.cluster`. CLI: ``python -m gpuscaler.devcluster up|down|env|build``.
"""

from __future__ import annotations

from gpuscaler.devcluster.build import Binaries, BuildError, MissingBinariesError, ensure_all, find_binaries
from gpuscaler.devcluster.versions import ETCD_VERSION, KUBERNETES_VERSION, KWOK_VERSION

__all__ = [
    "ETCD_VERSION",
    "KUBERNETES_VERSION",
    "KWOK_VERSION",
    "Binaries",
    "BuildError",
    "MissingBinariesError",
    "ensure_all",
    "find_binaries",
]
