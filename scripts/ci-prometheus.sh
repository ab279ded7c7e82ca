#!/usr/bin/env bash
# Make sure a Prometheus server binary is on PATH for the observed-performance e2e tests
# (e2e/test_observe.py start it themselves: temp dir, free port, 1 s scrape interval).
# Installs Debian's `prometheus` package when missing; idempotent, about a second when present.
# Needs: apt-get and root (or sudo) only when Prometheus is not installed yet.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
fi
echo "ci-prometheus: installing Debian's prometheus package"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package starts a system service where systemd runs; the tests start their own server.
command -v prometheus >/dev/null 2>&1 || { echo "ci-prometheus: prometheus still not on PATH" >&2; exit 1; }
prometheus --version 2>&1 | head -1
