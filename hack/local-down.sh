#!/usr/bin/env bash
# Stop everything hack/local-up.sh started, by PID (pidfiles under .local/controlplane/local/):
# the helm release, the two nodes (containerd, kubelet, kube-proxy, their namespaces, routes,
# mounts and cgroups), the registry and throttle, the control plane; then remove the state.
# Safe to run twice. --keep-state keeps logs and PKI.
set -euo pipefail
cd "$(dirname "$0")/.."
export AGGAPI_INSTANCE=local
T0=$SECONDS
python3 -m tests.framework.addon uninstall >/dev/null 2>&1 || true
python3 -m tests.framework.cluster down || true
# The single-node stack of earlier versions, if one is left (each by its pidfile).
python3 -m tests.framework.kubelet down || true
python3 -m tests.framework.demo down || true
python3 -m tests.framework.controlplane down "$@"
rm -f .local/local.env
echo "local-down: done in $((SECONDS - T0))s"
