"""Held capacity as the cloud reports it: EC2 capacity reservations and capacity blocks.

``gpuscaler catalog capacity --aws-region R`` lists what the account holds, in the shape a policy
declares it (:class:`gpuscaler.policy.capacity.HeldCapacity`), so a platform team can paste it
into its policy (``--as-policy``). EC2 reports both kinds through ``DescribeCapacityReservations``:
an On-Demand Capacity Reservation (``ReservationType`` ``default``) is ``reserved`` with its expiry
when ``EndDateType`` is ``limited``; a Capacity Block for ML (``capacity-block``) is a
``capacityBlock`` with its window (``StartDate``, ``EndDate``). Only reservations that are, or
will be, usable (states ``active``, ``scheduled``, ``payment-pending``, ``pending``) are listed.
Both are billed whether used or not, so their price at the margin is 0 (the declaration's
default). The cloud's own count of free instances (``AvailableInstanceCount``) is returned beside
each pool. GCP reservations are not read (no Compute client in gpuscaler's dependencies): declare
them by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpuscaler.errors import ErrorKind, GpuscalerError
from gpuscaler.policy.capacity import HeldCapacity

USABLE_STATES = ("active", "scheduled", "payment-pending", "pending")
"""Reservation states whose capacity is, or will be, there."""


@dataclass(frozen=True)
class CloudCapacity:
    """One reservation as read: the pool a policy would declare, and what the cloud says is free."""

    pool: HeldCapacity
    available: int
    """Instances the cloud reports unused now (``AvailableInstanceCount``)."""
    state: str


class CapacityReadError(GpuscalerError):
    """The cloud could not be read (credentials, permissions, the endpoint)."""

    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.kind = kind


def _name(reservation_id: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", reservation_id.lower()).strip("-")[:63] or "reservation"


def _utc(t: Any) -> datetime | None:
    if not isinstance(t, datetime):
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def pool_of(r: dict[str, Any]) -> CloudCapacity:
    """A ``DescribeCapacityReservations`` entry as a pool."""
    block = r.get("ReservationType") == "capacity-block"
    end = _utc(r.get("EndDate")) if block or r.get("EndDateType") == "limited" else None
    pool = HeldCapacity(
        name=_name(str(r["CapacityReservationId"])),
        type="capacityBlock" if block else "reserved",
        instance_type=str(r["InstanceType"]),
        zone=str(r.get("AvailabilityZone") or ""),
        count=int(r["TotalInstanceCount"]),
        start=_utc(r.get("StartDate")) if block else None,
        end=end,
        reservation_id=str(r["CapacityReservationId"]),
    )
    return CloudCapacity(pool, int(r.get("AvailableInstanceCount") or 0), str(r.get("State") or ""))


def read_aws(ec2: Any) -> list[CloudCapacity]:
    """Every usable capacity reservation and capacity block of the account in the client's region.

    Args:
        ec2: A boto3 EC2 client.

    Returns:
        The pools, in the order EC2 lists them.

    Raises:
        CapacityReadError: The call failed (the message says which and why).
    """
    out: list[CloudCapacity] = []
    try:
        pages = ec2.get_paginator("describe_capacity_reservations").paginate(
            Filters=[{"Name": "state", "Values": list(USABLE_STATES)}]
        )
        for page in pages:
            out += [pool_of(r) for r in page.get("CapacityReservations", []) if r.get("State") in USABLE_STATES]
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        raise CapacityReadError(
            f"reading EC2 capacity reservations: {code}: {err.response.get('Error', {}).get('Message', err)} "
            "(the caller needs ec2:DescribeCapacityReservations)",
            ErrorKind.INVALID_INPUT,
        ) from err
    except BotoCoreError as err:
        raise CapacityReadError(f"reading EC2 capacity reservations: {err}", ErrorKind.TEMPORARY) from err
    return out
