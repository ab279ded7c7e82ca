"""The package root of ``gpuscaler.runtime`` exports what a training script uses, and only that.

A script (``examples/train/train_ddp.py``, docs/runtime.md) gets the guard, the reporter, the plan,
the agreement hook, the opt-in pickle callbacks, the errors it may catch and the exit codes from
the root; everything else is imported from its submodule, so the root stays a small, stable API.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

from gpuscaler import runtime

ROOT = Path(__file__).resolve().parents[1]


def root_imports(path: Path) -> set[str]:
    """Names a file imports from ``gpuscaler.runtime`` itself (not from its submodules)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "gpuscaler.runtime":
            names |= {a.name for a in node.names}
    return names


def test_every_exported_name_resolves_and_comes_from_a_submodule() -> None:
    assert len(runtime.__all__) <= 12
    for name in runtime.__all__:
        value = getattr(runtime, name)
        home = getattr(value, "__module__", None)
        if home is not None:  # classes and functions: defined in a submodule, re-exported here
            assert home.startswith("gpuscaler.runtime.") and getattr(importlib.import_module(home), name) is value


def test_what_scripts_tests_and_docs_import_from_the_root_is_exported() -> None:
    files = [*ROOT.glob("examples/train/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("e2e/*.py"),
             *ROOT.glob("benchmarks/*.py"), *ROOT.glob("operator/gpuscaler/**/*.py")]  # fmt: skip
    used = set().union(*(root_imports(f) for f in files)) - {"constants"}  # the module, as ``rc``
    assert used and used <= set(runtime.__all__), used - set(runtime.__all__)
    for block in (ROOT / "docs" / "runtime.md").read_text().split("```python")[1:]:
        code = block.split("```")[0]
        for line in code.splitlines():
            if line.startswith("from gpuscaler.runtime import "):
                assert set(line.split(" import ")[1].replace(" ", "").split(",")) <= set(runtime.__all__), line


def test_the_root_imports_no_framework_and_no_kubernetes_client() -> None:
    code = "import sys, gpuscaler.runtime; print(sorted(m for m in ('torch', 'kubernetes', 'prometheus_client') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
