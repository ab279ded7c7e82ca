"""TrainingJob manifests for tests, the e2e suite and the benchmarks: one builder, defaults plus overrides.

It lives in the package (not under ``tests/``) because three trees use it: ``tests/`` and ``e2e/``
are separate pytest rootdirs with their own ``conftest.py``, and ``benchmarks/`` are scripts run on
their own; each has ``gpuscaler`` importable and none has the others on ``sys.path``. Pure: it
builds dicts (the same documents ``kubectl apply`` or ``gpuscaler plan FILE`` read) and imports
nothing but :mod:`gpuscaler.names`.

Example::

    training_job("resnet", constraints=pinned("p3.2xlarge"), template=worker_template())
    training_job("long", training={"steps": 400}, maxDuration="4h", checkpoint={"intervalSeconds": 10})
"""

from __future__ import annotations

from typing import Any, Final

from gpuscaler.names import GROUP

API_VERSION: Final = f"{GROUP}/v1alpha1"
"""The TrainingJob's ``apiVersion``."""
TRAINER_IMAGE: Final = "registry.invalid/gpuscaler/trainer:e2e"
"""An image no node pulls (kwok runs no containers; the planner never reads it)."""


def worker_template(image: str = TRAINER_IMAGE, **container: Any) -> dict[str, Any]:
    """A pod template with one container ``train`` running ``image``; ``container`` adds its fields
    (``command``, ``resources``, ``env`` ...)."""
    return {"spec": {"containers": [{"name": "train", "image": image, **container}]}}


def pinned(instance: str | list[str], gpus: int = 1, spot: str = "never") -> dict[str, Any]:
    """``constraints`` that pin the plan's shape: these instance types, exactly ``gpus`` GPUs, the spot setting."""
    types = [instance] if isinstance(instance, str) else list(instance)
    return {"instanceTypes": types, "minGpus": gpus, "maxGpus": gpus, "spot": spot}


def training_job(name: str, *, namespace: str | None = None, **spec: Any) -> dict[str, Any]:
    """A TrainingJob manifest: the smallest valid spec (ResNet-50, global batch 256, one epoch) with
    ``spec``'s fields (camelCase, as in the manifest) replacing or adding to it.

    Args:
        name: ``metadata.name``.
        namespace: ``metadata.namespace`` (left out when None: ``kubectl -n`` sets it).
        **spec: Spec fields: ``training={"steps": 50}``, ``constraints=pinned("g5.xlarge")``,
            ``template=worker_template()``, ``maxDuration="4h"``, ``globalBatch=512`` ...

    Returns:
        The manifest, a new dict each call.
    """
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    body = {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"epochs": 1}, **spec}
    return {"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": metadata, "spec": body}
