#!/usr/bin/env bash
# Run the e2e suite on a kind cluster with fake GPU nodes: for machines with Docker (a laptop).
# NOT run in CI here: the CI machines have no Docker engine (docs/e2e-on-your-cluster.md says
# what is tested instead). Steps: create the kind cluster (e2e/kind/cluster.yaml), install kwok
# from its release manifest at the dev cluster's version (e2e/kind/kwok.yaml) with gpuscaler's
# stages (e2e/kind/stages.yaml), load fake GPU node pools from the catalog, then run
# `pytest e2e` with GPUSCALER_E2E_KUBECONFIG pointing at the cluster. The cluster is deleted at
# the end, pass or fail, unless --keep is given.
#
# Usage: scripts/kind-e2e.sh [--keep] [PYTEST_ARGS...]      e.g. scripts/kind-e2e.sh -k operator
# Needs: kind, docker (a running engine), kubectl; Python with gpuscaler installed
#        (pip install -e '.[dev]'). Optional: helm and prometheus on PATH (their tests skip
#        without), Go (Karpenter's and Cluster API's CRDs come from Go modules).
# Environment:
#   KIND_CLUSTER_NAME   cluster name (default gpuscaler-e2e; an existing one of that name is an error)
#   KIND_NODE_IMAGE     node image instead of the one pinned in e2e/kind/cluster.yaml
#   KIND_E2E_POOLS      fake GPU node pools, NAME=INSTANCE_TYPE:COUNT separated by spaces
#                       (default "a100=p4d.24xlarge:2 t4=g4dn.xlarge:2")
#   KIND, PYTHON        the kind and python to use (default: kind, python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
KIND="${KIND:-kind}"
NAME="${KIND_CLUSTER_NAME:-gpuscaler-e2e}"
POOLS="${KIND_E2E_POOLS:-a100=p4d.24xlarge:2 t4=g4dn.xlarge:2}"

keep=0
pytest_args=()
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) pytest_args+=("$arg") ;;
  esac
done

fail() { echo "kind-e2e: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || fail "$1 is not on PATH: $2"; }
need "$KIND" "install kind (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)"
need docker "kind runs the cluster's node as a Docker container"
need kubectl "install kubectl (https://kubernetes.io/docs/tasks/tools/)"
docker info >/dev/null 2>&1 || fail "cannot reach the Docker engine (docker info failed)"
"$PYTHON" -c "import gpuscaler.devcluster, kubernetes" 2>/dev/null \
  || fail "gpuscaler is not importable with $PYTHON: run pip install -e '.[dev]'"
if "$KIND" get clusters 2>/dev/null | grep -qx "$NAME"; then
  fail "a kind cluster named $NAME exists already: delete it (kind delete cluster --name $NAME) or set KIND_CLUSTER_NAME"
fi

workdir="$(mktemp -d "${TMPDIR:-/tmp}/gpuscaler-kind-e2e.XXXXXX")"
kubeconfig="$workdir/kubeconfig"
finish() {
  local status=$?
  if [ "$keep" -eq 1 ]; then
    echo "kind-e2e: kept the cluster: export KUBECONFIG=$kubeconfig; delete it with: $KIND delete cluster --name $NAME"
  else
    echo "==> deleting the kind cluster $NAME"
    "$KIND" delete cluster --name "$NAME" >/dev/null 2>&1 || echo "kind-e2e: could not delete cluster $NAME" >&2
    rm -rf "$workdir"
  fi
  exit "$status"
}
trap finish EXIT

echo "==> creating the kind cluster $NAME"
create=("$KIND" create cluster --name "$NAME" --config e2e/kind/cluster.yaml --kubeconfig "$kubeconfig" --wait 180s)
if [ -n "${KIND_NODE_IMAGE:-}" ]; then
  create+=(--image "$KIND_NODE_IMAGE")
fi
"${create[@]}"
export KUBECONFIG="$kubeconfig"

echo "==> kwok (its release manifest, the dev cluster's version) with gpuscaler's stages"
kubectl apply -f e2e/kind/kwok.yaml
kubectl wait --for=condition=Established crd/stages.kwok.x-k8s.io --timeout=60s
kubectl apply -f e2e/kind/stages.yaml
kubectl -n kube-system rollout status deployment/kwok-controller --timeout=300s

echo "==> fake GPU nodes from the catalog: $POOLS"
read -r -a pools <<<"$POOLS"
if [ "${#pools[@]}" -gt 0 ]; then
  "$PYTHON" e2e/kind_cluster.py nodes --kubeconfig "$kubeconfig" "${pools[@]}"
fi
kubectl get nodes -L node.kubernetes.io/instance-type,nvidia.com/gpu.product

echo "==> the e2e suite on kind"
# (the ${a[@]+...} form: an empty array is an unbound variable to macOS's bash 3.2 under set -u)
GPUSCALER_E2E_KUBECONFIG="$kubeconfig" "$PYTHON" -m pytest e2e -m e2e -p no:cacheprovider ${pytest_args[@]+"${pytest_args[@]}"}
