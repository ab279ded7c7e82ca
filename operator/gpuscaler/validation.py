"""User-facing messages for invalid input: a pydantic ValidationError as "field: problem (got value)".

Shared by the CLI's commands (``plan``, ``policy check``); depends on nothing of gpuscaler's own, so
every layer may use it.
"""

from __future__ import annotations

from pydantic import ValidationError


def format_validation(err: ValidationError, what: str) -> str:
    """``what is invalid:`` followed by one line per error: the field's dotted path, the problem and
    the value given (when it is a scalar).
    """
    lines = [f"{what} is invalid:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        value = e.get("input")
        shown = f" (got {value!r})" if value is not None and not isinstance(value, dict) else ""
        lines.append(f"  {loc}: {e['msg']}{shown}")
    return "\n".join(lines)
