"""The price refresher in the operator process: built from the settings, run in a thread.

:func:`make_refresher` builds :class:`gpuscaler.controller.prices.PriceRefresher` with one price
source per ``GPUSCALER_PRICES_PROVIDERS`` cloud and the ConfigMap store, and puts the kept copy in
force; :func:`run` refreshes on schedule (a daemon thread started with the operator) and exports
the ages, the staleness and each refresh's outcome as metrics.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from gpuscaler.catalog import Catalog
from gpuscaler.cloud.pricing import quiet
from gpuscaler.cloud.pricing.refresh import make_source
from gpuscaler.controller.prices import PriceConfig, PriceRefresher
from gpuscaler.handlers import metrics
from gpuscaler.kube.prices import ConfigMapPriceStore
from gpuscaler.settings import Settings

log = logging.getLogger(__name__)


def prices_namespace(settings: Settings) -> str:
    """The ConfigMap's namespace: the setting, else the watched namespace, else ``POD_NAMESPACE``, else default."""
    return settings.prices_namespace or settings.namespace or os.environ.get("POD_NAMESPACE") or "default"


def make_refresher(settings: Settings, api: Any, shipped: Catalog) -> PriceRefresher | None:
    """The refresher the settings ask for, with the kept copy in force; None when no cloud is named."""
    if not settings.prices_providers:
        return None
    regions: dict[str, list[str]] = {
        p: list(settings.prices_regions)
        or sorted({i.region for i in shipped.instances if i.provider == p})
        for p in settings.prices_providers
    }
    config = PriceConfig(
        regions,
        ondemand_interval_s=settings.prices_ondemand_interval_s,
        spot_interval_s=settings.prices_spot_interval_s,
        ondemand_max_age_s=settings.prices_ondemand_max_age_s,
        spot_max_age_s=settings.prices_spot_max_age_s,
        retry_s=settings.prices_retry_s,
    )
    sources = [make_source(p, shipped, quiet) for p in settings.prices_providers]
    store = ConfigMapPriceStore(api, prices_namespace(settings), settings.prices_configmap)
    refresher = PriceRefresher(shipped, sources, config, store)
    if refresher.load():
        log.info("prices: the last good copy from %s is in force", store.where)
    elif refresher.last_error:
        log.warning("prices: %s; the shipped table is in force until a refresh", refresher.last_error)
    return refresher


def export(refresher: PriceRefresher) -> None:
    """Set the price metrics from the refresher's state now."""
    od, spot = refresher.ages_s(refresher.clock())
    if od is not None and spot is not None:
        metrics.PRICES_AGE.labels("on-demand").set(od)
        metrics.PRICES_AGE.labels("spot").set(spot)
    metrics.PRICES_STALE.set(1 if refresher.staleness().stale else 0)


def run(refresher: PriceRefresher, stop: threading.Event, tick_s: float = 30.0) -> None:
    """Refresh on schedule until ``stop`` is set; never raises (a failure keeps the last good copy)."""
    while not stop.is_set():
        now = refresher.clock()
        if refresher.next_in_s(now) <= 0:
            try:
                ok = refresher.refresh(now)
            except Exception:  # a bug in a source must not end the thread; the last good copy stays
                log.exception("prices: refresh failed unexpectedly")
                ok = False
            if ok:
                metrics.PRICE_REFRESHES.labels("ok").inc()
                log.info("prices: refreshed (%s)", refresher.staleness().message)
            else:
                metrics.PRICE_REFRESHES.labels("failed").inc()
                log.warning("prices: refresh failed, the copy in force stays: %s", refresher.last_error)
        export(refresher)
        stop.wait(max(0.5, min(tick_s, refresher.next_in_s(refresher.clock()))))


def start(refresher: PriceRefresher) -> threading.Event:
    """Run :func:`run` in a daemon thread; set the returned event to stop it."""
    stop = threading.Event()
    threading.Thread(target=run, args=(refresher, stop), name="gpuscaler-prices", daemon=True).start()
    return stop
