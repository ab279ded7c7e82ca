"""``gpuscaler run`` (the operator) and ``gpuscaler crd`` (generate the CRDs), added to the CLI.

:mod:`gpuscaler.cli` finds this module in its ``EXTENSIONS`` and calls :func:`register`.
``run`` is ``kopf run -m gpuscaler.main`` with the settings from ``GPUSCALER_*`` and kopf's
liveness endpoint on ``GPUSCALER_HEALTH_PORT``; an invalid setting exits 2 naming the variable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEFAULT_CRD_DIR = "crds"


def cmd_crd(args: argparse.Namespace) -> int:
    """Write (or with ``--check`` compare) the generated CRDs."""
    from gpuscaler.api import crd
    from gpuscaler.inputs import InputError

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise InputError(f"--output {out}: is a file; give the directory to write the CRDs into", field="--output")
    if args.check:
        drifted = crd.drift(out)
        if drifted:
            print(
                f"gpuscaler crd: {', '.join(drifted)} in {out}/ differ from the models in api/; "
                "run `gpuscaler crd` and commit the result",
                file=sys.stderr,
            )
            return 1
        print(f"{out}/: up to date")
        return 0
    for path in crd.write(out):
        print(f"wrote {path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run the operator in the foreground until interrupted."""
    import asyncio

    import kopf
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from gpuscaler.inputs import InputError, shown
    from gpuscaler.settings import Settings

    try:
        settings = Settings()
    except ValidationError as err:  # name each variable as the user set it
        lines = [
            f"GPUSCALER_{'_'.join(str(p) for p in e['loc'][:1]).upper()}={shown(e.get('input'))}: {e['msg']}"
            for e in err.errors()
        ]
        raise InputError("settings (GPUSCALER_* environment variables) is invalid:\n  " + "\n  ".join(lines)) from None
    except SettingsError as err:  # e.g. a list or map setting that is not JSON
        raise InputError(f"settings (GPUSCALER_* environment variables): {err} (lists and maps are JSON)") from None
    kopf.configure(verbose=args.verbose)
    import gpuscaler.main  # noqa: F401  (registers the handlers)

    namespaces = [settings.namespace] if settings.namespace else []
    liveness = f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness,
            standalone=args.standalone,
        )
    )
    return 0


def register(subparsers: Any) -> None:
    """Add ``run`` and ``crd`` to the project CLI."""
    p = subparsers.add_parser("run", help="run the TrainingJob operator (kopf) against $KUBECONFIG or in-cluster")
    p.add_argument(
        "--standalone", action="store_true", help="no peering with other replicas (one operator only)"
    )
    p.add_argument("--verbose", "-v", action="store_true", help="log kopf's debug messages")
    p.set_defaults(func=cmd_run)

    c = subparsers.add_parser("crd", help="generate crds/ from the pydantic models in api/")
    c.add_argument("--output", "-o", default=DEFAULT_CRD_DIR, help="directory to write (default crds/)")
    c.add_argument("--check", action="store_true", help="exit 1 when the files differ from the models")
    c.set_defaults(func=cmd_crd)
