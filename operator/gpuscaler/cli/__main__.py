"""``python -m gpuscaler.cli``: the ``gpuscaler`` command."""

import sys

from gpuscaler.cli import main

sys.exit(main())
