#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls exactly this).
# On a fresh machine it installs everything itself: the Python package with its dev extras, the
# dev-cluster binaries (built from Go modules once, cached outside the repo by version), then runs
# the linters and the whole suite: unit tests (tests/) and end-to-end tests (e2e/) against a real
# local control plane (etcd, kube-apiserver, scheduler, controller manager, kwok).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

echo "==> installing gpuscaler and its dev dependencies"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e '.[dev]'

echo "==> static checks: ruff, mypy --strict, import-linter layers"
"$PYTHON" -m ruff check operator tests e2e scripts benchmarks
"$PYTHON" -m mypy
lint-imports

echo "==> calibration is reproducible from its data"
"$PYTHON" scripts/calibrate.py --check

echo "==> dev-cluster binaries (cached after the first build)"
scripts/ci-cluster-deps.sh

echo "==> Prometheus (Debian package) for the observe e2e"
scripts/ci-prometheus.sh

echo "==> shellcheck; e2e on an existing cluster (a dev cluster started separately, as a user's)"
PYTHON="$PYTHON" scripts/ci-existing-cluster.sh

echo "==> tests: unit and end-to-end"
set +e
"$PYTHON" -m pytest tests e2e -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here, not a pass" >&2
  exit 1
fi
exit "$status"
