"""``python -m gpuscaler.devcluster build|up|down|env|status``: see :mod:`gpuscaler.devcluster.cli`."""

from __future__ import annotations

import sys

from gpuscaler.devcluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
