#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls exactly this).
# On a fresh machine it installs everything itself: a virtualenv with the pinned PyTorch,
# transformers and Lightning (scripts/ci-torch-venv.sh: built once, cached outside the repo keyed
# by the pins), the Python package with its dev extras into it, the dev-cluster binaries (built
# from Go modules once, cached outside the repo by version), then runs the linters and the whole
# suite with that venv's one interpreter: unit tests (tests/, the runtime's real-torch tests
# included: GPUSCALER_REQUIRE_TORCH=1 makes a missing framework a failure, not a skip) and
# end-to-end tests (e2e/) against a real local control plane (etcd, kube-apiserver, scheduler,
# controller manager, kwok). The unit tests need no dev-cluster binaries, so they run while the
# binaries still build; the end-to-end tests after, in shards run at once (each on its own dev
# cluster: the suite mostly waits on the API server). The unit tests that start real torchrun
# gangs ($GANG_TESTS, about half the unit suite's time) run beside them. Arguments go to every
# pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_PYTHON="${PYTHON:-python3}"

# The Go builds (CPU) start first and run beside the venv build (mostly download and unpack);
# build.py needs only the standard library, so the bare interpreter runs it from the source tree.
# The control plane (etcd, Kubernetes, kwok, helm) first, then Kueue and JobSet: CORE_READY is
# touched in between, and the e2e suite starts then, its Kueue tests last (e2e/conftest.py), so
# the add-ons build while the other tests run; a test that needs one before it is built waits on
# its build lock (devcluster/build.py ensure).
echo "==> dev-cluster binaries: built in the background (cached after the first build)"
BUILD_LOG="$(mktemp)"
CORE_READY="$(mktemp -u)"
PYTHONPATH=operator "$BASE_PYTHON" -c \
  'import pathlib, sys
from gpuscaler.devcluster.build import ensure_all
ensure_all()
pathlib.Path(sys.argv[1]).touch()
ensure_all(addons=("kueue", "jobset"))' "$CORE_READY" \
  >"$BUILD_LOG" 2>&1 &
BUILD_PID=$!
# Background jobs and temporary files, stopped and removed on exit (each start below adds its own).
BACKGROUND=("$BUILD_PID")
TEMPORARY=("$BUILD_LOG" "$CORE_READY")
# shellcheck disable=SC2317  # called by the EXIT trap, which shellcheck does not follow
cleanup() {
  kill "${BACKGROUND[@]}" 2>/dev/null || true
  rm -rf "${TEMPORARY[@]}"
}
trap cleanup EXIT

echo "==> the test venv: pinned torch, transformers, Lightning (cached after the first build)"
VENV="$(PYTHON="$BASE_PYTHON" scripts/ci-torch-venv.sh | tail -n 1)"
PYTHON="$VENV/bin/python"
export PATH="$VENV/bin:$PATH" PYTHON GPUSCALER_REQUIRE_TORCH=1

echo "==> installing gpuscaler and its dev dependencies into $VENV"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e '.[dev,train,docs]'

# Karpenter's kwok controller (e2e only; its build is registered by e2e/karpenter_helpers.py)
# builds beside the static checks instead of inside the first test that needs it.
echo "==> Karpenter's kwok controller for the e2e suite: built in the background (cached after the first build)"
KARPENTER_LOG="$(mktemp)"
(cd e2e && "$PYTHON" -c \
  'import karpenter_helpers as k; from gpuscaler.devcluster import build; build.ensure(k.KARPENTER_KWOK)') \
  >"$KARPENTER_LOG" 2>&1 &
KARPENTER_PID=$!
BACKGROUND+=("$KARPENTER_PID")
TEMPORARY+=("$KARPENTER_LOG")

echo "==> static checks: ruff, mypy --strict, import-linter layers"
"$PYTHON" -m ruff check operator tests e2e scripts benchmarks
"$PYTHON" -m mypy
"$VENV/bin/lint-imports"

echo "==> the docs site: generated reference current, mkdocs build --strict"
"$PYTHON" scripts/gen_reference.py --check
DOCS_SITE="$(mktemp -d)"
TEMPORARY+=("$DOCS_SITE")
NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$DOCS_SITE"

echo "==> calibration is reproducible from its data"
"$PYTHON" scripts/calibrate.py --check

# pytest's exit 5 (nothing collected) is a failure in CI, where every folder has tests; with a
# selection in the arguments (-k, a path) only when neither run collected anything.
run_pytest() {
  set +e
  "$PYTHON" -m pytest "$@" -p no:cacheprovider
  local status=$?
  set -e
  return "$status"
}

GANG_TESTS=tests/test_runtime_torch_ddp.py
echo "==> unit tests (tests/ but $GANG_TESTS), beside the background builds"
unit_status=0
run_pytest tests --ignore="$GANG_TESTS" "$@" || unit_status=$?

echo "==> unit tests of real torchrun gangs ($GANG_TESTS): in the background, beside the e2e suite"
GANG_LOG="$(mktemp)"
run_pytest "$GANG_TESTS" "$@" >"$GANG_LOG" 2>&1 &
GANG_PID=$!
BACKGROUND+=("$GANG_PID")
TEMPORARY+=("$GANG_LOG")

echo "==> dev-cluster control plane (the background build's log, until etcd, Kubernetes and kwok are built)"
while [ ! -e "$CORE_READY" ] && kill -0 "$BUILD_PID" 2>/dev/null; do
  sleep 5
done
cat "$BUILD_LOG"
shown="$(wc -l <"$BUILD_LOG")"
if [ ! -e "$CORE_READY" ]; then
  wait "$BUILD_PID" || true
  tail -n +"$((shown + 1))" "$BUILD_LOG"
  echo "building the dev-cluster binaries failed (log above)" >&2
  exit 1
fi

echo "==> Prometheus (Debian package) for the observe e2e"
scripts/ci-prometheus.sh

echo "==> shellcheck; e2e on an existing cluster (a dev cluster started separately, as a user's)"
PYTHON="$PYTHON" scripts/ci-existing-cluster.sh

# The e2e suite mostly waits on the API server, so it runs as shards at once, each on a private
# dev cluster of its own (scripts/ci-e2e-shards.sh, e2e/shards.py).
echo "==> end-to-end tests (e2e/) in ${E2E_SHARDS:-2} shards at once (e2e/shards.py), Kueue's and Karpenter's last in theirs"
e2e_status=0
PYTHON="$PYTHON" scripts/ci-e2e-shards.sh "$@" || e2e_status=$?

echo "==> unit tests of real torchrun gangs (their log)"
gang_status=0
wait "$GANG_PID" || gang_status=$?
cat "$GANG_LOG"

echo "==> Kueue and JobSet (the rest of the background build's log)"
build_status=0
wait "$BUILD_PID" || build_status=$?
tail -n +"$((shown + 1))" "$BUILD_LOG"
echo "==> Karpenter's kwok controller (the background build's log)"
karpenter_status=0
wait "$KARPENTER_PID" || karpenter_status=$?
cat "$KARPENTER_LOG"
if [ "$build_status" -ne 0 ] || [ "$karpenter_status" -ne 0 ]; then
  echo "a background build failed (exit $build_status for the dev cluster, $karpenter_status for Karpenter's kwok; log above)" >&2
  exit 1
fi
scripts/ci-cluster-deps.sh

echo "==> unit tests exited $unit_status, torchrun-gang unit tests $gang_status, end-to-end tests $e2e_status"
nothing_collected=false
if [ "$unit_status" -eq 5 ] && [ "$gang_status" -eq 5 ] && [ "$e2e_status" -eq 5 ]; then
  nothing_collected=true
elif [ "$#" -eq 0 ] && { [ "$unit_status" -eq 5 ] || [ "$gang_status" -eq 5 ] || [ "$e2e_status" -eq 5 ]; }; then
  nothing_collected=true
fi
if [ "$nothing_collected" = true ]; then
  echo "pytest collected no tests: that is a failure here, not a pass" >&2
  exit 1
fi
for status in "$unit_status" "$gang_status" "$e2e_status"; do
  if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
    exit "$status"
  fi
done
exit 0
