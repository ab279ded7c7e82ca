"""The last good copy of the live prices, kept in a ConfigMap of the operator's namespace.

``data`` holds ``prices.csv`` (a price file: :meth:`gpuscaler.catalog.prices.PriceTable.to_csv`),
``onDemandReadAt`` and ``spotReadAt`` (RFC 3339) and ``history.json`` (the prices in force over
time, for the cost so far). The operator reads it at start-up and replaces it
after each good refresh (``gpuscaler.controller.prices.PriceRefresher``); RBAC: configmaps
get, create, update in that namespace (helm/gpuscaler/templates/rbac.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.catalog.prices import PriceTable
from gpuscaler.errors import TemporaryError

HTTP_NOT_FOUND = 404
DATA_KEY = "prices.csv"
ONDEMAND_KEY = "onDemandReadAt"
SPOT_KEY = "spotReadAt"
LOG_KEY = "history.json"


@dataclass(frozen=True)
class PriceCopy:
    """A live price table and when each kind of its prices was last read."""

    table: PriceTable
    ondemand_read_at: datetime
    spot_read_at: datetime
    log_json: str = ""
    """The prices in force over time (``gpuscaler.controller.prices.PriceLog`` as JSON), for the cost so far."""


class PriceStoreError(TemporaryError):
    """The last good copy could not be read or written (the message says which and why)."""


class ConfigMapPriceStore:
    """:class:`gpuscaler.controller.prices.PriceStore` on a ConfigMap."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        """
        Args:
            api: A ``kubernetes.client.ApiClient``.
            namespace: The operator's namespace.
            name: The ConfigMap's name (``settings.prices_configmap``).
        """
        self.core: Any = client.CoreV1Api(api)
        self.namespace, self.name = namespace, name

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def load(self) -> PriceCopy | None:
        """The copy kept, or None when there is none (see ``gpuscaler.controller.prices.PriceStore``)."""
        try:
            cm = self.core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as err:
            if err.status == HTTP_NOT_FOUND:
                return None
            raise PriceStoreError(f"reading {self.where}: {err.reason}") from err
        data = cm.data or {}
        missing = [k for k in (DATA_KEY, ONDEMAND_KEY, SPOT_KEY) if not data.get(k)]
        if missing:
            raise PriceStoreError(f"{self.where} lacks {', '.join(missing)}")
        try:
            od, spot = datetime.fromisoformat(data[ONDEMAND_KEY]), datetime.fromisoformat(data[SPOT_KEY])
        except ValueError as err:
            raise PriceStoreError(f"{self.where}: a read time is not RFC 3339: {err}") from None
        return PriceCopy(PriceTable.from_csv(data[DATA_KEY], f"{self.where} {DATA_KEY}"), od, spot, data.get(LOG_KEY, ""))

    def save(self, copy: PriceCopy) -> None:
        """Keep ``copy``: create the ConfigMap, or replace its data."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpuscaler"},
            },
            "data": {
                DATA_KEY: copy.table.to_csv(),
                ONDEMAND_KEY: copy.ondemand_read_at.isoformat(),
                SPOT_KEY: copy.spot_read_at.isoformat(),
                LOG_KEY: copy.log_json,
            },
        }
        try:
            self.core.replace_namespaced_config_map(self.name, self.namespace, body)
        except ApiException as err:
            if err.status != HTTP_NOT_FOUND:
                raise PriceStoreError(f"writing {self.where}: {err.reason}") from err
            try:
                self.core.create_namespaced_config_map(self.namespace, body)
            except ApiException as err2:
                raise PriceStoreError(f"creating {self.where}: {err2.reason}") from err2
