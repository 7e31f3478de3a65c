#!/usr/bin/env bash
# Stop everything hack/local-up.sh started, by PID (pidfiles under .local/controlplane/local/),
# delete its network namespaces and bridge, and remove its state. Safe to run twice.
# --keep-state keeps logs and PKI.
set -euo pipefail
cd "$(dirname "$0")/.."
# kubelet first, then the node: agent, containerd (its containers, shims, mounts, cgroups),
# throttle proxy and registry, each by its pidfile. (controlplane down would do it too.)
T0=$SECONDS
python3 -m tests.framework.kubelet down || true  # kubelet, and the pods' sandboxes
python3 -m tests.framework.demo down || true
python3 -m tests.framework.controlplane down "$@"
rm -f .local/local.env
echo "local-down: done in $((SECONDS - T0))s"
