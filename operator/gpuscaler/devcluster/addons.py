"""Kueue and JobSet controllers in the dev cluster, built from their Go modules (``--with kueue,jobset``).

Each add-on is the project's real controller binary (cached by :mod:`gpuscaler.devcluster.build`
with the CRDs and webhook configurations of its module at the same version under
``manifests/``), run as one more local process of the cluster. What a Deployment of it would get
from kustomize and cert-manager is done here instead:

- its CRDs are created from ``config/components/crd/bases``, with the conversion webhooks the
  module's ``crd/kustomization.yaml`` enables (Kueue serves v1beta1 and v1beta2);
- its webhook server listens on a free loopback port with a serving cert signed by the cluster CA
  (:func:`gpuscaler.devcluster.certs.webhook_serving_cert`); the webhook configurations of
  ``config/components/webhook/manifests.yaml``, patched as the module's kustomization patches them
  (namespace and object selectors), point at ``https://127.0.0.1:<port><path>`` with that CA as
  ``caBundle``. They are created once the controller is ready, and the start waits until a
  server-side dry run of one of its objects passes its webhooks;
- its own certificate management and leader election are off; it talks to the API server with the
  admin kubeconfig.

Kueue v0.17 without its own cert management loads a metrics serving cert from the fixed path
``/etc/kueue/metrics/certs`` (``cmd/kueue/main.go``) and exits when it is missing, even with its
metrics server off (``metrics.bindAddress: "0"``, as here). :func:`ensure_kueue_metrics_cert`
puts a pair signed by the dev cluster's CA there when none is there yet; it is loaded, never
served. A machine where that directory cannot be written cannot run the Kueue add-on.

Kueue manages the ``batch/job``, ``jobset.x-k8s.io/jobset`` and ``pod`` integrations (the ones
gpuscaler submits), only for objects that name a queue (``manageJobsWithoutQueueName`` false), and
not in ``kube-system`` or ``kueue-system``. Its on-demand visibility API server (an aggregated API
needing an APIService) is off.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpuscaler.devcluster import certs
from gpuscaler.devcluster.build import MANIFESTS_DIR
from gpuscaler.errors import InvalidInputError, TemporaryError

if TYPE_CHECKING:
    from gpuscaler.devcluster.cluster import Cluster

WEBHOOK_DIR = "config/components/webhook"
CRD_DIR = "config/components/crd"

KUEUE_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset", "pod")
"""Kueue integrations enabled in the dev cluster (Kueue's ``integrations.frameworks``)."""

KUEUE_NAMESPACE = "kueue-system"
JOBSET_NAMESPACE = "jobset-system"


class AddonError(TemporaryError, RuntimeError):
    """An add-on could not be started (the message carries its log tail)."""


class UnknownAddonError(InvalidInputError, AddonError):
    """An add-on name that is not one of :data:`ADDON_SPECS`, or one that is not built."""


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one add-on process."""

    webhook: int
    health: int

    def manager_config(self, cert_dir: Path) -> dict[str, Any]:
        """What a controller-runtime manager's ``Configuration`` says of these ports, the same for
        every add-on: health and webhook on the loopback, the webhook cert from ``cert_dir``, no
        metrics server, no leader election and no cert management of its own."""
        return {
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": self.webhook, "host": "127.0.0.1", "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
        }

    @property
    def webhook_url(self) -> str:
        """The base URL of its webhook server (TLS on the loopback)."""
        return f"https://127.0.0.1:{self.webhook}"


@dataclass(frozen=True)
class Addon:
    """How one add-on is configured and started."""

    name: str
    namespace: str
    name_prefix: str
    """What kustomize prefixes to its cluster-scoped objects (``kueue-``, ``jobset-``)."""
    config: Callable[[Ports, Path], str]
    """The controller's ``--config`` file for its ports and webhook cert dir."""
    args: tuple[str, ...]
    probe: Callable[[Any, str], None]
    """A server-side dry run through the add-on's webhooks (raises until they answer)."""


def kueue_config(ports: Ports, cert_dir: Path) -> str:
    """Kueue's ``Configuration`` (config.kueue.x-k8s.io/v1beta2) for the dev cluster."""
    doc = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        **ports.manager_config(cert_dir),
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def jobset_config(ports: Ports, cert_dir: Path) -> str:
    """JobSet's ``Configuration`` (config.jobset.x-k8s.io/v1alpha1) for the dev cluster."""
    doc = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        **ports.manager_config(cert_dir),
    }
    return yaml.safe_dump(doc, sort_keys=False)


KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
"""Where Kueue v0.17 reads its metrics cert when its internal cert management is off (fixed in its main.go)."""


def ensure_kueue_metrics_cert(ca: certs.CertPair, directory: Path = KUEUE_METRICS_CERT_DIR) -> None:
    """Put a cert pair where Kueue loads its metrics cert, unless one is there (see the module docstring).

    Raises:
        AddonError: the directory cannot be written (Kueue would exit at start).
    """
    if (directory / "tls.crt").exists() and (directory / "tls.key").exists():
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".gpuscaler-", dir=directory))
        pair = certs.webhook_serving_cert(tmp, ca, "kueue-metrics")
        os.replace(pair.key, directory / "tls.key")
        os.replace(pair.cert, directory / "tls.crt")
        tmp.rmdir()
    except OSError as err:
        raise AddonError(
            f"Kueue v0.17 needs a cert pair in {directory} (read at start even with metrics off) and it "
            f"cannot be written here ({err}); create tls.crt and tls.key there (any valid pair) and retry"
        ) from err


def _probe_kueue(api: Any, namespace: str) -> None:
    from kubernetes import client

    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "gpuscaler-dev-cluster-probe"},
    }
    client.CustomObjectsApi(api).create_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "resourceflavors", body, dry_run="All"
    )


def _probe_jobset(api: Any, namespace: str) -> None:
    from kubernetes import client

    pod = {"containers": [{"name": "c", "image": "busybox"}], "restartPolicy": "Never"}
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "gpuscaler-dev-cluster-probe"},
        "spec": {
            "replicatedJobs": [
                {"name": "w", "replicas": 1, "template": {"spec": {"template": {"spec": pod}}}}
            ]
        },
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", body, dry_run="All"
    )


ADDON_SPECS: dict[str, Addon] = {
    "jobset": Addon(
        "jobset", JOBSET_NAMESPACE, "jobset-", jobset_config, ("--zap-log-level=info",), _probe_jobset
    ),
    "kueue": Addon(
        "kueue",
        KUEUE_NAMESPACE,
        "kueue-",
        kueue_config,
        ("--feature-gates=VisibilityOnDemand=false", "--zap-log-level=2"),
        _probe_kueue,
    ),
}
"""Start order: JobSet first, so Kueue finds the JobSet CRD when it sets up that integration."""


# --------------------------------------------------------------------------------------------
# manifests of a module, adapted to loopback webhooks


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _client_config(service_cfg: dict[str, Any], base_url: str, ca_bundle: str) -> dict[str, Any]:
    path = service_cfg.get("service", {}).get("path", "")
    return {"url": f"{base_url}{path}", "caBundle": ca_bundle}


def crds(manifests: Path, base_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """The module's CRDs, with the conversion webhooks its kustomization enables pointed at ``base_url``.

    Args:
        manifests: the add-on's ``manifests/`` directory in the cache.
        base_url: ``https://127.0.0.1:<webhook port>``.
        ca_bundle: base64 PEM of the CA that signed the webhook server's cert.

    Returns:
        CustomResourceDefinition bodies, ready to create.
    """
    out = {d["metadata"]["name"]: d for f in sorted((manifests / CRD_DIR / "bases").glob("*.yaml")) for d in _docs(f)}
    kustomization = manifests / CRD_DIR / "kustomization.yaml"
    if kustomization.exists():
        patches = (yaml.safe_load(kustomization.read_text()) or {}).get("patches") or []
        for entry in patches:
            path = manifests / CRD_DIR / str(entry.get("path", ""))
            if not path.name.startswith("webhook_in_") or not path.exists():
                continue
            for patch in _docs(path):
                crd = out.get(patch["metadata"]["name"])
                conversion = copy.deepcopy(patch.get("spec", {}).get("conversion"))
                if crd is None or not conversion:
                    continue
                webhook = conversion["webhook"]
                webhook["clientConfig"] = _client_config(webhook["clientConfig"], base_url, ca_bundle)
                crd["spec"]["conversion"] = conversion
    return list(out.values())


def _apply_patch(doc: dict[str, Any], entry: dict[str, Any], webhook_dir: Path) -> None:
    """One kustomization ``patches`` entry: an inline strategic merge by webhook name, or a JSON 6902
    file of ``replace`` ops on ``/webhooks/<i>`` for a target kind and name."""
    if "patch" in entry:
        patch = yaml.safe_load(entry["patch"])
        if patch.get("kind") != doc["kind"] or patch["metadata"]["name"] != doc["metadata"]["name"]:
            return
        by_name = {w["name"]: w for w in doc["webhooks"]}
        for wp in patch.get("webhooks") or []:
            if wp["name"] in by_name:
                by_name[wp["name"]].update({k: v for k, v in wp.items() if k != "name"})
        return
    target = entry.get("target") or {}
    if target.get("kind") != doc["kind"] or target.get("name", doc["metadata"]["name"]) != doc["metadata"]["name"]:
        return
    for op in yaml.safe_load((webhook_dir / entry["path"]).read_text()) or []:
        parts = str(op["path"]).strip("/").split("/")
        if op.get("op") != "replace" or len(parts) != 2 or parts[0] != "webhooks":
            raise AddonError(f"{entry['path']}: unsupported patch op {op.get('op')} {op['path']}")
        doc["webhooks"][int(parts[1])] = op["value"]


def webhook_configurations(manifests: Path, prefix: str, base_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """The module's (Mutating|Validating)WebhookConfigurations, patched as its kustomization does,
    named with ``prefix`` and pointed at ``base_url`` with ``ca_bundle``.

    Args:
        manifests: the add-on's ``manifests/`` directory in the cache.
        prefix: kustomize's ``namePrefix`` of the add-on (``kueue-``).
        base_url: ``https://127.0.0.1:<webhook port>``.
        ca_bundle: base64 PEM of the CA that signed the webhook server's cert.

    Returns:
        Webhook configuration bodies, ready to create.
    """
    webhook_dir = manifests / WEBHOOK_DIR
    docs = _docs(webhook_dir / "manifests.yaml")
    kustomization = webhook_dir / "kustomization.yaml"
    patches = (yaml.safe_load(kustomization.read_text()) or {}).get("patches") or [] if kustomization.exists() else []
    for doc in docs:
        for entry in patches:
            _apply_patch(doc, entry, webhook_dir)
        doc["metadata"] = {"name": prefix + doc["metadata"]["name"]}
        for w in doc["webhooks"]:
            w["clientConfig"] = _client_config(w["clientConfig"], base_url, ca_bundle)
    return docs


# --------------------------------------------------------------------------------------------
# installing and starting


def _create_or_replace(create: Callable[[], Any], replace: Callable[[str], Any], read: Callable[[], Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        create()
    except ApiException as err:
        if err.status != 409:
            raise
        replace(read().metadata.resource_version)


def _install_crds(api: Any, bodies: list[dict[str, Any]]) -> None:
    from kubernetes import client

    ext: Any = client.ApiextensionsV1Api(api)
    for body in bodies:
        name = body["metadata"]["name"]

        def replace(rv: str, body: dict[str, Any] = body, name: str = name) -> Any:
            return ext.replace_custom_resource_definition(name, {**body, "metadata": {**body["metadata"], "resourceVersion": rv}})

        _create_or_replace(
            lambda body=body: ext.create_custom_resource_definition(body),  # type: ignore[misc]
            replace,
            lambda name=name: ext.read_custom_resource_definition(name),  # type: ignore[misc]
        )


def _install_webhooks(api: Any, bodies: list[dict[str, Any]]) -> None:
    from kubernetes import client

    adm: Any = client.AdmissionregistrationV1Api(api)
    for body in bodies:
        name = body["metadata"]["name"]
        mutating = body["kind"] == "MutatingWebhookConfiguration"
        create = adm.create_mutating_webhook_configuration if mutating else adm.create_validating_webhook_configuration
        replace = adm.replace_mutating_webhook_configuration if mutating else adm.replace_validating_webhook_configuration
        read = adm.read_mutating_webhook_configuration if mutating else adm.read_validating_webhook_configuration
        _create_or_replace(
            lambda create=create, body=body: create(body),  # type: ignore[misc]
            lambda rv, replace=replace, body=body, name=name: replace(  # type: ignore[misc]
                name, {**body, "metadata": {"name": name, "resourceVersion": rv}}
            ),
            lambda read=read, name=name: read(name),  # type: ignore[misc]
        )


def _wait_established(api: Any, names: Sequence[str], deadline: float) -> None:
    from kubernetes import client

    ext: Any = client.ApiextensionsV1Api(api)
    for name in names:
        while True:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise AddonError(f"CRD {name} not Established in time")
            time.sleep(0.2)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def start(cluster: Cluster, names: Sequence[str], timeout: float = 180.0) -> None:
    """Start the add-ons ``names`` (``kueue``, ``jobset``) as processes of the running ``cluster``.

    Args:
        cluster: a started dev cluster; the add-ons become its components (stopped with it).
        names: add-ons from :data:`gpuscaler.devcluster.build.ADDONS`, built or cached.
        timeout: seconds for every add-on to be ready and its webhooks to answer.

    Raises:
        AddonError: an add-on name is unknown or not built, or it did not become ready.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpuscaler.devcluster.cluster import free_ports

    assert cluster.data_dir is not None and cluster.pki is not None
    unknown = sorted(set(names) - set(ADDON_SPECS))
    if unknown:
        raise UnknownAddonError(f"unknown add-on {', '.join(unknown)}: choose from {', '.join(ADDON_SPECS)}")
    wanted = [a for n, a in ADDON_SPECS.items() if n in names]
    missing = [a.name for a in wanted if a.name not in cluster.binaries.addons]
    if missing:
        raise UnknownAddonError(
            f"not built: {', '.join(missing)}; run `gpuscaler dev-cluster build --with {','.join(missing)}`"
        )
    deadline = time.monotonic() + timeout
    api = cluster.api_client()
    ca_bundle = base64.b64encode(cluster.pki.ca.cert.read_bytes()).decode()
    core: Any = client.CoreV1Api(api)
    started: list[tuple[Addon, Ports, Path]] = []
    for addon in wanted:
        with contextlib.suppress(ApiException):
            core.create_namespace({"metadata": {"name": addon.namespace}})
        ports = Ports(*free_ports(2))
        manifests = cluster.binaries.addons[addon.name] / MANIFESTS_DIR
        bodies = crds(manifests, ports.webhook_url, ca_bundle)
        _install_crds(api, bodies)
        _wait_established(api, [b["metadata"]["name"] for b in bodies], deadline)
        work = cluster.data_dir / addon.name
        if addon.name == "kueue":
            ensure_kueue_metrics_cert(cluster.pki.ca)
        cert_dir = work / "certs"
        certs.webhook_serving_cert(cert_dir, cluster.pki.ca, addon.name)
        config = work / "config.yaml"
        config.write_text(addon.config(ports, cert_dir))
        binary = cluster.binaries.addons[addon.name] / addon.name
        cluster.spawn(addon.name, [str(binary), f"--config={config}", f"--kubeconfig={cluster.kubeconfig}", *addon.args])
        cluster.ports[addon.name] = ports.webhook
        cluster.ports[f"{addon.name}-health"] = ports.health
        started.append((addon, ports, manifests))
    for addon, ports, manifests in started:
        url = f"http://127.0.0.1:{ports.health}/readyz"
        cluster.wait_for(addon.name, lambda url=url: _ready(url), deadline)  # type: ignore[misc]
        _install_webhooks(api, webhook_configurations(manifests, addon.name_prefix, ports.webhook_url, ca_bundle))
        last: Exception | None = None

        def probe(addon: Addon = addon) -> bool:
            nonlocal last
            try:
                addon.probe(api, "default")
                return True
            except ApiException as err:
                last = err
                return False

        try:
            cluster.wait_for(addon.name, probe, deadline, f"{addon.name} webhooks")
        except Exception as err:
            raise AddonError(f"{addon.name}: its webhooks did not answer in time (last: {last}): {err}") from err
    api.close()
    cluster.log(f"add-ons ready: {', '.join(a.name for a, _, _ in started)}")
