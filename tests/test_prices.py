"""Price files, the multi-region catalog and planning on live prices (``--prices FILE``).

The price file's round trip, :func:`apply_prices` (a known type priced in a new region, per-zone
spot, precedence over the shipped table and under a policy's override), every way a file can fail
to be a price file (each a clear message and exit 2), an atomic write that leaves the old file
whole, and the CLI: ``plan --json`` names the source and day of every plan's price, the text says
how old it is, ``catalog instances`` shows them, ``estimate`` prices its configuration.
"""

from __future__ import annotations

import json
import os
from datetime import date
from pathlib import Path

import pytest

from gpuscaler.api import TrainingJobSpec
from gpuscaler.catalog import CapacityType, load_catalog
from gpuscaler.catalog.loader import UnknownRegionError
from gpuscaler.catalog.models import SHIPPED_SOURCE
from gpuscaler.catalog.prices import (
    PRICE_COLUMNS,
    Price,
    PriceFileError,
    PriceTable,
    apply_prices,
    price_note,
    shipped_prices,
)
from gpuscaler.cli import main
from gpuscaler.planner import Reason, plan
from gpuscaler.policy import Policy

CATALOG = load_catalog()
TODAY = date(2026, 12, 6)
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trainingjob.yaml"
OD, SPOT = CapacityType.ON_DEMAND, CapacityType.SPOT


def aws(
    name: str, region: str, cap: CapacityType, usd: float, zone: str = "", day: str = "2026-12-05"
) -> Price:
    source = "aws-pricing-api" if cap is OD else "aws-spot-price-history"
    return Price("aws", region, zone, name, cap, usd, day, source)


LIVE = PriceTable([
    aws("p4d.24xlarge", "us-east-1", OD, 21.0),
    aws("p4d.24xlarge", "us-east-1", SPOT, 9.5, "us-east-1a"),
    aws("p4d.24xlarge", "us-east-1", SPOT, 8.25, "us-east-1b"),
    aws("p4d.24xlarge", "eu-west-1", OD, 23.5),
    aws("p4d.24xlarge", "eu-west-1", SPOT, 7.0, "eu-west-1c"),
])  # fmt: skip


def test_catalog_holds_a_type_in_several_regions() -> None:
    cat = apply_prices(CATALOG, LIVE)
    assert cat.instance("p4d.24xlarge").region == "us-east-1"  # the first (shipped) region
    eu = cat.instance("p4d.24xlarge", "eu-west-1")
    assert (eu.region, eu.gpu_id, eu.gpu_count) == ("eu-west-1", "A100-40GB", 8)  # facts from the catalog
    assert cat.instances.regions("p4d.24xlarge") == ["us-east-1", "eu-west-1"]
    assert len(cat.instances) == len(CATALOG.instances) + 1
    with pytest.raises(
        UnknownRegionError, match=r"'ap-south-1' for instance type p4d.24xlarge; did you mean"
    ):
        cat.instance("p4d.24xlarge", "ap-south-1")
    assert CATALOG.instances.regions("p4d.24xlarge") == ["us-east-1"]  # the shipped catalog is not changed


def test_apply_prices_takes_live_prices_and_the_cheapest_zone() -> None:
    cat = apply_prices(CATALOG, LIVE)
    us = cat.instance("p4d.24xlarge", "us-east-1")
    assert us.ondemand_usd_hr == 21.0 and us.spot_usd_hr == 8.25
    assert us.spot_zones == (("us-east-1a", 9.5), ("us-east-1b", 8.25))
    assert (us.price_source(OD), us.price_source(SPOT)) == ("aws-pricing-api", "aws-spot-price-history")
    assert us.price_date_of(SPOT) == "2026-12-05"
    assert (
        us.interruption_bucket == CATALOG.instance("p4d.24xlarge").interruption_bucket
    )  # Spot Advisor's stays
    g5 = cat.instance("g5.xlarge")  # not in the table: the shipped price, marked so
    assert g5 == CATALOG.instance("g5.xlarge") and g5.price_source(OD) == SHIPPED_SOURCE


def test_a_live_azure_spot_price_drops_the_shipped_rows_suspicion() -> None:
    name = "Standard_NC24ads_A100_v4"
    assert CATALOG.instance(name).spot_price_suspect
    live = PriceTable([Price("azure", "eastus", "", name, SPOT, 1.47, "2026-12-05", "azure-retail-prices")])
    inst = apply_prices(CATALOG, live).instance(name)
    assert not inst.spot_price_suspect and inst.spot_usd_hr == 1.47
    assert inst.ondemand_source == SHIPPED_SOURCE and inst.spot_source == "azure-retail-prices"


def test_implausibly_cheap_spot_is_flagged_and_not_planned_on() -> None:
    """moto's EC2 answers every spot price as $0.00001: flagged, so the planner leaves it out."""
    moto_like = PriceTable([aws("g5.xlarge", "us-east-1", SPOT, 0.00001, "us-east-1a")])
    cat = apply_prices(CATALOG, moto_like)
    assert cat.instance("g5.xlarge").spot_price_suspect
    spec = TrainingJobSpec.model_validate(
        {"workload": {"model": "resnet50"}, "globalBatch": 256, "training": {"samples": 1e6},
         "constraints": {"instanceTypes": ["g5.xlarge"]}}
    )  # fmt: skip
    result = plan(spec, cat, Policy())
    assert result.chosen is not None and result.chosen.capacity is OD
    flagged = [r for r in result.rejected if r.instance == "g5.xlarge" and r.capacity == "spot"]
    assert flagged and flagged[0].category is Reason.PRICE


def test_price_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "prices.csv"
    LIVE.write_atomic(str(path), CATALOG)
    text = path.read_text()
    assert text.startswith("# schema: 1\n")
    header = next(ln for ln in text.splitlines() if not ln.startswith("#"))
    assert tuple(header.split(",")) == PRICE_COLUMNS
    assert "p4d.24xlarge,aws,eu-west-1,,A100-40GB,8,96,1152,400,23.5,,,2," in text  # facts from the catalog
    back = PriceTable.read(str(path), TODAY)
    assert sorted(back.rows, key=lambda p: p.key) == sorted(LIVE.rows, key=lambda p: p.key)
    shipped = shipped_prices(CATALOG)
    assert (
        apply_prices(CATALOG, PriceTable.from_csv(shipped.to_csv(CATALOG), "x", TODAY))
        .instance("a2-highgpu-1g")
        .spot_usd_hr
        == CATALOG.instance("a2-highgpu-1g").spot_usd_hr
    )


HEADER = "# schema: 1\n" + ",".join(PRICE_COLUMNS) + "\n"
ROW = "p4d.24xlarge,aws,us-east-1,,,,,,,{od},{spot},,,{day},aws-pricing-api\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"first line must be '# schema: 1'.*is .* a price file\?"),
        ('{"prices": []}', r"first line must be '# schema: 1'"),
        ("\x00\x01PK", r"not a price file \(binary data\)"),
        (
            "# schema: 1\nname,provider,region\np4d.24xlarge,aws,us-east-1\n",
            r"missing column\(s\) zone, ondemand_usd_hr",
        ),
        (HEADER, r"no prices in it"),
        (
            HEADER + ROW.format(od="-3", spot="", day="2026-12-05"),
            r"ondemand_usd_hr '-3' must be a positive price",
        ),
        (HEADER + ROW.format(od="0", spot="", day="2026-12-05"), r"ondemand_usd_hr '0' must be a positive"),
        (HEADER + ROW.format(od="nan", spot="", day="2026-12-05"), r"'nan' must be a positive"),
        (HEADER + ROW.format(od="cheap", spot="", day="2026-12-05"), r"'cheap' is not a number"),
        (HEADER + ROW.format(od="", spot="", day="2026-12-05"), r"neither ondemand_usd_hr nor spot_usd_hr"),
        (HEADER + ROW.format(od="21", spot="", day="last week"), r"price_date 'last week' is not a day"),
        (HEADER + ROW.format(od="21", spot="", day="2027-03-01"), r"2027-03-01 is in the future"),
        (
            HEADER + ROW.format(od="21", spot="", day="2026-12-05") * 2,
            r"on-demand in us-east-1 is priced twice",
        ),
        (
            HEADER + ROW.format(od="21", spot="", day="2026-12-05").replace(",aws,", ",ibm,"),
            r"provider 'ibm'",
        ),
        (
            HEADER + ROW.format(od="21", spot="", day="2026-12-05").replace("pricing-api", "a,b"),
            r"more fields",
        ),
        (
            HEADER + ROW.format(od="21", spot="", day="2026-12-05").replace("us-east-1", "us east"),
            r"region 'us east' is not a region name of aws",
        ),
        (
            HEADER + ROW.format(od="", spot="7", day="2026-12-05").replace("us-east-1,,", "us-east-1,eu-west-1a,"),
            r"zone 'eu-west-1a' is not in region us-east-1",
        ),
    ],
)
def test_what_is_not_a_price_file_is_refused(text: str, message: str) -> None:
    with pytest.raises(PriceFileError, match=message):
        PriceTable.from_csv(text, "p.csv", TODAY)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [aws("p4d.24xlarg", "us-east-1", OD, 21.0)],
            r"unknown instance 'p4d.24xlarg'; did you mean p4d.24xlarge",
        ),
        (
            [Price("gcp", "us-east-1", "", "p4d.24xlarge", OD, 21.0, "2026-12-05", "x")],
            r"the catalog has it on aws",
        ),
        (
            [aws("p4d.24xlarge", "eu-west-1", SPOT, 7.0, "eu-west-1a")],
            r"a region the catalog lacks needs an on-demand",
        ),
        ([aws("p4d.24xlarge", "us-east-1", OD, 0.2)], r"\$0.025 per GPU-hour, outside the plausible"),
        ([aws("g5.xlarge", "us-east-1", OD, 250.0)], r"outside the plausible"),
    ],
)
def test_prices_the_catalog_cannot_take_are_refused(rows: list[Price], message: str) -> None:
    with pytest.raises(PriceFileError, match=message):
        apply_prices(CATALOG, PriceTable(rows, "p.csv"))


def test_a_failed_write_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "prices.csv"
    path.write_text("old\n")

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(PriceFileError, match="No space left on device"):
        LIVE.write_atomic(str(path), CATALOG)
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["prices.csv"]  # no temporary file left behind


def _plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["plan", str(EXAMPLE), "--json", *args]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_plan_json_names_each_plans_price_source_and_day(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = _plan_json(capsys)
    plans = [shipped["chosen"], *shipped["pareto"]]  # type: ignore[list-item]
    assert {(p["priceSource"], p["priceDate"][:4]) for p in plans} <= {
        (SHIPPED_SOURCE, "2026"),
        (SHIPPED_SOURCE, "unda"),
    }
    chosen = shipped["chosen"]
    assert isinstance(chosen, dict)
    # the chosen plan's type at a live price 20% under the shipped one: the plan says so
    cap = CapacityType(chosen["capacityType"])
    inst = CATALOG.instance(chosen["instanceType"])
    live = inst.price(cap)
    assert live is not None
    day = date.today().isoformat()
    source = "aws-spot-price-history" if cap is SPOT else "aws-pricing-api"
    zone = f"{inst.region}a" if cap is SPOT else ""
    table = PriceTable(
        [Price(inst.provider, inst.region, zone, inst.name, cap, round(live * 0.8, 4), day, source)]
    )
    path = tmp_path / "prices.csv"
    table.write_atomic(str(path), CATALOG)
    priced = _plan_json(capsys, "--prices", str(path))
    again = priced["chosen"]
    assert isinstance(again, dict)
    assert (again["instanceType"], again["priceSource"], again["priceDate"]) == (inst.name, source, day)
    assert again["usdPerHour"] == pytest.approx(round(live * 0.8, 4) * again["nodes"], rel=1e-6)
    for p in priced["pareto"]:  # type: ignore[attr-defined]
        expected = (
            source if (p["instanceType"], p["capacityType"]) == (inst.name, cap.value) else SHIPPED_SOURCE
        )
        assert p["priceSource"] == expected
    assert main(["plan", str(EXAMPLE), "--prices", str(path)]) == 0
    assert f"price: {source}, read {day}, 0 days old\n" in capsys.readouterr().out


def test_a_policy_override_is_named_as_the_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: negotiated\npriceOverrides:\n  - instanceType: '*'\n    discountPct: 30\n")
    data = _plan_json(capsys, "--policy", str(policy))
    chosen = data["chosen"]
    assert isinstance(chosen, dict)
    if chosen["capacityType"] == "on-demand":
        assert (chosen["priceSource"], chosen["priceDate"]) == ("policy-override", "")
    ondemand = [p for p in data["pareto"] if p["capacityType"] == "on-demand"]  # type: ignore[attr-defined]
    assert ondemand and all(p["priceSource"] == "policy-override" for p in ondemand)


def test_price_note_says_how_old() -> None:
    assert price_note("aws-pricing-api", "2026-12-05", TODAY) == "aws-pricing-api, read 2026-12-05, 1 day old"
    old = price_note(SHIPPED_SOURCE, "2026-07-20", TODAY)
    assert old.startswith("shipped-table, dated 2026-07-20, 139 days old: stale (`gpuscaler catalog refresh`")
    assert "age unknown: stale" in price_note(SHIPPED_SOURCE, "undated-skypilot-v6", TODAY)


def test_catalog_instances_shows_price_source_and_age(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prices.csv"
    LIVE.write_atomic(str(path), CATALOG)
    assert main(["catalog", "instances", "--prices", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "age" in lines[0] and "source" in lines[0]
    eu = next(ln for ln in lines if "eu-west-1" in ln)
    assert "aws-pricing-api / aws-spot-price-history" in eu and "2026-12-05" in eu
    assert "shipped-table" in next(ln for ln in lines if ln.startswith("g5.xlarge"))
    assert main(["catalog", "instances", "--json", "--prices", str(path)]) == 0
    rows = json.loads(capsys.readouterr().out)["instances"]
    eu_row = next(r for r in rows if r["region"] == "eu-west-1")
    assert eu_row["spot_source"] == "aws-spot-price-history" and eu_row["spot_zones"] == [["eu-west-1c", 7.0]]
    assert eu_row["ondemand_age_days"] == (date.today() - date(2026, 12, 5)).days


def test_estimate_prices_its_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "prices.csv"
    LIVE.write_atomic(str(path), CATALOG)
    args = ["estimate", "--workload", "resnet50", "--gpu", "A100-40GB", "--gpus", "16", "--nodes", "2"]
    assert main([*args, "--json", "--prices", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {(r["region"], r["capacityType"]): r for r in data["prices"]}
    assert rows[("eu-west-1", "on-demand")]["usdPerHour"] == 47.0  # 2 nodes x $23.50
    assert rows[("us-east-1", "spot")]["priceSource"] == "aws-spot-price-history"
    per_million = rows[("eu-west-1", "on-demand")]["usdPerMillion"]
    assert per_million == pytest.approx(47.0 / (3600 * data["throughput"]) * 1e6, rel=1e-3)
    assert main([*args, "--prices", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "spot on p4d.24xlarge (eu-west-1): $14.00/h" in out
        and "aws-spot-price-history, read 2026-12-05" in out
    )
    assert ("prices are stale" in out) is (date.today() > date(2026, 12, 12))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "price shipped-table, dated 2026-07-20" in out and "prices are stale" in out


@pytest.mark.parametrize("command", [["plan", str(EXAMPLE)], ["catalog", "instances"]])
def test_a_bad_price_file_exits_2_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    path = tmp_path / "prices.csv"
    path.write_text("instance,price\np4d,1\n")
    assert main([*command, "--prices", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert error["kind"] == "invalid-input" and "first line must be '# schema: 1'" in error["message"]
    assert main([*command, "--prices", str(tmp_path / "missing.csv")]) == 2
    assert "cannot read the price file" in capsys.readouterr().err


def test_a_policy_may_name_a_region_the_price_file_adds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, policy = tmp_path / "prices.csv", tmp_path / "policy.yaml"
    LIVE.write_atomic(str(path), CATALOG)
    policy.write_text("name: eu-only\nregions: [eu-west-1]\n")
    assert main(["plan", str(EXAMPLE), "--json", "--policy", str(policy)]) == 2  # the shipped table has no eu-west-1
    assert "eu-west-1" in capsys.readouterr().err
    assert main(["plan", str(EXAMPLE), "--json", "--policy", str(policy), "--prices", str(path)]) == 0
    chosen = json.loads(capsys.readouterr().out)["chosen"]
    assert (chosen["instanceType"], chosen["region"]) == ("p4d.24xlarge", "eu-west-1")
    assert chosen["priceDate"] == "2026-12-05" and chosen["priceSource"].startswith("aws-")
