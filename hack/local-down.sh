#!/usr/bin/env bash
# Stop everything hack/local-up.sh started, by PID (pidfiles under .local/controlplane/local/),
# delete its network namespaces and bridge, and remove its state. Safe to run twice.
# --keep-state keeps logs and PKI.
set -euo pipefail
cd "$(dirname "$0")/.."
# TODO(lead): the demo's containerd, registry and throttle stop here when it exists.
if python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("aggapi.testing.demo") is None)'; then
  python3 -m aggapi.testing.demo down || true
fi
python3 -m aggapi.testing.controlplane down "$@"
rm -f .local/local.env
echo "local-down: done"
