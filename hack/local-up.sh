#!/usr/bin/env bash
# README's main command: bring up a real control plane on this machine and leave it running.
#   etcd (Debian) + kube-apiserver (built from k8s.io/kubernetes, cached) on a private bridge,
#   aggapi's APIService/Services/EndpointSlices/Node/RBAC, aggapi apiserver + agent in network
#   namespaces of their own, then a demo: a pod, a throttled pull, live progress.
# Idempotent: re-running reuses what is up. Everything binds to this machine (127.0.0.1 and
# 10.251.0.0/24 on a host-only bridge, no default route). State: .local/controlplane/local/.
# Stop everything with hack/local-down.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) != 0 ]]; then
  echo "local-up: needs root (network namespaces, containerd)" >&2
  exit 1
fi
T0=$SECONDS
mkdir -p .local
bash hack/install-deps.sh
bash hack/build-binaries.sh
T1=$SECONDS
python3 -m tests.framework.controlplane up >.local/local.env
# shellcheck disable=SC1091
source .local/local.env
echo "local-up: control plane up in $((SECONDS - T1))s"

# aggapi apiserver (the agent needs containerd: started by the demo below).
T2=$SECONDS
python3 -m tests.framework.controlplane start-apiserver
echo "local-up: aggapi apiserver up, APIService Available in $((SECONDS - T2))s"

# The node (containerd + runc, registry behind a throttle proxy, test images, aggapi agent)
# and a real kubelet (built from the same k8s.io/kubernetes release, cached), registered as
# the node; then pod "pull-demo" created through kube-apiserver: kubelet pulls its image
# through the throttle and `kubectl get --raw` of the /watch/ path shows it live.
T3=$SECONDS
python3 -m tests.framework.kubelet demo
echo "local-up: node + kubelet + demo in $((SECONDS - T3))s"

cat <<MSG

local-up: stack running ($((SECONDS - T0))s in all). Use it with:

  export KUBECONFIG=$KUBECONFIG
  kubectl get apiservice $(python3 -c 'from tests.framework.controlplane import APISERVICE; print(APISERVICE)')
  kubectl api-resources --api-group=subresources.aggapi.io
  kubectl get pods -o wide
  kubectl get --raw /apis/subresources.aggapi.io/v1alpha1/namespaces/default/pods/pull-demo/imagepullprogress

  state, logs, kubeconfigs:  $AGGAPI_STATE_DIR  (logs/, users/*.kubeconfig)
  status:                    python3 -m tests.framework.controlplane status
  stop everything:           bash hack/local-down.sh
MSG
