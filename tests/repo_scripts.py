"""The repository's scripts and benchmarks as modules, for the tests that exercise them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(relative: str, name: str) -> ModuleType:
    """Import ``ROOT/relative`` (e.g. ``scripts/calibrate.py``) as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
