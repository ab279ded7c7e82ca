"""Property: every CLI entry point, fed generated malformed documents and arguments, answers with a
documented exit code and a message, never an uncaught exception, and under ``--json`` strict JSON.

Documents start from valid ones (a TrainingJob, a policy, a trace) and are mutated the ways people
and tools break files: a field replaced by a value of another type (booleans, strings, NaN,
infinity, huge or negative numbers, lists, mappings), a field dropped or added, then the YAML text
cut short, given a duplicate key, an alias, a stray byte or another encoding. Arguments mix valid
and invalid ids and numbers. ``main`` runs in-process; each example's time and peak Python memory
stay within generous bounds (a hang or a blow-up fails, a slow machine does not).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscaler.cli import main
from gpuscaler.testing import training_job

EXIT_CODES = {0, 1, 2}
MAX_SECONDS = 60.0
"""Per example; planning a valid job takes well under a second, so only a hang reaches this."""
MAX_PEAK_BYTES = 300 * 1024 * 1024
"""Peak Python allocations per example; the inputs are at most a few kB."""

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    database=None,
)

JOB: dict[str, Any] = training_job(
    "fuzz", maxDuration="24h", budgetUsd=500, constraints={"providers": ["aws"], "maxGpus": 16}
)
JOB_FIELDS = [
    ("kind",), ("metadata",), ("spec",), ("spec", "workload"), ("spec", "workload", "model"),
    ("spec", "workload", "transformer"), ("spec", "workload", "params"), ("spec", "workload", "flopsPerSample"),
    ("spec", "globalBatch"), ("spec", "training"), ("spec", "training", "epochs"), ("spec", "training", "samples"),
    ("spec", "training", "steps"), ("spec", "maxDuration"), ("spec", "deadline"), ("spec", "budgetUsd"),
    ("spec", "objective"), ("spec", "constraints"), ("spec", "constraints", "minGpus"),
    ("spec", "constraints", "maxGpus"), ("spec", "constraints", "regions"), ("spec", "constraints", "gpuTypes"),
    ("spec", "constraints", "instanceTypes"), ("spec", "constraints", "spot"), ("spec", "checkpoint"),
    ("spec", "checkpoint", "intervalSeconds"), ("spec", "suspend"), ("spec", "template"), ("spec", "bogus"),
]  # fmt: skip
POLICY: dict[str, Any] = {"name": "lab", "maxGpusPerJob": 16, "providers": ["aws"], "spot": {"mode": "allowed"}}
POLICY_FIELDS = [
    ("name",), ("namespaces",), ("maxGpusPerJob",), ("providers",), ("regions",), ("allowedGpuTypes",),
    ("allowedInstanceTypes",), ("maxUsdPerHour",), ("spot",), ("spot", "mode"), ("spot", "maxInterruptions"),
    ("priceOverrides",), ("minCheckpointIntervalS",), ("allowedPrecisions",), ("kind",), ("spec",),
]  # fmt: skip
SMALL_SPEC = {"workload": {"model": "resnet50"}, "globalBatch": 64, "training": {"steps": 200}}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "5e14", ".inf", "24h", "0h", "-1", "a100", "resnet50", "us-east-1", "ibm", "x" * 300]),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
transformers = st.fixed_dictionaries(
    {"layers": st.integers(-2, 2000), "hidden": st.integers(-8, 200_000), "heads": st.integers(-1, 2000),
     "seqLen": st.integers(0, 2_000_000), "vocab": st.integers(0, 20_000_000)}
)


def set_path(doc: dict[str, Any], path: tuple[str, ...], value: Any, drop: bool) -> None:
    node: Any = doc
    for key in path[:-1]:
        if not isinstance(node, dict):
            return
        node = node.setdefault(key, {})
    if isinstance(node, dict):
        if drop:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], fields: list[tuple[str, ...]]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(fields))
        value = draw(transformers if path[-1] == "transformer" else values)
        set_path(doc, path, value, drop=draw(st.booleans()) and draw(st.booleans()))
    return doc


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@st.composite
def broken_text(draw: st.DrawFn, text: str) -> bytes:
    """The YAML text as written, or damaged the ways files get damaged."""
    how = draw(st.sampled_from(["as is", "as is", "cut", "duplicate", "alias", "byte", "utf-16", "deep", "garbage"]))
    if how == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif how == "duplicate":
        text += text.splitlines()[-1] + "\n" if text.strip() else "a: 1\na: 2\n"
    elif how == "alias":
        text = "x: &a [1, 2]\ny: *a\n" + text
    elif how == "byte":
        at = draw(st.integers(0, len(text)))
        return text[:at].encode() + draw(st.binary(min_size=1, max_size=3)) + text[at:].encode()
    elif how == "utf-16":
        return text.encode("utf-16")
    elif how == "deep":
        n = draw(st.integers(50, 3000))
        text += "deep: " + "[" * n + "]" * n + "\n"
    elif how == "garbage":
        return draw(st.binary(max_size=200))
    return text.encode()


def check(args: list[str], files: dict[str, bytes] | None = None) -> None:
    """Run ``gpuscaler ARGS`` in-process with the files written; assert the documented behaviour."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: Path(tmp) / name for name in files or {}}
        for name, data in (files or {}).items():
            paths[name].write_bytes(data)
        argv = [str(paths[a]) if a in paths else a.replace("{tmp}", tmp) for a in args]
        out, err = io.StringIO(), io.StringIO()
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        finally:
            elapsed = time.perf_counter() - t0
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    assert code in EXIT_CODES, (argv, code, err.getvalue()[-2000:])
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert err.getvalue().startswith("gpuscaler"), err.getvalue()
    if "--json" in argv and "--help" not in argv and "-h" not in argv:

        def refuse(name: str) -> None:
            raise AssertionError(f"{name} in --json output")

        json.loads(out.getvalue(), parse_constant=refuse)  # strict JSON on success and on error
    assert elapsed < MAX_SECONDS, (argv, elapsed)
    assert peak < MAX_PEAK_BYTES, (argv, peak)


@FUZZ
@given(st.data(), st.booleans())
def test_plan_survives_malformed_jobs(data: st.DataObject, as_json: bool) -> None:
    text = data.draw(broken_text(dump(data.draw(mutated(JOB, JOB_FIELDS)))))
    check(["plan", "job.yaml", *(["--json"] if as_json else [])], {"job.yaml": text})


@FUZZ
@given(st.data(), st.booleans(), st.booleans())
def test_policy_check_and_plan_policy_survive_malformed_policies(
    data: st.DataObject, as_json: bool, resource: bool
) -> None:
    doc = data.draw(mutated(POLICY, POLICY_FIELDS))
    if resource:
        doc = {"kind": "GPUScalingPolicy", "metadata": {"name": "p"}, "spec": doc}
    text = data.draw(broken_text(dump(doc)))
    check(["policy", "check", "p.yaml", *(["--json"] if as_json else [])], {"p.yaml": text})
    check(["plan", "job.yaml", "--policy", "p.yaml", "--json"], {"job.yaml": dump(JOB).encode(), "p.yaml": text})


@settings(FUZZ, max_examples=12)
@given(st.data(), st.sampled_from([".yaml", ".jsonl"]))
def test_simulate_survives_malformed_traces(data: st.DataObject, suffix: str) -> None:
    job = data.draw(mutated({"name": "a", "arrivalHours": 1.0, "spec": SMALL_SPEC},
                            [("name",), ("arrivalHours",), ("spec",), ("spec", "globalBatch"), ("spec", "training")]))
    cloud = data.draw(st.dictionaries(st.sampled_from(["interruptionScale", "spotShortage", "noticeSeconds",
                                                       "shortageOverrides", "bogus"]), values, max_size=2))
    if suffix == ".yaml":
        text = data.draw(broken_text(dump({"name": "t", "cloud": cloud, "jobs": [job]})))
    else:
        lines = [json.dumps({"trace": {"cloud": cloud}}, allow_nan=True), json.dumps(job, allow_nan=True)]
        text = ("\n".join(lines) + "\n").encode()
    flags = data.draw(st.lists(st.sampled_from([["--seed", "1"], ["--interruption-scale", "-1"], ["--json"],
                                                ["--checkpoint-interval", "0"], ["--strategies", "gpuscaler,nope"],
                                                ["--strategies", "gpuscaler"], ["--jobs-out", "{tmp}/x/y.jsonl"]]),
                               max_size=2))
    check(["simulate", f"t{suffix}", "--strategies", "gpuscaler", *(w for f in flags for w in f)], {f"t{suffix}": text})


numbers = st.one_of(
    st.integers(-5, 5000).map(str),
    st.sampled_from(["0", "-1", "nan", "inf", "1e9", "2.5", "", "x", "99999999999999999999"]),
)


@settings(FUZZ, max_examples=60)
@given(
    st.sampled_from(["resnet50", "bert-large-squad", "llama-7b", "resnet5", "", "RESNET50"]),
    st.sampled_from(["a100", "h100", "t4", "h10", "", "v100-16gb"]),
    st.dictionaries(st.sampled_from(["--gpus", "--nodes", "--batch-per-gpu", "--accumulation", "--network-gbps",
                                     "--zero-stage", "--precision"]), numbers, max_size=3),
    st.booleans(),
)
def test_estimate_survives_malformed_arguments(workload: str, gpu: str, opts: dict[str, str], as_json: bool) -> None:
    args = ["estimate", "--workload", workload, "--gpu", gpu]
    for flag, value in opts.items():
        args += [flag, value]
    check(args + (["--json"] if as_json else []))


@settings(FUZZ, max_examples=40)
@given(
    st.sampled_from(["plan", "estimate", "validate", "catalog", "policy", "simulate", "crd", "report", "run",
                     "dev-cluster", "plna", "", "--version", "--help"]),
    st.lists(st.sampled_from(["--json", "--bogus", "-x", "gpus", "nope", "check", "--namespace", "-o", "{tmp}/f",
                              "--help", "--plot", "{tmp}/missing/p.png", "--check"]), max_size=3),
)
def test_every_command_survives_malformed_arguments(command: str, rest: list[str]) -> None:
    if command in ("run", "dev-cluster") and not ({"--bogus", "-x", "--help"} & set(rest)):
        rest = ["--bogus", *rest]  # never start the operator or a cluster: arguments only
    if command == "crd" and "-o" not in rest:
        rest = [*rest, "-o", "{tmp}/crds"]  # never into the working directory
    if command == "report":  # no cluster: the error path, whatever the machine's kubeconfig
        rest = [*rest, "--prometheus", "http://127.0.0.1:9"]  # nothing listens on the discard port
        with mock.patch.dict(os.environ, {"KUBECONFIG": "/nonexistent/kubeconfig"}):
            check([command, *rest])
        return
    check([command, *rest] if command else rest)
