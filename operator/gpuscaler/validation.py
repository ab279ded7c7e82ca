"""User-facing messages for invalid input: a pydantic ValidationError as "field: problem (got value)".

The implementation lives in :mod:`gpuscaler.inputs` (the input layer); this name stays for callers
that import it from here.
"""

from gpuscaler.inputs import format_validation

__all__ = ["format_validation"]
