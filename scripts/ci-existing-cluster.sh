#!/usr/bin/env bash
# CI (scripts/test.sh): the e2e suite on a cluster it did not start, as on a user's cluster.
#   1. shellcheck of scripts/*.sh (installs Debian's shellcheck when missing);
#   2. a dev cluster started separately (`gpuscaler dev-cluster up --detach`, `dev-cluster env`)
#      with fake GPU nodes loaded the way scripts/kind-e2e.sh loads them, and a workload of the
#      cluster's own (a namespace with a ConfigMap) that the suite must not touch;
#   3. a representative part of the e2e suite with GPUSCALER_E2E_KUBECONFIG (see SUBSET below);
#   4. the cluster is checked to be as the suite found it: no e2e namespaces, the same nodes, no
#      gpuscaler or third-party CRDs the suite installed, the cluster's own ConfigMap intact;
#   5. the dev cluster is stopped, pass or fail.
# Usage: scripts/ci-existing-cluster.sh [PYTEST_ARGS...]. Needs: the dev-cluster binaries built
# (scripts/ci-cluster-deps.sh), Python with gpuscaler installed, kubectl. About 2-4 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
NAME="ci-existing-$$"

# The subset: every piece of the existing-cluster plumbing, not the whole suite again (the full
# suite already runs on a private dev cluster in the same CI run). kubectl/helm against the
# cluster; kwok probed and used (pods, Job pods with a delay, node pools, the Ready delay); the
# operator as a local process (gpuscaler's CRDs installed, then removed); the Helm chart (its CRDs
# and cluster-scoped objects, removed at the end); third-party CRDs from Go
# modules (installed, then removed); the kind/kwok manifests validated by this API server; the
# plumbing's own tests (skip on foreign CRDs, the sweep after a failed test).
SUBSET=(
  e2e/test_tools.py
  e2e/test_scheduling.py
  e2e/test_jobs_gc.py
  e2e/test_nodes.py
  e2e/test_operator.py::test_operator_runs_a_job_to_success
  e2e/test_operator.py::test_operator_invalid_specs_refused
  e2e/test_helm_install.py::test_install_creates_the_chart_objects
  e2e/test_providers_crds.py::test_karpenter_invalid_nodepool_is_refused
  e2e/test_kind_manifests.py
  e2e/test_any_cluster.py
)

echo "--> shellcheck scripts/*.sh"
if ! command -v shellcheck >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends shellcheck >/dev/null
fi
shellcheck scripts/*.sh

echo "--> a dev cluster started separately, as a user's cluster"
"$PYTHON" -m gpuscaler.devcluster up --detach --no-build --name "$NAME"
trap '"$PYTHON" -m gpuscaler.devcluster down --name "$NAME"' EXIT
eval "$("$PYTHON" -m gpuscaler.devcluster env --name "$NAME")"
"$PYTHON" e2e/kind_cluster.py nodes --kubeconfig "$KUBECONFIG" a100=p4d.24xlarge:2 t4=g4dn.xlarge:1
kubectl create namespace team-a >/dev/null
kubectl -n team-a create configmap keep-me --from-literal=owner=team-a >/dev/null
nodes_before="$(kubectl get nodes -o name | sort)"
crds_before="$(kubectl get crd -o name | sort)"

echo "--> the e2e subset with GPUSCALER_E2E_KUBECONFIG"
GPUSCALER_E2E_KUBECONFIG="$KUBECONFIG" "$PYTHON" -m pytest "${SUBSET[@]}" -m e2e -p no:cacheprovider "$@"

echo "--> the cluster is as the suite found it"
left="$(kubectl get namespaces -l gpuscaler.io/e2e -o name)"
[ -z "$left" ] || { echo "the suite left namespaces behind: $left" >&2; exit 1; }
[ "$(kubectl get nodes -o name | sort)" = "$nodes_before" ] \
  || { echo "the nodes changed: before $nodes_before, after $(kubectl get nodes -o name | sort)" >&2; exit 1; }
[ "$(kubectl get crd -o name | sort)" = "$crds_before" ] \
  || { echo "the CRDs changed: before [$crds_before], after [$(kubectl get crd -o name | sort)]" >&2; exit 1; }
[ "$(kubectl -n team-a get configmap keep-me -o jsonpath='{.data.owner}')" = "team-a" ] \
  || { echo "the cluster's own ConfigMap team-a/keep-me was changed" >&2; exit 1; }
echo "ok: nothing left behind, the cluster's own objects untouched"
