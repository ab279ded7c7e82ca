"""How deeply a decoded JSON or YAML document nests: one walk for every reader that caps it.

The input layer (:func:`gpuscaler.inputs.parse_json`, :data:`gpuscaler.inputs.MAX_DEPTH`) and the
checkpoint loader (:func:`gpuscaler.runtime.checkpoint_safety.read_manifest`) both refuse a document
nested past a limit. Like :mod:`gpuscaler.errors` it imports nothing, so the training container's
runtime can use it without the input layer's pydantic and YAML.
"""

from __future__ import annotations

from typing import Any


def nesting_depth(value: object, limit: int) -> int:
    """The depth of nested dicts and lists in ``value``, counted until it passes ``limit``.

    A scalar is depth 0, ``[]`` or ``{}`` depth 1, ``[[1]]`` depth 2. The walk is iterative (no
    recursion limit) and stops at the first container deeper than ``limit``, so a hostile
    document costs at most what it takes to find that container.

    Args:
        value: A decoded document (dicts, lists and scalars).
        limit: The deepest nesting the caller accepts.

    Returns:
        The depth, or the first depth above ``limit`` found (the caller refuses it either way).
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest
