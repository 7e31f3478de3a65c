#!/usr/bin/env bash
# README's main command: aggapi installed the way a user installs it, on a real two-node
# cluster on this machine, and a demo pull.
#   1. dependencies and the Go-built binaries (etcd, kube-apiserver, kube-controller-manager,
#      kube-scheduler, kubelet, kube-proxy, kubectl, helm, cosign, syft; built once, cached);
#   2. the cluster (tests.framework.cluster): control plane on a private bridge, a registry
#      behind a throttle proxy, a second registry with htpasswd auth, two nodes each with
#      containerd + kubelet + kube-proxy in namespaces of their own, pod CIDRs routed,
#      ClusterIP Services;
#   3. the image (hack/build-image.sh: OCI archive, rebuilt only when its inputs change);
#   4. a release as users receive one (hack/release.sh, tests.framework.addon): image and
#      chart pushed to the htpasswd registry (image by digest, chart as an OCI artifact),
#      SBOM, cosign signatures; then `cosign verify` of both, `helm registry login`, an
#      imagePullSecret, and `helm install aggapi oci://REGISTRY/charts/aggapi@sha256:...
#      -n aggapi` (the chart by the digest cosign verified): both nodes pull the image by digest through the Secret; on a re-run,
#      `helm upgrade` instead;
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
ok = ok and d.get("release_registry")  # a cluster of an older checkout lacks it
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
step "release + helm install (OCI), Ready" "$t"

t=$SECONDS
python3 -m tests.framework.addon demo
step "demo pull on node 2" "$t"

echo
"$AGGAPI_KUBECTL" -n aggapi get pods -o wide
echo
printf 'local-up: %s\n' "${TIMES[@]}"
echo "local-up: all in $((SECONDS - T0))s"
release_field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' \
  "$AGGAPI_STATE_DIR/release/release.json" "$1"; }
echo "local-up: chart $(release_field chart)@$(release_field chart_digest) (version $(release_field chart_version))"
echo "local-up: image $(release_field image)"
echo "local-up: image digest $(release_field image_digest)"
cat <<MSG

local-up: aggapi installed with helm on two nodes. Use it with:

  export KUBECONFIG=$KUBECONFIG
  export PATH=$PWD/.local/bin:\$PATH   (kubectl and helm of the pinned releases)
  kubectl get apiservice v1alpha1.subresources.aggapi.io
  kubectl -n aggapi get pods -o wide
  kubectl get --raw /apis/subresources.aggapi.io/v1alpha1/nodes/aggapi-worker-2/imagepulls
  kubectl get --raw /apis/subresources.aggapi.io/v1alpha1/namespaces/default/pods/pull-demo/imagepullprogress
  helm --kubeconfig \$KUBECONFIG -n aggapi status aggapi
  cosign verify --key $AGGAPI_STATE_DIR/release/cosign.pub --insecure-ignore-tlog=true \\
      --allow-http-registry $(release_field image)
      (registry login: DOCKER_CONFIG=$AGGAPI_STATE_DIR/release/auth)

  demo pull again:   python3 -m tests.framework.addon demo
  state, logs:       $AGGAPI_STATE_DIR  (logs/, nodes/)
  status:            python3 -m tests.framework.cluster status
  stop everything:   bash hack/local-down.sh
MSG
