"""GCP prices from the Cloud Billing Catalog API: a GPU VM's price is the sum of its parts.

``GET {base}/v1/services/6F81-5844-456A/skus?key=...&currencyCode=USD&pageToken=...`` (Compute
Engine's SKUs) answers ``{"skus": [...], "nextPageToken": "..."}``
(cloud.google.com/billing/docs/reference/rest/v1/services.skus/list). GCP prices a VM by parts, per
region (no zone), on-demand (``usageType`` OnDemand) and spot (Preemptible):

    price(type, region) = vCPU x core SKU + GiB x RAM SKU + GPUs x GPU SKU

with the vCPU, GiB and GPU counts from the catalog, the core and RAM SKUs of the machine series
("A2 Instance Core", "A2 Instance Ram", ...; SkyPilot's ``fetch_gcp.py`` matches the same
descriptions) and the GPU's SKU ("Nvidia Tesla A100 GPU", "Nvidia L4 GPU", ...). As SkyPilot does,
only ``resourceFamily`` Compute is read, and custom, premium, reserved, sole-tenancy, commitment
and DWS (calendar/flex) SKUs are left out. A unit price is ``units + nanos / 10^9`` of the SKU's
highest pricing tier, in ``h`` (cores, GPUs) or ``GiBy.h`` (RAM).

Why plain HTTP and not ``google-cloud-billing``: that client brings gRPC, protobuf and
google-auth for one paged GET; this API accepts an API key (``key=``) and documents its REST
shape, so :mod:`urllib` against it keeps the CLI light and lets the tests run the real client
code against a loopback server. A service account works through its OAuth access token
(``GPUSCALER_GCP_ACCESS_TOKEN``, e.g. from ``gcloud auth print-access-token``).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscaler.catalog import CapacityType, InstanceType
from gpuscaler.catalog.prices import Price, PriceTable
from gpuscaler.cloud.pricing import DEFAULT_PACING, Pacing, PriceSourceError, today
from gpuscaler.cloud.pricing.http import get_json
from gpuscaler.errors import ErrorKind

SOURCE = "gcp-cloud-billing"
SERVICE = "6F81-5844-456A"
"""Compute Engine's service id in the Cloud Billing Catalog."""
DEFAULT_URL = "https://cloudbilling.googleapis.com"
URL_ENV = "GPUSCALER_GCP_BILLING_URL"
KEY_ENV = "GPUSCALER_GCP_API_KEY"
TOKEN_ENV = "GPUSCALER_GCP_ACCESS_TOKEN"
PAGE_SIZE = 5000
MAX_PAGES = 200
SERIES = {"a2": "A2 Instance", "a3": "A3 Instance", "g2": "G2 Instance", "n1": "N1 Predefined Instance"}
"""Machine series -> the words its core and RAM SKUs' descriptions carry."""
GPU_SKU = {
    "A100-40GB": "Nvidia Tesla A100 GPU",
    "A100-80GB": "Nvidia A100 80GB GPU",
    "H100-80GB-SXM": "Nvidia H100 80GB GPU",
    "H200-141GB-SXM": "Nvidia H200 141GB GPU",
    "L4": "Nvidia L4 GPU",
    "T4": "Nvidia Tesla T4 GPU",
    "V100-16GB": "Nvidia Tesla V100 GPU",
}
"""Catalog GPU id -> the words its SKU's description carries."""
SKIP = ("custom", "premium", "reserved", "sole tenancy", "commitment", "dws", "calendar", "flex")
USAGE = {CapacityType.ON_DEMAND: "OnDemand", CapacityType.SPOT: "Preemptible"}
NEEDS = (
    f"an API key in {KEY_ENV} (of a project with the Cloud Billing API enabled) or a service account's "
    f"OAuth access token in {TOKEN_ENV} (e.g. `gcloud auth print-access-token`)"
)


@dataclass(frozen=True)
class Rate:
    """One SKU's hourly unit price in one region."""

    description: str
    group: str
    """resourceGroup: CPU, RAM, GPU, N1Standard, ..."""
    unit: str
    usd: float


class GcpPriceSource:
    """On-demand and spot prices of the given GCP machine types from the Cloud Billing Catalog."""

    provider = "gcp"

    def __init__(
        self,
        instances: Iterable[InstanceType],
        base_url: str | None = None,
        api_key: str | None = None,
        access_token: str | None = None,
        pacing: Pacing = DEFAULT_PACING,
    ) -> None:
        self.instances = {i.name: i for i in instances}
        self.base_url = (base_url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(KEY_ENV, "")
        self.access_token = access_token if access_token is not None else os.environ.get(TOKEN_ENV, "")
        self.pacing = pacing

    def fetch(self, regions: Sequence[str]) -> PriceTable:
        """See :meth:`gpuscaler.cloud.pricing.PriceSource.fetch`."""
        if not (self.api_key or self.access_token):
            raise PriceSourceError(
                f"{SOURCE}: no credentials: the Cloud Billing Catalog API needs {NEEDS}",
                ErrorKind.INVALID_INPUT,
            )
        rates = self._rates(set(regions))
        day = today()
        rows = []
        for region in regions:
            for inst in self.instances.values():
                for cap in CapacityType:
                    usd = self._price(inst, cap, rates.get((region, USAGE.get(cap, "")), []))
                    if usd is not None:
                        rows.append(Price("gcp", region, "", inst.name, cap, round(usd, 6), day, SOURCE))
        return PriceTable(rows, SOURCE)

    def _rates(self, regions: set[str]) -> dict[tuple[str, str], list[Rate]]:
        """Every Compute SKU rate in the regions, by (region, usageType)."""
        out: dict[tuple[str, str], list[Rate]] = {}
        token, pages = "", 0
        headers = {"Authorization": f"Bearer {self.access_token}"} if self.access_token else None
        while True:
            params = {"currencyCode": "USD", "pageSize": str(PAGE_SIZE)}
            if self.api_key:
                params["key"] = self.api_key
            if token:
                params["pageToken"] = token
            url = f"{self.base_url}/v1/services/{SERVICE}/skus?{urllib.parse.urlencode(params)}"
            page = get_json(url, SOURCE, NEEDS, headers, self.pacing)
            pages += 1
            skus, token = page.get("skus"), page.get("nextPageToken", "")
            if not isinstance(skus, list) or not isinstance(token, str):
                raise PriceSourceError(
                    f"{SOURCE}: page {pages}: malformed page: no skus list or a nextPageToken that is not text"
                )
            for sku in skus:
                for region, usage, rate in _sku_rates(sku, regions, pages):
                    out.setdefault((region, usage), []).append(rate)
            self.pacing.progress(f"gcp: {pages} page(s) of Compute Engine SKUs read")
            if not token:
                return out
            if pages >= MAX_PAGES:
                raise PriceSourceError(f"{SOURCE}: more than {MAX_PAGES} pages: nextPageToken runs away")

    def _price(self, inst: InstanceType, cap: CapacityType, rates: list[Rate]) -> float | None:
        """vCPU x core + GiB x RAM + GPUs x GPU, or None when a part has no SKU."""
        series = SERIES.get(inst.name.split("-")[0])
        gpu = GPU_SKU.get(inst.gpu_id)
        if series is None or gpu is None:
            self.pacing.progress(
                f"gcp: {inst.name}: no SKU names known for its series or GPU {inst.gpu_id}; skipped"
            )
            return None
        core = _find(rates, series + " Core", "h")
        ram = _find(rates, series + " Ram", "GiBy.h")
        accel = _find(rates, gpu, "h")
        if core is None or ram is None or accel is None:
            return None
        return inst.vcpu * core + inst.memory_gib * ram + inst.gpu_count * accel


def _find(rates: list[Rate], words: str, unit: str) -> float | None:
    """The rate whose description carries ``words`` as a whole phrase (``A100 GPU`` is not
    ``A100 80GB GPU``), in ``unit``."""
    for r in rates:
        if f" {words} " in f" {r.description} " and r.unit == unit:
            return r.usd
    return None


def _sku_rates(sku: Any, regions: set[str], page: int) -> Iterable[tuple[str, str, Rate]]:
    """(region, usageType, rate) of one SKU in the wanted regions; nothing for a SKU left out."""
    try:
        category = sku["category"]
        description = str(sku["description"])
        if category["resourceFamily"] != "Compute" or category["usageType"] not in USAGE.values():
            return []
        if any(s in description.lower() for s in SKIP):
            return []
        expression = sku["pricingInfo"][0]["pricingExpression"]
        tier = max(expression["tieredRates"], key=lambda t: float(t.get("startUsageAmount", 0)))
        price = tier["unitPrice"]
        if price.get("currencyCode", "USD") != "USD":
            return []
        usd = int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9
        rate = Rate(description, str(category["resourceGroup"]), str(expression["usageUnit"]), usd)
        return [(r, str(category["usageType"]), rate) for r in sku["serviceRegions"] if r in regions]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise PriceSourceError(
            f"{SOURCE}: page {page}: malformed SKU ({type(err).__name__}: {err}): {str(sku)[:200]}"
        ) from None
