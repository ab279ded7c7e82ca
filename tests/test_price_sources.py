"""The live price sources against recorded answers in each API's real shape, and ``catalog refresh``.

AWS: the Pricing API through botocore's ``Stubber`` (moto does not serve it), EC2's spot price
history from moto (every spot price $0.00001: flagged, not planned on) and from a ``Stubber`` for
the newest-per-zone rule. Azure and GCP: recorded JSON pages (``tests/fixtures/prices``) served
from a loopback HTTP server, so the real HTTP client code runs, with the endpoints set through
``GPUSCALER_AZURE_PRICES_URL`` / ``GPUSCALER_GCP_BILLING_URL``. Faults: malformed and truncated
pages, throttling (retried with backoff, then a clear failure), unreachable endpoints, missing or
refused credentials, unknown regions, implausible prices; a failed refresh writes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from moto import mock_aws

from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.catalog.prices import Price, PriceTable, apply_prices
from gpuscaler.cli import main
from gpuscaler.cloud.pricing import Pacing, PriceSourceError
from gpuscaler.cloud.pricing.aws import ONDEMAND_SOURCE, SPOT_SOURCE, AwsPriceSource, boto3_clients
from gpuscaler.cloud.pricing.azure import AzurePriceSource
from gpuscaler.cloud.pricing.gcp import GcpPriceSource
from gpuscaler.cloud.pricing.refresh import refresh, vet
from gpuscaler.errors import ErrorKind
from price_server import FIXTURES, Answer, free_port, page, serve

CATALOG = load_catalog()
OD, SPOT = CapacityType.ON_DEMAND, CapacityType.SPOT
TODAY = date.today().isoformat()


def prices(table: PriceTable) -> dict[tuple[str, str, str, CapacityType], float]:
    return {(p.instance_type, p.region, p.zone, p.capacity): p.usd_per_hour for p in table.rows}


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


# ------------------------------------------------------------------------------------------ Azure

AZURE_TYPES = [i.name for i in CATALOG.instances if i.provider == "azure"]


def azure_pages(base: str) -> Any:
    def handler(path: str, query: dict[str, list[str]]) -> Answer:
        assert path == "/api/retail/prices"
        if "$skip" in query:
            return 200, {}, page("azure_eastus_page2.json", base)
        filt = query["$filter"][0]
        if "armRegionName eq 'eastus'" in filt:
            return 200, {}, page("azure_eastus_page1.json", base)
        return 200, {}, b'{"Items": [], "NextPageLink": null, "Count": 0}'

    return handler


@pytest.fixture
def azure(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    box: dict[str, Any] = {}
    with serve(lambda p, q: box["handler"](p, q)) as server:  # noqa: PLW0108 (the handler is set below)
        box["handler"] = azure_pages(server.base)
        monkeypatch.setenv("GPUSCALER_AZURE_PRICES_URL", f"{server.base}/api/retail/prices")
        server.box = box  # type: ignore[attr-defined]
        yield server


def test_azure_reads_linux_pay_as_you_go_and_spot_over_pages(azure: Any) -> None:
    table = AzurePriceSource(AZURE_TYPES).fetch(["eastus"])
    got = prices(table)
    assert got == {
        (
            "Standard_NC24ads_A100_v4",
            "eastus",
            "",
            OD,
        ): 3.673,  # newest row; not Windows, DevTest, reservation
        ("Standard_NC24ads_A100_v4", "eastus", "", SPOT): 1.4692,  # the " Spot" meter; not Low Priority
        ("Standard_NC4as_T4_v3", "eastus", "", OD): 0.526,
        ("Standard_NC4as_T4_v3", "eastus", "", SPOT): 0.2104,
        ("Standard_ND96asr_v4", "eastus", "", OD): 27.197,  # page 2, through NextPageLink
        ("Standard_ND96asr_v4", "eastus", "", SPOT): 10.8788,
    }
    assert {(p.price_date, p.source) for p in table.rows} == {(TODAY, "azure-retail-prices")}
    (path, first), second = azure.requests[0], azure.requests[1]
    assert path == "/api/retail/prices" and first["api-version"] == ["2023-01-01-preview"]
    filt = first["$filter"][0]
    for part in ("serviceName eq 'Virtual Machines'", "priceType eq 'Consumption'", "armRegionName eq 'eastus'",
                 "armSkuName eq 'Standard_ND96asr_v4'"):  # fmt: skip
        assert part in filt
    assert second[0] == "/api/retail/prices" and second[1]["$skip"] == ["100"] and len(azure.requests) == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (lambda b: page("azure_eastus_page1.json", b)[:900], r"malformed page .*not JSON"),
        (lambda b: b'["not", "an", "object"]', r"a JSON list, not an object"),
        (lambda b: b'{"Items": {"a": 1}, "NextPageLink": null}', r"malformed page: no Items list"),
        (
            lambda b: b'{"Items": [{"armSkuName": "Standard_NC4as_T4_v3"}], "NextPageLink": null}',
            r"malformed item",
        ),
        (
            lambda b: b'{"Items": [], "NextPageLink": "' + b.encode() + b'/api/retail/prices?$skip=0"}',
            r"loops",
        ),
    ],
)
def test_azure_refuses_malformed_pages(azure: Any, body: Any, message: str) -> None:
    azure.box["handler"] = lambda path, query: (200, {}, body(azure.base))
    with pytest.raises(PriceSourceError, match=message) as err:
        AzurePriceSource(AZURE_TYPES, pacing=Pacing(attempts=1)).fetch(["eastus"])
    assert err.value.kind is ErrorKind.TEMPORARY


def test_throttling_is_retried_with_backoff_then_fails_clearly(azure: Any) -> None:
    answers = iter([429, 503])
    good = azure_pages(azure.base)
    azure.box["handler"] = lambda p, q: (
        (next(answers, 200), {"Retry-After": "0"}, b"{}")
        if "$skip" not in q and len(azure.requests) <= 2
        else good(p, q)
    )
    sleeps = Sleeps()
    table = AzurePriceSource(AZURE_TYPES, pacing=Pacing(backoff_s=0.5, sleep=sleeps)).fetch(["eastus"])
    assert len(table.rows) == 6
    waits = [s for s in sleeps if s > 0]
    assert len(waits) == 2 and 0.5 <= waits[0] <= 0.625 and 1.0 <= waits[1] <= 1.25  # doubled, with jitter
    azure.box["handler"] = lambda p, q: (429, {}, b'{"error": "slow down"}')
    with pytest.raises(PriceSourceError, match=r"HTTP 429 .*gave up after 3 attempts") as err:
        AzurePriceSource(AZURE_TYPES, pacing=Pacing(attempts=3, sleep=Sleeps())).fetch(["eastus"])
    assert err.value.kind is ErrorKind.TEMPORARY


def test_an_unreachable_endpoint_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}/api/retail/prices"
    monkeypatch.setenv("GPUSCALER_AZURE_PRICES_URL", url)
    with pytest.raises(
        PriceSourceError, match=r"cannot reach http://127.0.0.1:\d+/api/retail/prices.*gave up after 2"
    ):
        AzurePriceSource(AZURE_TYPES, pacing=Pacing(attempts=2, sleep=Sleeps())).fetch(["eastus"])


# -------------------------------------------------------------------------------------------- GCP

GCP_INSTANCES = {i.name: i for i in reversed(list(CATALOG.instances)) if i.provider == "gcp"}.values()


@pytest.fixture
def gcp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def handler(path: str, query: dict[str, list[str]]) -> Answer:
        assert path == "/v1/services/6F81-5844-456A/skus"
        if query.get("key") != ["test-key"]:
            return 403, {}, b'{"error": {"code": 403, "message": "API key not valid"}}'
        name = "gcp_skus_page2.json" if query.get("pageToken") == ["page-2"] else "gcp_skus_page1.json"
        return 200, {}, (FIXTURES / name).read_bytes()

    with serve(handler) as server:
        monkeypatch.setenv("GPUSCALER_GCP_BILLING_URL", server.base)
        monkeypatch.setenv("GPUSCALER_GCP_API_KEY", "test-key")
        yield server


def test_gcp_prices_a_vm_as_cores_plus_ram_plus_gpus(gcp: Any) -> None:
    table = GcpPriceSource(GCP_INSTANCES).fetch(["us-central1"])
    got = prices(table)
    a2 = got[("a2-highgpu-1g", "us-central1", "", OD)]
    assert a2 == pytest.approx(
        12 * 0.031611 + 85 * 0.004237 + 2.933908
    )  # the Tesla A100 SKU, not the 80GB one
    assert got[("a2-highgpu-8g", "us-central1", "", OD)] == pytest.approx(
        96 * 0.031611 + 680 * 0.004237 + 8 * 2.933908
    )
    assert got[("a2-highgpu-1g", "us-central1", "", SPOT)] == pytest.approx(
        12 * 0.012644 + 85 * 0.001695 + 1.1472
    )
    assert got[("g2-standard-4", "us-central1", "", OD)] == pytest.approx(
        4 * 0.024988 + 16 * 0.002927 + 0.56004
    )  # not DWS
    assert (
        "a3-highgpu-8g",
        "us-central1",
        "",
        OD,
    ) not in got  # no A3 or H100 SKU recorded: no price, not a guess
    assert (
        abs(a2 - CATALOG.instance("a2-highgpu-1g").ondemand_usd_hr) < 0.001
    )  # the fixture is near the shipped price
    assert [q.get("pageToken") for _, q in gcp.requests] == [None, ["page-2"]]
    assert all(q["currencyCode"] == ["USD"] for _, q in gcp.requests)
    assert {(p.price_date, p.source) for p in table.rows} == {(TODAY, "gcp-cloud-billing")}


def test_gcp_credentials_missing_or_refused(gcp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSCALER_GCP_API_KEY")
    with pytest.raises(
        PriceSourceError, match=r"no credentials: .*GPUSCALER_GCP_API_KEY.*GPUSCALER_GCP_ACCESS_TOKEN"
    ) as err:
        GcpPriceSource(GCP_INSTANCES).fetch(["us-central1"])
    assert err.value.kind is ErrorKind.INVALID_INPUT and not gcp.requests
    with pytest.raises(
        PriceSourceError, match=r"refused the request \(HTTP 403: .*API key not valid.*it needs an API key"
    ) as err:
        GcpPriceSource(GCP_INSTANCES, api_key="wrong").fetch(["us-central1"])
    assert err.value.kind is ErrorKind.INVALID_INPUT
    assert gcp.requests[0][1]["key"] == ["wrong"]
    assert "wrong" not in str(err.value)  # an API key never reaches a message


def test_gcp_refuses_a_malformed_sku(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = json.loads((FIXTURES / "gcp_skus_page1.json").read_text())
    del broken["skus"][2]["pricingInfo"]
    with serve(lambda p, q: (200, {}, json.dumps(broken).encode())) as server:
        source = GcpPriceSource(GCP_INSTANCES, base_url=server.base, api_key="k", pacing=Pacing(attempts=1))
        with pytest.raises(PriceSourceError, match=r"page 1: malformed SKU \(KeyError: 'pricingInfo'\)"):
            source.fetch(["us-central1"])


# -------------------------------------------------------------------------------------------- AWS

AWS_TYPES = sorted({i.name for i in CATALOG.instances if i.provider == "aws"})
PAGES = json.loads((FIXTURES / "aws_pricing_products.json").read_text())["pages"]
FILTERS = [
    {"Type": "TERM_MATCH", "Field": f, "Value": v}
    for f, v in (("regionCode", "us-east-1"), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
                 ("preInstalledSw", "NA"), ("capacitystatus", "Used"), ("marketoption", "OnDemand"),
                 ("productFamily", "Compute Instance"))
] + [{"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(AWS_TYPES)}]  # fmt: skip


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_PRICING", "AWS_ENDPOINT_URL_EC2", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def stubbed_pricing(pages: list[list[Any]] = PAGES) -> tuple[Any, Stubber]:
    client = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(client)
    for n, docs in enumerate(pages):
        expected: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": FILTERS, "MaxResults": 100}
        answer: dict[str, Any] = {"PriceList": [json.dumps(d) for d in docs], "FormatVersion": "aws_v1"}
        if n:
            expected["NextToken"] = f"token-{n}"
        if n < len(pages) - 1:
            answer["NextToken"] = f"token-{n + 1}"
        stub.add_response("get_products", answer, expected)
    return client, stub


def test_aws_on_demand_from_the_pricing_api_and_spot_per_zone_from_moto(
    aws_env: None, tmp_path: Path
) -> None:
    pricing, stub = stubbed_pricing()
    with mock_aws(), stub:
        made: list[tuple[str, str]] = []

        def clients(service: str, region: str) -> Any:
            made.append((service, region))
            return pricing if service == "pricing" else boto3_clients(service, region)

        source = AwsPriceSource(AWS_TYPES, clients=clients)
        table = source.fetch(["us-east-1"])
        stub.assert_no_pending_responses()
        assert made == [("pricing", "us-east-1"), ("ec2", "us-east-1")]
        got = prices(table)
        assert got[("p4d.24xlarge", "us-east-1", "", OD)] == 21.957642
        assert got[("p5.48xlarge", "us-east-1", "", OD)] == 55.04  # from the second page
        spot = {k: v for k, v in got.items() if k[3] is SPOT}
        assert spot and set(spot.values()) == {0.00001}  # what moto answers for every spot price
        assert {k[2][:-1] for k in spot} == {"us-east-1"}  # zones us-east-1a, -1b, ...
        assert {p.source for p in table.rows} == {ONDEMAND_SOURCE, SPOT_SOURCE}
        # the refresh flags moto's prices (under 10% of on-demand) and the planner leaves them out
        pricing, again = stubbed_pricing()
        with again:
            report = refresh(
                "aws",
                ["us-east-1"],
                str(tmp_path / "p.csv"),
                CATALOG,
                AwsPriceSource(AWS_TYPES, clients=clients),
            )
    assert report.flagged and all("flagged, the planner leaves it out" in f for f in report.flagged)
    catalog = apply_prices(CATALOG, PriceTable.read(str(tmp_path / "p.csv")))
    assert catalog.instance("p4d.24xlarge").spot_price_suspect
    assert catalog.instance("p4d.24xlarge").ondemand_usd_hr == 21.957642


def test_aws_spot_takes_the_newest_price_per_zone_over_pages(aws_env: None) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    stub = Stubber(ec2)
    now = datetime.now(UTC)

    def rec(zone: str, usd: str, hours_ago: float) -> dict[str, Any]:
        return {"AvailabilityZone": zone, "InstanceType": "p4d.24xlarge", "ProductDescription": "Linux/UNIX",
                "SpotPrice": usd, "Timestamp": now - timedelta(hours=hours_ago)}  # fmt: skip

    params = {"InstanceTypes": AWS_TYPES, "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
              "StartTime": ANY, "MaxResults": 1000}  # fmt: skip
    stub.add_response(
        "describe_spot_price_history",
        {"SpotPriceHistory": [rec("us-east-1a", "9.10", 5), rec("us-east-1b", "8.20", 1)], "NextToken": "n"},
        params,
    )
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [rec("us-east-1a", "9.70", 1), rec("us-east-1b", "7.00", 9)]}, {**params, "NextToken": "n"})  # fmt: skip
    pricing, pstub = stubbed_pricing()
    with stub, pstub:
        table = AwsPriceSource(AWS_TYPES, clients=lambda s, r: pricing if s == "pricing" else ec2).fetch(
            ["us-east-1"]
        )
    got = prices(table)
    assert got[("p4d.24xlarge", "us-east-1", "us-east-1a", SPOT)] == 9.70  # newer than 9.10
    assert got[("p4d.24xlarge", "us-east-1", "us-east-1b", SPOT)] == 8.20  # newer than 7.00
    cat = apply_prices(CATALOG, table)
    assert (
        cat.instance("p4d.24xlarge").spot_usd_hr == 8.20
        and not cat.instance("p4d.24xlarge").spot_price_suspect
    )


def test_aws_throttling_is_retried_then_fails_clearly(aws_env: None) -> None:
    pricing = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(pricing)
    for _ in range(2):
        stub.add_client_error("get_products", "ThrottlingException", "Rate exceeded", 400)
    stub.add_response("get_products", {"PriceList": [json.dumps(d) for d in PAGES[1]]})
    sleeps = Sleeps()
    source = AwsPriceSource(
        AWS_TYPES, clients=lambda s, r: pricing, pacing=Pacing(sleep=sleeps, backoff_s=1.0)
    )
    with stub:
        assert source._ondemand(pricing, "us-east-1") == {"p5.48xlarge": 55.04}
    assert len(sleeps) == 2 and sleeps[1] >= 2 * 1.0
    for _ in range(3):
        stub.add_client_error("get_products", "ThrottlingException", "Rate exceeded", 400)
    with (
        stub,
        pytest.raises(
            PriceSourceError, match=r"pricing:GetProducts for us-east-1: ThrottlingException.*gave up after 3"
        ) as err,
    ):
        AwsPriceSource(AWS_TYPES, pacing=Pacing(attempts=3, sleep=Sleeps()))._ondemand(pricing, "us-east-1")
    assert err.value.kind is ErrorKind.TEMPORARY


@pytest.mark.parametrize(
    ("fault", "message", "kind"),
    [
        (("AccessDeniedException", "not authorized"), r"refused it \(AccessDeniedException\).*pricing:GetProducts and ec2:DescribeSpotPriceHistory", ErrorKind.INVALID_INPUT),
        ("{\"product\": {\"attributes\": {\"instanceType\": \"p4d.24xl", r"item 1: malformed price document \(JSONDecodeError", ErrorKind.TEMPORARY),
        ({"product": {"attributes": {"instanceType": "p4d.24xlarge"}}, "terms": {"OnDemand": {"x": {"priceDimensions": {"y": {"pricePerUnit": {"USD": "cheap"}}}}}}}, r"malformed price document \(ValueError", ErrorKind.TEMPORARY),
    ],
)  # fmt: skip
def test_aws_refusals_and_malformed_documents(
    aws_env: None, fault: Any, message: str, kind: ErrorKind
) -> None:
    pricing = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(pricing)
    if isinstance(fault, tuple):
        stub.add_client_error("get_products", fault[0], fault[1], 400)
    else:
        stub.add_response(
            "get_products", {"PriceList": [fault if isinstance(fault, str) else json.dumps(fault)]}
        )
    with stub, pytest.raises(PriceSourceError, match=message) as err:
        AwsPriceSource(AWS_TYPES, clients=lambda s, r: pricing, pacing=Pacing(attempts=1)).fetch(
            ["us-east-1"]
        )
    assert err.value.kind is kind


def test_aws_endpoints_come_from_botocores_own_variables(
    aws_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", f"http://127.0.0.1:{port + 1 if port < 65535 else port}")
    assert boto3_clients("pricing", "us-east-1").meta.endpoint_url == f"http://127.0.0.1:{port}"
    assert boto3_clients("ec2", "eu-west-1").meta.endpoint_url.startswith("http://127.0.0.1:")
    with pytest.raises(PriceSourceError, match=rf"cannot reach http://127.0.0.1:{port}/.*gave up after 2"):
        AwsPriceSource(AWS_TYPES, pacing=Pacing(attempts=2, sleep=Sleeps())).fetch(["us-east-1"])


# ---------------------------------------------------------------------------------------- refresh


def test_vet_drops_what_is_not_a_price_and_flags_deep_spot() -> None:
    day = TODAY
    table = PriceTable([
        Price("aws", "us-east-1", "", "g5.xlarge", OD, 1.0, day, "t"),
        Price("aws", "us-east-1", "us-east-1a", "g5.xlarge", SPOT, 0.05, day, "t"),  # 5% of on-demand
        Price("aws", "us-east-1", "", "p4d.24xlarge", OD, -3.0, day, "t"),
        Price("aws", "us-east-1", "", "p5.48xlarge", OD, float("nan"), day, "t"),
        Price("aws", "us-east-1", "", "g6.xlarge", OD, 0.001, day, "t"),  # $0.001 per GPU-hour
        Price("aws", "eu-west-1", "eu-west-1a", "g6.xlarge", SPOT, 0.3, day, "t"),  # no on-demand there
    ])  # fmt: skip
    kept, dropped, flagged = vet(table, CATALOG)
    assert [(p.instance_type, p.capacity) for p in kept.rows] == [("g5.xlarge", OD), ("g5.xlarge", SPOT)]
    assert len(dropped) == 4 and any("$-3.0 is not a price" in d for d in dropped)
    assert any("outside the plausible" in d for d in dropped) and any(
        "no on-demand price in eu-west-1" in d for d in dropped
    )
    assert flagged == [
        "g5.xlarge spot in us-east-1a: $0.05/h is under 10% of on-demand $1/h: flagged, the planner leaves it out"
    ]


def test_refresh_writes_a_price_file_that_plans(
    azure: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "azure.csv"
    assert main(["catalog", "refresh", "--provider", "azure", "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["regions"] == ["eastus"] and summary["sources"] == ["azure-retail-prices"]
    assert (summary["onDemandPrices"], summary["spotPrices"], summary["priceDate"]) == (3, 3, TODAY)
    assert "refresh: azure eastus: 2 page(s), 6 prices" in captured.err  # progress on stderr
    table = PriceTable.read(str(out))
    assert {p.source for p in table.rows} == {"azure-retail-prices"}
    row = next(ln for ln in out.read_text().splitlines() if ln.startswith("Standard_NC24ads_A100_v4,"))
    assert row.startswith(
        "Standard_NC24ads_A100_v4,azure,eastus,,A100-80GB-PCIe,1,24,220,20,3.673,1.4692,60,2,"
    )
    cat = apply_prices(CATALOG, table)
    assert not cat.instance(
        "Standard_NC24ads_A100_v4"
    ).spot_price_suspect  # the live price replaces the flagged one
    assert main(["catalog", "instances", "--prices", str(out)]) == 0
    assert "azure-retail-prices" in capsys.readouterr().out


def test_a_failed_refresh_writes_nothing(
    azure: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "azure.csv"
    out.write_text("the last good copy\n")
    assert (
        main(
            ["catalog", "refresh", "--provider", "azure", "--regions", "eastsu", "--out", str(out), "--json"]
        )
        == 2
    )
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["kind"] == "invalid-input" and "'eastsu' (did you mean eastus?)" in error["message"]
    azure.box["handler"] = lambda p, q: (200, {}, page("azure_eastus_page1.json", azure.base)[:700])
    assert main(["catalog", "refresh", "--provider", "azure", "--out", str(out)]) == 2
    assert "malformed page" in capsys.readouterr().err
    assert out.read_text() == "the last good copy\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["azure.csv"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--provider", "aws", "--regions", "eu-wst-1"],
            r"'eu-wst-1' is not a region of aws; did you mean eu-west-1",
        ),
        (["--provider", "gcp", "--regions", "us central1"], r"is not a region of gcp"),
        (["--provider", "gcp", "--regions", ","], r"give one or more region names"),
        (["--provider", "ibm"], r"invalid choice 'ibm'"),
    ],
)
def test_refresh_refuses_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["catalog", "refresh", *args, "--out", str(tmp_path / "p.csv")]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "p.csv").exists()


def test_refresh_without_gcp_credentials_says_what_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUSCALER_GCP_API_KEY", raising=False)
    monkeypatch.delenv("GPUSCALER_GCP_ACCESS_TOKEN", raising=False)
    assert main(["catalog", "refresh", "--provider", "gcp", "--out", str(tmp_path / "p.csv"), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["kind"] == "invalid-input" and "GPUSCALER_GCP_API_KEY" in error["message"]
    assert not (tmp_path / "p.csv").exists()
