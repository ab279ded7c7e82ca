"""AWS prices: on-demand per region from the Pricing API, spot per zone from EC2's spot price history.

On-demand: ``pricing.get_products`` (service ``AmazonEC2``) with the filters Karpenter's pricing
provider uses (``pkg/providers/pricing/pricing.go``): ``regionCode``, ``operatingSystem`` Linux,
``tenancy`` Shared, ``preInstalledSw`` NA, ``capacitystatus`` Used, ``marketoption`` OnDemand,
``productFamily`` Compute Instance, plus ``instanceType`` ANY_OF the catalog's types; paged by
``NextToken``. Each ``PriceList`` entry is a JSON document; its price is
``terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`` (a zero dimension is skipped, as Karpenter does).

Spot: ``ec2.describe_spot_price_history`` for the catalog's types, ``Linux/UNIX`` and ``Linux/UNIX
(Amazon VPC)``, ``StartTime`` now (which answers each type and zone's current price, as
Karpenter asks), paged; the newest price per (type, zone) wins.

The Pricing API is served from us-east-1 whatever region is priced. Endpoints are botocore's own:
``AWS_ENDPOINT_URL_PRICING`` and ``AWS_ENDPOINT_URL_EC2`` (or ``AWS_ENDPOINT_URL``) are honoured
because the clients are made without an ``endpoint_url``. Credentials: boto3's default chain; the
IAM actions needed are ``pricing:GetProducts`` and ``ec2:DescribeSpotPriceHistory``.
Interruption frequency is not read here: it stays the catalog's, from the Spot Advisor data.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from gpuscaler.catalog import CapacityType, normalize
from gpuscaler.catalog.prices import Price, PriceTable
from gpuscaler.cloud.pricing import (
    DEFAULT_PACING,
    Pacing,
    PriceSourceError,
    RetryableError,
    today,
    with_retries,
)
from gpuscaler.errors import ErrorKind

ONDEMAND_SOURCE = "aws-pricing-api"
SPOT_SOURCE = "aws-spot-price-history"
PRICING_REGION = "us-east-1"
"""Where the Pricing API is served (it prices every region)."""
PRODUCT_DESCRIPTIONS = ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"]
ACTIONS = "IAM actions pricing:GetProducts and ec2:DescribeSpotPriceHistory"
DENIED = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
                    "InvalidClientTokenId", "UnrecognizedClientException", "ExpiredToken", "ExpiredTokenException"})  # fmt: skip
MAX_PAGES = 500
THROTTLED = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
                       "RequestThrottled", "RequestThrottledException", "SlowDown"})  # fmt: skip
"""Error codes that mean "slow down" (botocore's standard retry mode treats them so)."""

ClientFactory = Callable[[str, str], Any]
"""(service, region) -> a boto3 client."""


def boto3_clients(service: str, region: str) -> Any:
    """A boto3 client of the default session; no ``endpoint_url``, so botocore applies
    ``AWS_ENDPOINT_URL_<SERVICE>``. Retries are this module's (botocore's own are off)."""
    return boto3.session.Session().client(
        service, region_name=region, config=Config(retries={"total_max_attempts": 1})
    )


class AwsPriceSource:
    """On-demand prices per region and spot prices per zone of the given EC2 instance types."""

    provider = "aws"

    def __init__(
        self,
        instance_types: Iterable[str],
        clients: ClientFactory = boto3_clients,
        pacing: Pacing = DEFAULT_PACING,
    ) -> None:
        self.types = {normalize(t): t for t in instance_types}
        self.clients = clients
        self.pacing = pacing

    def fetch(self, regions: Sequence[str]) -> PriceTable:
        """See :meth:`gpuscaler.cloud.pricing.PriceSource.fetch`."""
        day = today()
        pricing = self.clients("pricing", PRICING_REGION)
        rows: list[Price] = []
        for region in regions:
            for name, usd in sorted(self._ondemand(pricing, region).items()):
                rows.append(Price("aws", region, "", name, CapacityType.ON_DEMAND, usd, day, ONDEMAND_SOURCE))
            spot = self._spot(self.clients("ec2", region), region)
            for (name, zone), usd in sorted(spot.items()):
                rows.append(Price("aws", region, zone, name, CapacityType.SPOT, usd, day, SPOT_SOURCE))
            self.pacing.progress(f"aws {region}: {len(spot)} spot prices by zone")
        return PriceTable(rows, "aws")

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """One API call with this module's retries; boto errors become :class:`PriceSourceError`."""

        def once() -> Any:
            try:
                return fn(**kwargs)
            except ClientError as err:
                code = err.response.get("Error", {}).get("Code", "")
                if (
                    code in THROTTLED
                    or err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500
                ):
                    raise RetryableError(f"{code or 'server error'}: {err}") from None
                if code in DENIED:
                    raise PriceSourceError(
                        f"{what}: AWS refused it ({code}): the credentials need the {ACTIONS}",
                        ErrorKind.INVALID_INPUT,
                    ) from None
                raise PriceSourceError(f"{what}: {err}") from None
            except NoCredentialsError:
                raise PriceSourceError(
                    f"{what}: no AWS credentials found (boto3's default chain: AWS_PROFILE, AWS_ACCESS_KEY_ID, "
                    f"an instance or pod role); they need the {ACTIONS}",
                    ErrorKind.INVALID_INPUT,
                ) from None
            except EndpointConnectionError as err:
                raise RetryableError(
                    f"cannot reach {err.kwargs.get('endpoint_url', 'the endpoint')}"
                ) from None
            except BotoCoreError as err:
                raise PriceSourceError(f"{what}: {err}") from None

        return with_retries(once, what, self.pacing)

    def _ondemand(self, pricing: Any, region: str) -> dict[str, float]:
        """Instance type -> on-demand USD per hour in ``region`` (Pricing API, all pages)."""
        filters = [
            {"Type": "TERM_MATCH", "Field": field, "Value": value}
            for field, value in (
                ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
                ("preInstalledSw", "NA"), ("capacitystatus", "Used"), ("marketoption", "OnDemand"),
                ("productFamily", "Compute Instance"),
            )
        ]  # fmt: skip
        filters.append(
            {"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(sorted(self.types.values()))}
        )
        out: dict[str, float] = {}
        token: str | None = None
        for page in range(1, MAX_PAGES + 1):
            kwargs: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": filters, "MaxResults": 100}
            if token:
                kwargs["NextToken"] = token
            answer = self._call(f"pricing:GetProducts for {region}", pricing.get_products, **kwargs)
            for n, doc in enumerate(answer.get("PriceList", []), start=1):
                found = self._ondemand_item(doc, f"{ONDEMAND_SOURCE}: {region} page {page} item {n}")
                if found is not None:
                    out[found[0]] = found[1]
            token = answer.get("NextToken")
            if not token:
                self.pacing.progress(f"aws {region}: {page} page(s) of on-demand prices, {len(out)} types")
                return out
        raise PriceSourceError(
            f"{ONDEMAND_SOURCE}: {region}: more than {MAX_PAGES} pages: NextToken runs away"
        )

    def _ondemand_item(self, doc: Any, where: str) -> tuple[str, float] | None:
        """(type, USD per hour) of one PriceList document; None for a type not asked for."""
        try:
            item = json.loads(doc) if isinstance(doc, str) else doc
            name = self.types.get(normalize(item["product"]["attributes"]["instanceType"]))
            if name is None:
                return None
            for term in item["terms"]["OnDemand"].values():
                for dimension in term["priceDimensions"].values():
                    usd = float(dimension["pricePerUnit"]["USD"])
                    if usd != 0 and dimension.get("unit", "Hrs") == "Hrs":
                        return name, usd
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as err:
            raise PriceSourceError(
                f"{where}: malformed price document ({type(err).__name__}: {err}): {str(doc)[:200]}"
            ) from None
        return None

    def _spot(self, ec2: Any, region: str) -> dict[tuple[str, str], float]:
        """(type, zone) -> the newest spot USD per hour in ``region`` (all pages)."""
        newest: dict[tuple[str, str], tuple[datetime, float]] = {}
        token: str | None = None
        for page in range(1, MAX_PAGES + 1):
            kwargs: dict[str, Any] = {
                "InstanceTypes": sorted(self.types.values()),
                "ProductDescriptions": PRODUCT_DESCRIPTIONS,
                "StartTime": datetime.now(UTC),
                "MaxResults": 1000,
            }
            if token:
                kwargs["NextToken"] = token
            answer = self._call(
                f"ec2:DescribeSpotPriceHistory in {region}", ec2.describe_spot_price_history, **kwargs
            )
            for n, record in enumerate(answer.get("SpotPriceHistory", []), start=1):
                try:
                    name = self.types.get(normalize(record["InstanceType"]))
                    zone, usd, stamp = (
                        record["AvailabilityZone"],
                        float(record["SpotPrice"]),
                        record["Timestamp"],
                    )
                except (KeyError, TypeError, ValueError) as err:
                    raise PriceSourceError(
                        f"{SPOT_SOURCE}: {region} page {page} record {n}: malformed ({type(err).__name__}: {err}): {str(record)[:200]}"
                    ) from None
                if name is not None and ((name, zone) not in newest or stamp > newest[(name, zone)][0]):
                    newest[(name, zone)] = (stamp, usd)
            token = answer.get("NextToken")
            if not token:
                return {key: usd for key, (_, usd) in newest.items()}
        raise PriceSourceError(f"{SPOT_SOURCE}: {region}: more than {MAX_PAGES} pages: NextToken runs away")
