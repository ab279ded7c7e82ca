"""The image's pins (``constraints.txt``): every distribution the image needs is pinned once, each
pin satisfies pyproject.toml, and the Dockerfile installs through them."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)")


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        m = PIN.fullmatch(line)
        assert m, f"not a name==version pin: {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in out, f"{name} pinned twice"
        out[name] = m.group(2)
    return out


def image_extras() -> list[str]:
    m = re.search(r"^ARG EXTRAS=(\S+)$", (ROOT / "Dockerfile").read_text(encoding="utf-8"), re.M)
    assert m, "the Dockerfile has no ARG EXTRAS"
    return m.group(1).split(",")


def test_every_direct_dependency_of_the_image_is_pinned_within_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    got = pins()
    wanted = [Requirement(r) for r in project["project"]["dependencies"]]
    for extra in image_extras():
        wanted += [Requirement(r) for r in project["project"]["optional-dependencies"][extra]]
    wanted += [Requirement(r) for r in project["build-system"]["requires"]]
    assert wanted
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in got, f"{req} is not pinned in constraints.txt"
        assert req.specifier.contains(got[name], prereleases=True), f"{name}=={got[name]} does not satisfy {req}"
    # and the transitive ones of the heavy hitters, not only the direct names
    for name in ("urllib3", "botocore", "google-api-core", "protobuf", "aiohttp", "pydantic-core"):
        assert name in got, name


def test_the_dockerfile_installs_through_the_constraints() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "COPY pyproject.toml README.md constraints.txt ./" in text
    assert "PIP_CONSTRAINT=/src/constraints.txt" in text  # also pins pip's isolated build environment


def test_the_generator_reports_a_bad_extra_with_exit_2() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "lock_image.py"), "--extras", "nope", "--check"],
                         capture_output=True, text=True, check=False, timeout=120)
    assert res.returncode == 2 and "nope not in pyproject.toml" in res.stderr
