#!/usr/bin/env bash
# README's main command: aggapi installed the way a user installs it, on a real two-node
# cluster on this machine, and a demo pull.
#   1. dependencies and the Go-built binaries (etcd, kube-apiserver, kube-controller-manager,
#      kube-scheduler, kubelet, kube-proxy, kubectl, helm; built once, cached);
#   2. the cluster (tests.framework.cluster): control plane on a private bridge, a registry
#      behind a throttle proxy, two nodes each with containerd + kubelet + kube-proxy in
#      namespaces of their own, pod CIDRs routed, ClusterIP Services;
#   3. the image (hack/build-image.sh: OCI archive, rebuilt only when its inputs change);
#   4. the image imported into both nodes' containerd, then `helm install aggapi
#      manifests/charts/aggapi -n aggapi --create-namespace` (tests.framework.addon); on a
#      re-run, `helm upgrade` and a restart of the pods instead;
#   5. the demo: a pod on node 2 pulls a ~150 MB image through the throttle, its progress
#      followed live through the aggregated API.
# Prints each step's time and `kubectl -n aggapi get pods -o wide`. Idempotent: a re-run
# reuses what is up. Everything binds to this machine (10.251.0.0/16 on a host-only bridge,
# no default route). State: .local/controlplane/local/. Stop everything: hack/local-down.sh.
# AGGAPI_SKIP_DEPS=1 skips hack/install-deps.sh (packages and the editable install).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) != 0 ]]; then
  echo "local-up: needs root (network namespaces, containerd)" >&2
  exit 1
fi
export AGGAPI_INSTANCE=local
T0=$SECONDS
declare -a TIMES=()
step() { TIMES+=("$(printf '%-34s %4ds' "$1" $((SECONDS - $2)))"); echo "local-up: $1 in $((SECONDS - $2))s"; }
mkdir -p .local

t=$SECONDS
[[ -n ${AGGAPI_SKIP_DEPS:-} ]] || bash hack/install-deps.sh
bash hack/build-binaries.sh >/dev/null
step "dependencies and binaries" "$t"

t=$SECONDS
if python3 -m tests.framework.cluster status 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
ok = d["nodes"] and all(n.get("ready") and n.get("kube-proxy healthy") for n in d["nodes"])
sys.exit(0 if ok else 1)'; then
  echo "local-up: two-node cluster already up"
else
  python3 -m tests.framework.cluster up >/dev/null
fi
python3 -m tests.framework.controlplane env >.local/local.env
# shellcheck disable=SC1091
source .local/local.env
step "control plane and two nodes" "$t"

t=$SECONDS
bash hack/build-image.sh | tail -2
step "image (hack/build-image.sh)" "$t"

t=$SECONDS
python3 -m tests.framework.addon install >/dev/null
step "image import + helm install, Ready" "$t"

t=$SECONDS
python3 -m tests.framework.addon demo
step "demo pull on node 2" "$t"

echo
"$AGGAPI_KUBECTL" -n aggapi get pods -o wide
echo
printf 'local-up: %s\n' "${TIMES[@]}"
echo "local-up: all in $((SECONDS - T0))s"
cat <<MSG

local-up: aggapi installed with helm on two nodes. Use it with:

  export KUBECONFIG=$KUBECONFIG
  export PATH=$PWD/.local/bin:\$PATH   (kubectl and helm of the pinned releases)
  kubectl get apiservice v1alpha1.subresources.aggapi.io
  kubectl -n aggapi get pods -o wide
  kubectl get --raw /apis/subresources.aggapi.io/v1alpha1/nodes/aggapi-worker-2/imagepulls
  kubectl get --raw /apis/subresources.aggapi.io/v1alpha1/namespaces/default/pods/pull-demo/imagepullprogress
  helm --kubeconfig \$KUBECONFIG -n aggapi status aggapi

  demo pull again:   python3 -m tests.framework.addon demo
  state, logs:       $AGGAPI_STATE_DIR  (logs/, nodes/)
  status:            python3 -m tests.framework.cluster status
  stop everything:   bash hack/local-down.sh
MSG
