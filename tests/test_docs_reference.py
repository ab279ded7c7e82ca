"""The docs site's generated reference pages (scripts/gen_reference.py) and the site's config."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_pages_are_current() -> None:
    gen = _generator()
    for name, make in gen.PAGES.items():
        page = ROOT / "docs" / "reference" / name
        assert page.is_file(), f"{page} missing: run python scripts/gen_reference.py"
        assert page.read_text() == make(), f"{page} is stale: run python scripts/gen_reference.py"


def test_check_names_a_stale_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = _generator()
    monkeypatch.setattr(gen, "OUT", tmp_path)
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    (tmp_path / "settings.md").write_text((tmp_path / "settings.md").read_text() + "hand edit\n")
    (tmp_path / "names.md").unlink()
    capsys.readouterr()
    assert gen.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "settings.md" in err and "names.md" in err and "cli.md" not in err


def test_every_setting_and_crd_field_is_documented() -> None:
    gen = _generator()
    from gpuscaler.settings import Settings

    settings = gen.settings_page()
    for name in Settings.model_fields:
        assert f"`GPUSCALER_{name.upper()}`" in settings
    crds = gen.crds_page()
    trainingjob = yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text())
    spec = trainingjob["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for field in spec:
        assert f"`spec.{field}`" in crds


def test_cli_page_lists_every_command() -> None:
    gen = _generator()
    from gpuscaler.cli import build_parser

    page = gen.cli_page()
    for name, _ in gen._subparsers(build_parser()):
        assert f"## `gpuscaler {name}`" in page


def test_site_nav_points_at_existing_pages() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [p for item in nav for p in pages(item)]
        if isinstance(nav, dict):
            return [p for value in nav.values() for p in pages(value)]
        return []

    listed = pages(config["nav"])
    assert listed
    for page in listed:
        assert (ROOT / "docs" / page).is_file(), f"mkdocs.yml nav names {page}, which is not under docs/"
