"""KubeReporter: the runtime reports progress by patching its own pod's annotations.

The operator reads these annotations (``gpuscaler.io/progress-*``, ``checkpoint-step``,
``checkpoint-ack``, ``checkpoint-time``; see :meth:`gpuscaler.runtime.progress.Progress.annotations`)
through its pod watch: that is how it knows the progress, and how a checkpoint requested on a spot
notice is acknowledged. The pod's name and namespace come from ``POD_NAME`` and ``POD_NAMESPACE``,
which the operator sets on every worker with the downward API. The Kubernetes client is imported
lazily, so the runtime keeps no hard dependency on it; in the pod it uses the in-cluster config,
elsewhere ``KUBECONFIG`` (the e2e harness plays pods that way). The worker's ServiceAccount needs
``patch`` on ``pods`` in its namespace: the operator's ``gpuscaler-worker`` account has it (it
creates it for templates that name no ServiceAccount; docs/operator.md, "Worker identity"). Where
the Helm chart's admission policy is installed, that account may change only these annotations and
only on the pod its token is bound to, which the in-cluster (kubelet-projected) token is.

Use (both names are exported by :mod:`gpuscaler.runtime`)::

    guard = TrainingGuard.from_env(save=..., load=..., reporter=KubeReporter.from_env())
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from gpuscaler.runtime.progress import CheckpointEvent, Progress

log = logging.getLogger(__name__)

ENV_POD_NAME: Final = "POD_NAME"
"""The worker pod's name (downward API ``metadata.name``), set by the operator."""
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
"""The worker pod's namespace (downward API ``metadata.namespace``), set by the operator."""

Patch = Callable[[str, str, dict[str, Any]], object]
"""``patch(name, namespace, body)``: a strategic-merge patch of the pod (``CoreV1Api.patch_namespaced_pod``)."""


def _core_api() -> Any:
    import kubernetes  # lazy: the runtime must import without it

    k8s: Any = kubernetes
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s.config.load_incluster_config()
    else:
        k8s.config.load_kube_config()
    return k8s.client.CoreV1Api()


class KubeReporter:
    """Patches the pod's annotations with each progress snapshot (the guard rate-limits reports;
    checkpoints are always reported). Failures are logged, never raised: reporting never stops training.

    Args:
        pod: The pod's name.
        namespace: The pod's namespace.
        patch: How to patch the pod (default: a ``CoreV1Api`` from in-cluster config or KUBECONFIG,
            made on first use).
    """

    def __init__(self, pod: str, namespace: str, patch: Patch | None = None) -> None:
        self.pod = pod
        self.namespace = namespace
        self._patch = patch
        self.last: dict[str, str] = {}
        """The annotations last written."""
        self.failures = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KubeReporter | None:
        """A reporter for the pod named by ``POD_NAME``/``POD_NAMESPACE``; None outside a pod."""
        env = os.environ if env is None else env
        pod, ns = env.get(ENV_POD_NAME, "").strip(), env.get(ENV_POD_NAMESPACE, "").strip()
        if not pod or not ns:
            log.info("no %s/%s: progress is not reported to the pod", ENV_POD_NAME, ENV_POD_NAMESPACE)
            return None
        return cls(pod, ns)

    def _send(self, annotations: dict[str, str]) -> None:
        changed = {k: v for k, v in annotations.items() if self.last.get(k) != v}
        if not changed:
            return
        try:
            if self._patch is None:
                self._patch = _core_api().patch_namespaced_pod
            self._patch(self.pod, self.namespace, {"metadata": {"annotations": changed}})
            self.last.update(changed)
        except Exception as err:
            self.failures += 1
            log.warning("patching pod %s/%s annotations failed: %s", self.namespace, self.pod, err)

    def report(self, progress: Progress) -> None:
        """Write the snapshot's annotations (only those that changed).

        Args:
            progress: The current snapshot.
        """
        self._send(progress.annotations())

    def checkpointed(self, event: CheckpointEvent, progress: Progress) -> None:
        """Write the annotations after a checkpoint (with ``checkpoint-ack`` when it answered a request).

        Args:
            event: The checkpoint.
            progress: The snapshot after it.
        """
        self._send(progress.annotations())
