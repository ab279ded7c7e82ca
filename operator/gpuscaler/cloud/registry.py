"""Node-pool providers by name: ``GPUSCALER_PROVIDER_NAME`` picks one of :data:`PROVIDERS`.

Each entry is a factory ``(settings, api_client) -> NodePoolProvider``. The two without a cloud
(kwok, static) are here; the real clouds' factories (eks, gke, karpenter, clusterapi) are in
:mod:`gpuscaler.cloud.factories` (``REAL_CLOUDS``), which is where a new cloud's factory is added:
this module takes them all from there (docs/porting.md lists every file a new provider touches).
Factories import their cloud SDK lazily, so an unused provider costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuscaler.cloud.factories import REAL_CLOUDS
from gpuscaler.cloud.provider import NodePoolProvider, UnknownProviderError
from gpuscaler.settings import Settings

Factory = Callable[[Settings, Any], NodePoolProvider]


def _kwok(settings: Settings, api: Any) -> NodePoolProvider:
    from gpuscaler.cloud.kwok import KwokProvider

    return KwokProvider(
        api,
        provisioning_delay_s=settings.kwok_provisioning_delay_s,
        capacity=settings.kwok_capacity,
        toleration_key=settings.gpu_toleration_key,
    )


def _static(settings: Settings, api: Any) -> NodePoolProvider:
    from gpuscaler.cloud.static import StaticProvider

    return StaticProvider(settings.gpu_toleration_key)


PROVIDERS: dict[str, Factory] = {
    "kwok": _kwok,  # fake nodes played by kwok: dev cluster, tests, demos, scale benchmarks
    "static": _static,  # an existing node group: only node selectors and tolerations
    **REAL_CLOUDS,  # eks, gke, karpenter, clusterapi: gpuscaler.cloud.factories
}


def make_provider(name: str, settings: Settings, api: Any) -> NodePoolProvider:
    """The provider registered as ``name``.

    Raises:
        UnknownProviderError: no such provider; the message lists the known ones.
    """
    try:
        factory = PROVIDERS[name]
    except KeyError as err:
        raise UnknownProviderError(
            f"provider {name!r} is not known; set GPUSCALER_PROVIDER_NAME to one of {sorted(PROVIDERS)}"
        ) from err
    return factory(settings, api)
