"""How the dev-cluster binaries are built: no DWARF anywhere, since every binary is stripped."""

from __future__ import annotations

import inspect
import re

from gpuscaler.devcluster import build


def test_go_builds_skip_the_compilers_dwarf_and_keep_the_module_requirements() -> None:
    env = build._go_env()
    flags = env["GOFLAGS"].split()
    assert "-mod=mod" in flags and "-gcflags=all=-dwarf=false" in flags
    assert env["CGO_ENABLED"] == "0" and env["GOWORK"] == "off"


def test_every_binary_is_stripped_so_dropping_dwarf_loses_nothing() -> None:
    """The compiler's DWARF is only worth building for a linker that keeps it: every ``ldflags`` of the
    build module starts with ``-s -w`` (no symbol table, no DWARF)."""
    source = inspect.getsource(build)
    ldflags = re.findall(r'ldflags=f?"([^"]*)"', source)
    assert ldflags, "no ldflags found in the build module"
    assert all(v.startswith("-s -w") for v in ldflags), ldflags
