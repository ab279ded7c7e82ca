"""The suite runs as one ``pytest tests e2e``: both folders go on ``sys.path`` (pytest's prepend
import mode), so a module name in both would be imported from the first folder only."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_name_is_in_both_test_folders() -> None:
    tests = {p.stem for p in (ROOT / "tests").glob("*.py")} - {"conftest", "__init__"}
    e2e = {p.stem for p in (ROOT / "e2e").glob("*.py")} - {"conftest", "__init__"}
    assert not tests & e2e, f"rename one of each: {sorted(tests & e2e)}"


def test_no_test_module_imports_a_conftest() -> None:
    offenders = [
        p.relative_to(ROOT).as_posix()
        for folder in ("tests", "e2e")
        for p in (ROOT / folder).glob("*.py")
        if p.name != Path(__file__).name and any(
            line.startswith(("from conftest import", "import conftest")) for line in p.read_text().splitlines()
        )
    ]
    assert not offenders, f"import shared helpers from a uniquely named module instead: {offenders}"


def test_no_test_module_is_imported_as_a_library() -> None:
    """Helpers live in helper modules (``e2e/operator_helpers.py``, ``tests/cli_helpers.py`` ...), and
    TrainingJob manifests come from :mod:`gpuscaler.testing`: a test module imports no test module."""
    offenders = [
        f"{p.relative_to(ROOT).as_posix()}: {line.strip()}"
        for folder in ("tests", "e2e", "benchmarks", "scripts")
        for p in (ROOT / folder).glob("*.py")
        for line in p.read_text().splitlines()
        if line.lstrip().startswith(("from test_", "import test_"))
    ]
    assert not offenders, f"move the helpers into a helper module: {offenders}"
