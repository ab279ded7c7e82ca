"""The ``gpuscaler`` command line: plan, estimate, validate, catalog, and the operator's commands.

Each subcommand is a thin adapter over the pure layers (catalog, perfmodel, planner). Every command,
the extensions' too, exits with the codes of :data:`EXIT_CODES`: 0 success, 1 an infeasible job
(valid, but no plan meets it; the output says what would), 2 invalid input or usage (the message
names the field or option, the value and what to do; unknown names come with close matches) or a
service it needs failing in a way that may pass, 3 a bug or a broken install. Errors are mapped by
their kind (:class:`gpuscaler.errors.ErrorKind`).
Commands raise; :func:`main` is the one place an error becomes a message and an exit code
(:func:`describe_error`), and under ``--json`` also a JSON error object on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from gpuscaler import __version__, capacity_cli
from gpuscaler import prices_cli as pc
from gpuscaler.catalog import Precision
from gpuscaler.cli.catalog import _workload_dict, cmd_catalog
from gpuscaler.cli.common import (
    EXIT_CODES,
    EXIT_CODES_HELP,
    EXIT_INFEASIBLE,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    EXTRAS,
    ArgumentParser,
    Failure,
    UsageError,
    _describe_domain_error,
    _internal,
    _load_policy,
    _money,
    _table,
    describe_error,
    load_job,
)
from gpuscaler.cli.estimate import MAX_GPUS_PER_NODE, _check_global_batch, _default_batch, cmd_estimate
from gpuscaler.cli.plan import cmd_plan, plan_to_dict, plot_plan, render_plan
from gpuscaler.cli.validate import cmd_validate
from gpuscaler.inputs import namespace_name, output_file, positive_float, positive_int, to_json
from gpuscaler.perfmodel import DATA_LOADERS

EXTENSIONS = (
    "gpuscaler.devcluster.cli",  # dev-cluster up|down|env|build (local control plane)
    "gpuscaler.operator_cli",  # run, crd (the operator)
    "gpuscaler.policy.cli",  # policy check
    "gpuscaler.simulator.cli",  # simulate
    "gpuscaler.observe.cli",  # report
    "gpuscaler.profiles_cli",  # profiles list|show|export|import|prune
)
"""Modules that add subcommands through ``register(subparsers)``; skipped when not importable."""

__all__ = [
    "EXIT_CODES",
    "EXIT_CODES_HELP",
    "EXIT_INFEASIBLE",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXTENSIONS",
    "EXTRAS",
    "MAX_GPUS_PER_NODE",
    "ArgumentParser",
    "Failure",
    "UsageError",
    "_check_global_batch",
    "_default_batch",
    "_describe_domain_error",
    "_internal",
    "_load_policy",
    "_money",
    "_table",
    "_workload_dict",
    "build_parser",
    "cmd_catalog",
    "cmd_estimate",
    "cmd_plan",
    "cmd_validate",
    "describe_error",
    "load_job",
    "main",
    "plan_to_dict",
    "plot_plan",
    "render_plan",
]
"""What ``gpuscaler.cli`` offers: :func:`main` and the names its commands, the extensions and the tests import."""


# ----------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="gpuscaler", description="Cost-aware GPU autoscaling for deep-learning training.")
    p.add_argument("--version", action="version", version=f"gpuscaler {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sp = sub.add_parser("plan", help="plan a TrainingJob: cost, time and risk of every way to run it")
    sp.add_argument("file", help="TrainingJob YAML (the same file kubectl apply takes)")
    sp.add_argument("--policy", help="platform policy YAML to apply (one or several policies)")
    sp.add_argument("--namespace", type=namespace_name, help="namespace whose policies apply (default: the job's, else 'default')")
    sp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sp.add_argument(
        "--plot", metavar="FILE.png", type=output_file, help="draw cost vs time with the chosen plan marked"
    )
    sp.add_argument(
        "--allow-flagged-prices",
        action="store_true",
        help="plan on spot prices the catalog flags as suspicious (left out by default; shown with a caveat)",
    )
    pc.add_prices_option(sp)
    sp.add_argument("--profiles", metavar="FILE", help="performance profiles (gpuscaler profiles export) as measured priors")
    sp.set_defaults(func=cmd_plan)

    se = sub.add_parser("estimate", help="predict memory, step time and throughput of one configuration")
    se.add_argument("--workload", required=True, help="workload id (gpuscaler catalog workloads)")
    se.add_argument("--gpu", required=True, help="GPU id or alias (gpuscaler catalog gpus)")
    se.add_argument("--gpus", type=positive_int, default=1, help="total GPUs (default 1)")
    se.add_argument("--nodes", type=positive_int, default=1, help="nodes the GPUs are spread over (default 1)")
    se.add_argument("--precision", choices=[x.value for x in Precision], default="amp")
    se.add_argument(
        "--batch-per-gpu",
        type=positive_int,
        help="micro-batch per GPU in batch items: images, sequences, sentence pairs (default: largest power of 2 that fits)",
    )
    se.add_argument("--accumulation", type=positive_int, default=1, help="gradient accumulation steps")
    se.add_argument(
        "--channels-last",
        action="store_true",
        help="convolutions in channels-last (NHWC) memory format (default: PyTorch's NCHW)",
    )
    se.add_argument(
        "--data-loader",
        choices=list(DATA_LOADERS),
        default="pytorch",
        help="input pipeline: pytorch DataLoader (default) or NVIDIA dali",
    )
    se.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=0)
    se.add_argument("--activation-checkpointing", action="store_true")
    se.add_argument(
        "--network-gbps", type=positive_float, help="inter-node bandwidth (default: from the catalog)"
    )
    se.add_argument("--json", action="store_true")
    pc.add_prices_option(se)
    se.set_defaults(func=cmd_estimate)

    sv = sub.add_parser("validate", help="the performance model's fit error on its calibration data")
    sv.add_argument("--json", action="store_true")
    sv.set_defaults(func=cmd_validate)

    sc = sub.add_parser("catalog", help="list GPUs, instance types or workloads; refresh prices")
    cs = sc.add_subparsers(dest="what", required=True, metavar="WHAT")
    for what in ("gpus", "instances", "workloads"):
        sw = cs.add_parser(what, help=f"list the catalog's {what}")
        sw.add_argument("--json", action="store_true", help="print JSON ({WHAT: [...]}); workloads carry batch_unit")
        if what == "instances":
            pc.add_prices_option(sw)
        sw.set_defaults(func=cmd_catalog)
    pc.register_refresh(cs)
    capacity_cli.register_catalog(cs)

    for register in _extensions():
        register(sub)
    return p


def _extensions() -> list[Callable[[Any], None]]:
    """Subcommands from modules that need optional dependencies (operator, dev cluster)."""
    regs: list[Callable[[Any], None]] = []
    for module in EXTENSIONS:
        try:
            mod = __import__(module, fromlist=["register"])
        except ImportError:
            continue
        regs.append(mod.register)
    return regs


MAX_MESSAGE_CHARS = 8000
"""Longest error message printed (a document can break many rules; each value is already shortened)."""


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush stays quiet."""
    with contextlib.suppress(OSError, ValueError):  # no real file descriptor (captured output)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every error becomes a message and an exit code of :data:`EXIT_CODES`.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in words
    try:
        args = build_parser().parse_args(words)
        code: int = args.func(args)
        sys.stdout.flush()  # a full or closed stdout fails here, inside the handler, not at exit
        return code
    except SystemExit as stop:  # --help and --version, or a command that exits itself
        return stop.code if isinstance(stop.code, int) else (EXIT_OK if stop.code is None else EXIT_USAGE)
    except BrokenPipeError:  # the reader went away (``| head``): not an error of ours
        _quiet_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        failure = describe_error(err)
        if failure.code == EXIT_INTERNAL and os.environ.get("GPUSCALER_DEBUG"):
            traceback.print_exc()
        try:
            print(f"gpuscaler: {failure.message[:MAX_MESSAGE_CHARS]}", file=sys.stderr)
            if isinstance(err, UsageError) and err.usage:
                print(err.usage, file=sys.stderr)
            if as_json:
                print(to_json(failure.to_dict()), flush=True)
        except OSError:  # stdout gone or full (the message went to stderr)
            _quiet_stdout()
        return failure.code

