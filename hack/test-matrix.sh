#!/usr/bin/env bash
# Run the e2e suite for each {Kubernetes release} x {containerd} combination and write
# the table (combination, passed, failed, skipped, seconds) to docs/support-matrix.md.
#
#   MATRIX_KUBE_VERSIONS  space-separated releases (default: the oldest served minor
#                         v1.30.4, v1.34.3, and the pin in hack/tools/versions.env, the
#                         newest served release); each one's Kubernetes commands are built by
#                         hack/build-binaries.sh (cached; the first build of a release
#                         takes ~5 minutes here) and picked by the harness through
#                         AGGAPI_KUBE_VERSION (tests/framework/kubetools.py)
#   MATRIX_CONTAINERDS    space-separated AGGAPI_CONTAINERD values (default: "1.6 2.x";
#                         2.x pulls through the transfer service, see
#                         tests/framework/containerdconfig.py)
#   MATRIX_TESTS          what pytest runs in each cell (default: tests/e2e); the table
#                         names it, so a partial run is never mistaken for the suite
#   MATRIX_KUBE_CMDS      the Kubernetes commands to build first (default: all six;
#                         kube-proxy serves only the two-node tests; kubectl follows the
#                         release, within its one-minor skew)
#   MATRIX_TABLE_ONLY     set: run nothing, write the table from the reports already in
#                         .local/matrix/ (seconds: pytest's own, lock wait excluded)
#   MATRIX_OUT            the page to write (default: docs/support-matrix.md)
#
# Each cell is one pytest session under the e2e lock (/tmp/aggapi-e2e.lock), with a
# JUnit report in .local/matrix/; the table is written from those reports.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/versions.env
source hack/tools/versions.env

KUBES=${MATRIX_KUBE_VERSIONS:-"v1.30.4 v1.34.3 $KUBE_VERSION"}
CTRDS=${MATRIX_CONTAINERDS:-"1.6 2.x"}
TESTS=${MATRIX_TESTS:-tests/e2e}
OUT=${MATRIX_OUT:-docs/support-matrix.md}
REPORTS=.local/matrix
# shellcheck disable=SC2206  # a list of names, no globs
KUBE_CMDS=(${MATRIX_KUBE_CMDS:-kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl})
mkdir -p "$REPORTS"

log() { echo "test-matrix: $*" >&2; }

bash hack/build-binaries.sh containerd >/dev/null
cells=()
for kube in $KUBES; do
  AGGAPI_KUBE_VERSION=$kube bash hack/build-binaries.sh "${KUBE_CMDS[@]}" >&2
  for ctrd in $CTRDS; do
    cell="kube-$kube.containerd-$ctrd"
    if [[ -n ${MATRIX_TABLE_ONLY:-} ]]; then  # rewrite the table from earlier reports
      [[ -f $REPORTS/$cell.xml ]] && cells+=("$cell")
      continue
    fi
    log "$cell: $TESTS"
    t0=$SECONDS
    # pytest's exit code is the table's business, not this script's.
    # shellcheck disable=SC2086
    flock /tmp/aggapi-e2e.lock env AGGAPI_KUBE_VERSION="$kube" AGGAPI_CONTAINERD="$ctrd" \
      python3 -m pytest -q -p no:cacheprovider $TESTS --junitxml="$REPORTS/$cell.xml" \
      >"$REPORTS/$cell.log" 2>&1 || true
    echo "$((SECONDS - t0))" >"$REPORTS/$cell.seconds"
    cells+=("$cell")
    log "$cell: $(tail -1 "$REPORTS/$cell.log")"
  done
done

python3 -m tests.framework.supportmatrix "$OUT" "$REPORTS" "$TESTS" "$CONTAINERD_VERSION" \
  "${cells[@]}"
