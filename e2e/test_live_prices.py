"""End to end: the operator refreshes prices from a loopback Azure Retail Prices endpoint.

Expected of the operator (docs/prices.md): with ``GPUSCALER_PRICES_PROVIDERS=["azure"]`` it reads
the Retail Prices API (here ``GPUSCALER_AZURE_PRICES_URL``, a loopback ``http.server`` answering
the API's JSON pages: ``Items``, ``NextPageLink``) through the real HTTP client code, keeps the
last good copy in a ConfigMap, and plans every new job on it:

- a price change at the endpoint moves the next plan (two 1-GPU Azure sizes, the cheaper wins);
- an outage keeps the last good copy: the next plan is still on it, with ``PricesStale`` True and
  a ``PricesStale`` Event once the copy is older than the settings allow;
- a restarted operator plans on the ConfigMap's copy at once (the endpoint still down), not on the
  shipped table (on which the other size would win).
"""

from __future__ import annotations

import csv
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e_helpers import E2ECluster, wait_for
from operator_helpers import OperatorProcess, get_job, job_manifest, kubectl

pytestmark = pytest.mark.e2e

A100 = "Standard_NC24ads_A100_v4"
H100 = "Standard_NC40ads_H100_v5"
CONFIGMAP = "gpuscaler-prices"
MAX_AGE_S = 8


class RetailPrices:
    """A loopback Azure Retail Prices API: one item per size, two pages, prices set by the test."""

    def __init__(self) -> None:
        self.prices = {A100: 1.0, H100: 40.0}
        self.down = False
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests += 1
                if owner.down:
                    self.send_error(503, "Service Unavailable")
                    return
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                page = int(query.get("page", ["1"])[0])
                names = sorted(owner.prices)
                name = names[page - 1]
                item = {
                    "currencyCode": "USD", "armRegionName": "eastus", "armSkuName": name,
                    "retailPrice": owner.prices[name], "unitPrice": owner.prices[name],
                    "skuName": name.removeprefix("Standard_").replace("_", " "),
                    "productName": "Virtual Machines " + name.split("_")[1] + " Series",
                    "meterName": name.removeprefix("Standard_").replace("_", " "), "type": "Consumption",
                    "unitOfMeasure": "1 Hour", "effectiveStartDate": "2026-01-01T00:00:00Z",
                    "serviceName": "Virtual Machines",
                }  # fmt: skip
                more = page < len(names)
                nxt = f"http://127.0.0.1:{owner.port}/api/retail/prices?page={page + 1}" if more else None
                body = json.dumps({"BillingCurrency": "USD", "Items": [item], "NextPageLink": nxt,
                                   "Count": 1}).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/retail/prices"


@pytest.fixture
def endpoint() -> Iterator[RetailPrices]:
    api = RetailPrices()
    yield api
    api.server.shutdown()


def test_operator_refreshes_prices_keeps_the_last_good_copy_and_survives_a_restart(
    dev_cluster: E2ECluster,
    crd: None,
    kwok: None,
    namespace: str,
    core: Any,
    endpoint: RetailPrices,
    tmp_path: Path,
) -> None:
    settings = {
        "GPUSCALER_PRICES_PROVIDERS": '["azure"]',
        "GPUSCALER_PRICES_REGIONS": '["eastus"]',
        "GPUSCALER_AZURE_PRICES_URL": endpoint.url,
        "GPUSCALER_PRICES_NAMESPACE": namespace,
        "GPUSCALER_PRICES_ONDEMAND_INTERVAL_S": "2",
        "GPUSCALER_PRICES_SPOT_INTERVAL_S": "2",
        "GPUSCALER_PRICES_ONDEMAND_MAX_AGE_S": str(MAX_AGE_S),
        "GPUSCALER_PRICES_SPOT_MAX_AGE_S": str(MAX_AGE_S),
        "GPUSCALER_PRICES_RETRY_S": "1",
    }
    custom = client.CustomObjectsApi(dev_cluster.api)
    log = tmp_path / "operator.log"
    op = OperatorProcess(dev_cluster, namespace, log, **settings)

    def kept_price(name: str) -> float | None:
        try:
            cm = core.read_namespaced_config_map(CONFIGMAP, namespace)
        except Exception:
            return None
        lines = [x for x in (cm.data or {}).get("prices.csv", "").splitlines() if not x.startswith("#")]
        for row in csv.DictReader(lines):
            if row["name"] == name and row["ondemand_usd_hr"]:
                return float(row["ondemand_usd_hr"])
        return None

    def submit(name: str) -> None:
        job = job_manifest(name)
        job["spec"]["constraints"] = {"instanceTypes": [A100, H100], "minGpus": 1, "maxGpus": 1, "spot": "never"}
        kubectl(dev_cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(job))

    def planned(name: str) -> dict[str, Any]:
        def plan() -> dict[str, Any] | None:
            return (get_job(custom, namespace, name).get("status") or {}).get("plan")

        found = wait_for(plan, timeout=60, interval=0.3, what=f"{name} planned")
        assert found is not None
        return found

    def stale(name: str) -> dict[str, Any] | None:
        conds = (get_job(custom, namespace, name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "PricesStale"), None)

    def events(name: str) -> list[str]:
        items = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        return [e.reason for e in items]

    op.start()
    try:
        # 1. the first refresh: the endpoint's prices are kept and planned on
        wait_for(lambda: kept_price(A100) == 1.0, timeout=60, interval=0.5, what="the ConfigMap's first copy")
        submit("first")
        plan = planned("first")
        assert plan["instanceType"] == A100
        assert plan["priceSource"] == "azure-retail-prices" and plan["priceDate"] == date.today().isoformat()
        assert plan["usdPerHour"] == pytest.approx(1.0)
        assert (stale("first") or {}).get("status") == "False"

        # 2. a price change at the endpoint moves the next plan
        endpoint.prices = {A100: 40.0, H100: 1.5}
        wait_for(lambda: kept_price(H100) == 1.5, timeout=60, interval=0.5, what="the changed prices kept")
        submit("second")
        plan = planned("second")
        assert plan["instanceType"] == H100 and plan["usdPerHour"] == pytest.approx(1.5)

        # 3. an outage: the last good copy stays in force and turns stale
        endpoint.down = True
        asked = endpoint.requests
        wait_for(lambda: endpoint.requests > asked, timeout=30, what="a refresh during the outage")
        wait_for(lambda: "refresh failed" in log.read_text(errors="replace"), timeout=60, what="a failed refresh")
        time.sleep(MAX_AGE_S + 1)
        submit("third")
        plan = planned("third")
        assert plan["instanceType"] == H100 and plan["priceSource"] == "azure-retail-prices"
        cond = stale("third")
        assert cond is not None and cond["status"] == "True"
        assert cond["reason"] == "PricesOld" and "last good copy" in cond["message"] and "503" in cond["message"]
        wait_for(lambda: "PricesStale" in events("third"), timeout=30, what="the PricesStale Event")
        assert kept_price(H100) == 1.5  # the ConfigMap still holds the last good copy

        # 4. a restart with the endpoint still down plans on the kept copy, not the shipped table
        op.kill()
        op = OperatorProcess(dev_cluster, namespace, log, **settings)
        op.start()
        submit("fourth")
        plan = planned("fourth")
        assert plan["instanceType"] == H100 and plan["usdPerHour"] == pytest.approx(1.5)
        assert plan["priceSource"] == "azure-retail-prices"
        assert (stale("fourth") or {}).get("status") == "True"
    finally:
        kubectl(dev_cluster, "delete", "trainingjobs", "--all", "-n", namespace, "--timeout=60s", check=False)
        op.stop()
        print(log.read_text(errors="replace")[-5000:])

