"""Azure prices from the public Retail Prices API (no credentials).

``GET {base}?api-version=2023-01-01-preview&$filter=...`` answers ``{"Items": [...], "NextPageLink":
url-or-null, ...}`` (learn.microsoft.com/en-us/rest/api/cost-management/retail-prices/azure-retail-prices).
The filter asks for ``serviceName eq 'Virtual Machines' and priceType eq 'Consumption'`` in one
region for the catalog's sizes (``armSkuName``); every item is checked again on this side, as
SkyPilot's ``fetch_azure.py`` does, because a mirror may not filter: only ``type`` Consumption
(not DevTestConsumption or Reservation, no ``reservationTerm``), not Windows (``productName``
"... Windows" or "... Win"), not Cloud Services, not Low Priority, per hour in USD. A ``skuName``
ending in " Spot" is the spot price, the rest on-demand; both are region-wide (Azure prices no zone).
Where one size has several rows, the one with the newest ``effectiveStartDate`` wins.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from gpuscaler.catalog import CapacityType, normalize
from gpuscaler.catalog.prices import Price, PriceTable
from gpuscaler.cloud.pricing import DEFAULT_PACING, Pacing, PriceSourceError, today
from gpuscaler.cloud.pricing.http import get_json

SOURCE = "azure-retail-prices"
DEFAULT_URL = "https://prices.azure.com/api/retail/prices"
URL_ENV = "GPUSCALER_AZURE_PRICES_URL"
API_VERSION = "2023-01-01-preview"
MAX_PAGES = 2000
"""Pages followed per region before the pull is called runaway (a region's VM prices are ~100 pages)."""
REQUIRED = ("armSkuName", "armRegionName", "retailPrice", "skuName", "productName", "type", "unitOfMeasure")
SKIP_PRODUCT = (" Windows", " Win", "Cloud Services", "CloudServices", "DevTest")


class AzurePriceSource:
    """On-demand and spot prices of the given Azure sizes from the Retail Prices API."""

    provider = "azure"

    def __init__(
        self,
        instance_types: Iterable[str],
        base_url: str | None = None,
        pacing: Pacing = DEFAULT_PACING,
    ) -> None:
        self.types = {normalize(t): t for t in instance_types}
        self.base_url = base_url or os.environ.get(URL_ENV) or DEFAULT_URL
        self.pacing = pacing

    def first_url(self, region: str) -> str:
        """The first page's URL for ``region``."""
        sizes = " or ".join(f"armSkuName eq '{t}'" for t in sorted(self.types.values()))
        query = f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and armRegionName eq '{region}'"
        params = urllib.parse.urlencode({"api-version": API_VERSION, "$filter": f"{query} and ({sizes})"})
        return f"{self.base_url}{'&' if '?' in self.base_url else '?'}{params}"

    def fetch(self, regions: Sequence[str]) -> PriceTable:
        """See :meth:`gpuscaler.cloud.pricing.PriceSource.fetch`."""
        day = today()
        rows: list[Price] = []
        for region in regions:
            best: dict[tuple[str, CapacityType], tuple[str, float]] = {}
            url: str | None = self.first_url(region)
            seen: set[str] = set()
            while url:
                if url in seen or len(seen) >= MAX_PAGES:
                    raise PriceSourceError(
                        f"{SOURCE}: page {len(seen) + 1} of {region}: NextPageLink loops or runs away"
                    )
                seen.add(url)
                page = get_json(url, SOURCE, "nothing (it is public): check the URL", None, self.pacing)
                url = self._page(page, region, len(seen), best)
                if len(seen) % 10 == 0:
                    self.pacing.progress(f"azure {region}: {len(seen)} pages read")
            self.pacing.progress(f"azure {region}: {len(seen)} page(s), {len(best)} prices")
            for (name, cap), (_, usd) in sorted(best.items()):
                rows.append(Price("azure", region, "", name, cap, usd, day, SOURCE))
        return PriceTable(rows, SOURCE)

    def _page(
        self,
        page: dict[str, Any],
        region: str,
        n: int,
        best: dict[tuple[str, CapacityType], tuple[str, float]],
    ) -> str | None:
        """Take one page's items into ``best``; answer the next page's URL."""
        where = f"{SOURCE}: page {n} of {region}"
        items, link = page.get("Items"), page.get("NextPageLink")
        if not isinstance(items, list) or not (link is None or isinstance(link, str)):
            raise PriceSourceError(
                f"{where}: malformed page: no Items list or a NextPageLink that is not a URL"
            )
        for item in items:
            if not isinstance(item, dict) or any(k not in item for k in REQUIRED):
                raise PriceSourceError(
                    f"{where}: malformed item (needs {', '.join(REQUIRED)}): {str(item)[:200]}"
                )
            chosen = self._select(item, region)
            if chosen is None:
                continue
            name, cap = chosen
            usd = item["retailPrice"]
            if isinstance(usd, bool) or not isinstance(usd, int | float):
                raise PriceSourceError(f"{where}: {name}: retailPrice {usd!r} is not a number")
            start = str(item.get("effectiveStartDate", ""))
            if (name, cap) not in best or start > best[(name, cap)][0]:
                best[(name, cap)] = (start, float(usd))
        return link or None

    def _select(self, item: dict[str, Any], region: str) -> tuple[str, CapacityType] | None:
        """The (catalog name, capacity) an item prices, or None for an item that is not a Linux
        pay-as-you-go hourly USD price of a wanted size in ``region``."""
        name = self.types.get(normalize(str(item["armSkuName"])))
        sku, product = str(item["skuName"]), str(item["productName"])
        if name is None or str(item["armRegionName"]).lower() != region.lower():
            return None
        if item["type"] != "Consumption" or item.get("reservationTerm") or "Low Priority" in sku:
            return None
        if any(s in product for s in SKIP_PRODUCT) or item["unitOfMeasure"] != "1 Hour":
            return None
        if item.get("currencyCode", "USD") != "USD":
            return None
        return name, CapacityType.SPOT if sku.endswith(" Spot") else CapacityType.ON_DEMAND
