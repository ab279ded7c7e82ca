"""Availability zones: which region a zone is in, spelled as Kubernetes nodes label it.

Zones are named as the well-known node label ``topology.kubernetes.io/zone`` carries them on each
cloud, which is also how the clouds' price APIs name them where they price per zone:

- AWS: the region plus a letter, ``us-east-1a`` (``DescribeSpotPriceHistory``'s
  ``AvailabilityZone``); Local Zones add a suffix, ``us-east-1-bos-1a``, still in ``us-east-1``.
- GCP: the region plus ``-`` and a letter, ``us-central1-a``.
- Azure: the region plus ``-`` and the zone number, ``eastus-1`` (AKS's label; the Retail Prices
  API prices per region only).

Pure: no cloud calls; a zone's existence is the cloud's business (a zone that does not exist just
gets no capacity).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuscaler.catalog.models import InstanceType

_AWS_REGION = re.compile(r"^([a-z]{2}(?:-[a-z]+)+-\d+)")
_ZONE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def zone_region(provider: str, zone: str) -> str | None:
    """The region of ``zone`` on ``provider``, or None when it is not spelled as that cloud's zones.

    Examples: ``("aws", "us-east-1a")`` -> ``us-east-1``; ``("aws", "us-east-1-bos-1a")`` ->
    ``us-east-1``; ``("gcp", "us-central1-a")`` -> ``us-central1``; ``("azure", "eastus-1")`` ->
    ``eastus``.
    """
    if not _ZONE.match(zone):
        return None
    if provider == "aws":
        m = _AWS_REGION.match(zone)
        if m is None or m.group(1) == zone:
            return None
        return m.group(1)
    region, sep, suffix = zone.rpartition("-")
    if not sep or not region:
        return None
    if provider == "gcp" and not re.fullmatch(r"[a-z]", suffix):
        return None
    if provider == "azure" and not suffix.isdigit():
        return None
    return region


def in_region(provider: str, region: str, zone: str) -> bool:
    """Whether ``zone`` is a zone of ``region`` on ``provider``."""
    return zone_region(provider, zone) == region


def default_zone(provider: str, region: str) -> str:
    """The first zone of a region, spelled the provider's way (``us-east-1a``, ``us-central1-a``,
    ``eastus-1``): where a node of a region-wide offering lands when nothing else says."""
    if provider == "aws":
        return f"{region}a"
    if provider == "gcp":
        return f"{region}-a"
    return f"{region}-1"


def unknown_zone(zone: str, instances: Iterable[InstanceType]) -> str | None:
    """Why ``zone`` can hold none of ``instances`` (it is in no region they are offered in), or None.

    The message names the regions that have instance types, for the user to pick a zone of.
    """
    regions = {(i.provider, i.region) for i in instances}
    if any(zone_region(provider, zone) == region for provider, region in regions):
        return None
    known = ", ".join(sorted({r for _, r in regions}))
    return (
        f"zone {zone!r} is in no region with instance types (regions: {known}); "
        "name a zone as nodes label it, like us-east-1a, us-central1-a or eastus-1"
    )
