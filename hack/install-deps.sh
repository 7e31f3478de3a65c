#!/usr/bin/env bash
# Install everything aggapi's tests and local stack need on a fresh Debian machine.
# Idempotent: skips what is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(containerd runc docker-registry etcd-server busybox-static skopeo
          containernetworking-plugins iproute2 iptables)
# hack/build-image.sh: the image's Debian base (mmdebstrap) and its build without a Docker engine.
APT_PKGS+=(mmdebstrap buildah)
# The harness's release registry: a bcrypt htpasswd file (htpasswd -B).
APT_PKGS+=(apache2-utils)
# benchmarks/perf_floors.py and its tests: perf samples, binutils to classify stripped code.
APT_PKGS+=(linux-perf binutils)
# tests/agent/copy/test_plain_tar.py: raw directory downloads extract silently with bsdtar too.
APT_PKGS+=(libarchive-tools)
# setup.py: the ncp client's compiled extraction loop (aggapi/client/_fastextract.c).
APT_PKGS+=(gcc python3-dev)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's containerd package starts a system daemon; ours run with their own config.
if command -v systemctl >/dev/null 2>&1; then systemctl disable --now containerd >/dev/null 2>&1 || true; fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 -c 'from aggapi.client import fastpath; assert fastpath.loaded()' 2>/dev/null ||
  echo "install-deps: the compiled extraction loop was not built (ncp uses its Python path)" >&2
# The generated gRPC stubs are committed; regenerate only if missing.
[ -f aggapi/proto/cri_pb2.py ] || bash hack/gen-proto.sh
