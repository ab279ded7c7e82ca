"""Imports for the runtime's real-framework tests: skip where the framework is absent, fail in CI.

``scripts/test.sh`` runs the suite in the venv of ``scripts/ci-torch-venv.sh`` (pinned torch,
transformers, Lightning) and sets ``GPUSCALER_REQUIRE_TORCH=1``: there a missing framework is a
failure with this message, never a silent skip. Elsewhere (a developer's venv without the
``train`` extra) the tests that need it are skipped with the same message.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_ENV = "GPUSCALER_REQUIRE_TORCH"


def need(module: str) -> ModuleType:
    """Import ``module`` for a test module, or skip it (fail when ``GPUSCALER_REQUIRE_TORCH=1``).

    Args:
        module: The module to import, e.g. ``torch``.

    Returns:
        The module.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        why = (
            f"{module} is not importable ({err}); install the pinned frameworks with "
            "pip install -e '.[dev,train]', or run scripts/test.sh (it uses scripts/ci-torch-venv.sh)"
        )
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 and {why}", pytrace=False)
        pytest.skip(why, allow_module_level=True)
