#!/usr/bin/env bash
# The e2e suite (e2e/) as E2E_SHARDS pytest sessions at once (default 2), each starting a private
# dev cluster of its own and running a set of whole modules dealt by measured duration
# (e2e/shards.py, `pytest e2e --shard K/N`): the suite mostly waits on the API server, kwok's
# delays and checkpoint intervals (alone it kept the 2-core CI machine's load average under 1), so
# the shards share the CPU it leaves idle. Shard 1 runs in the foreground; the others' output
# follows it. Called by scripts/test.sh; arguments go to every pytest run.
# Exit status: a failed shard's; else 5 (pytest's "no tests collected") where no shard collected a
# test, or, without arguments (every shard has tests), where one did not; else 0.
# Usage: PYTHON=VENV/bin/python scripts/ci-e2e-shards.sh [PYTEST_ARGS...]. Needs the dev-cluster
# binaries (scripts/ci-cluster-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
E2E_SHARDS="${E2E_SHARDS:-2}"
if ! [[ "$E2E_SHARDS" =~ ^[1-9][0-9]*$ ]]; then
  echo "ci-e2e-shards: E2E_SHARDS='$E2E_SHARDS': expected a whole number of shards >= 1, e.g. E2E_SHARDS=2" >&2
  exit 2
fi

pids=()
logs=()
# shellcheck disable=SC2317  # called by the EXIT trap, which shellcheck does not follow
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  rm -f "${logs[@]}"
}
trap cleanup EXIT
for ((k = 2; k <= E2E_SHARDS; k++)); do
  log="$(mktemp)"
  logs+=("$log")
  "$PYTHON" -m pytest e2e --shard "$k/$E2E_SHARDS" "$@" -p no:cacheprovider >"$log" 2>&1 &
  pids+=("$!")
done
statuses=(0)
"$PYTHON" -m pytest e2e --shard "1/$E2E_SHARDS" "$@" -p no:cacheprovider || statuses[0]=$?
for i in "${!pids[@]}"; do
  status=0
  wait "${pids[$i]}" || status=$?
  statuses+=("$status")
  echo "==> end-to-end tests, shard $((i + 2))/$E2E_SHARDS (its log)"
  cat "${logs[$i]}"
done
pids=()

failed=0
no_tests=0
for status in "${statuses[@]}"; do
  if [ "$status" -eq 5 ]; then
    no_tests=$((no_tests + 1))
  elif [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
    failed=$status
  fi
done
echo "==> end-to-end tests: shards 1..$E2E_SHARDS exited ${statuses[*]}"
if [ "$failed" -ne 0 ]; then
  exit "$failed"
fi
if [ "$no_tests" -gt 0 ] && { [ "$no_tests" -eq "$E2E_SHARDS" ] || [ "$#" -eq 0 ]; }; then
  exit 5
fi
exit 0
