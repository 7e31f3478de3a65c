#!/usr/bin/env bash
# Build the kubectl plugins as self-contained archives, one per plugin and platform
# (linux amd64/arm64, darwin amd64/arm64), and render their krew manifests.
#
# Each archive (krew-style tar.gz) holds LICENSE, the plugin's completion executable
# (kubectl_complete-<plugin>: a short Python launcher that runs the zipapp beside it
# with shiv's SHIV_ENTRY_POINT set to aggapi.plugins.complete) and one executable,
# kubectl-ncp or kubectl-image_pull_progress: a zipapp with aggapi (--no-deps) plus exactly
# the plugins' dependencies (aiohttp and PyYAML from the core, the "plugins" extra), as
# binary wheels fetched for the target platform and CPython 3.11. It runs with the
# user's python3; none of the server's gRPC, protobuf, prometheus, crypto or uvloop
# stack is inside. (aiohttp, multidict, yarl, frozenlist, propcache and PyYAML fall back
# to pure Python when their cp311 extensions do not load, so other Pythons >= 3.11 run
# it too, only slower.)
#
# Zipapps are made with shiv (PyPI, pinned below) rather than pex: shiv packages a
# site-packages directory we fill ourselves with `pip install --platform`, so the
# cross-platform resolution is plain pip; its runtime is a small bootstrap that unpacks
# once into ~/.shiv and then only checks a build id (pex re-resolves its environment at
# start, which costs more on every `kubectl ncp --help`); and --reproducible gives a
# byte-identical zipapp for identical inputs, so the archive's sha256 is stable.
#
# Usage: hack/build-plugins.sh [--version vX.Y.Z] [--base-url URL] [--out DIR]
#   --version   the release version, default v<pyproject version>
#   --base-url  where the release's archives will be downloaded from; a manifest's uri
#               is BASE_URL/<archive name>. Default:
#               https://github.com/aggapi/aggapi/releases/download/VERSION
#   --out       default dist/plugins (gitignored)
# Output: OUT/<exe>-VERSION-<os>-<arch>.tar.gz and OUT/krew/{ncp,image-pull-progress}.yaml.
# plugins/krew/*.yaml are templates (everything but spec.version and spec.platforms);
# the rendered manifests with the real sha256 values are what a release publishes.
#
# Env: AGGAPI_PLUGINS_CACHE (default /var/cache/aggapi-plugins), outside the clone: the
# shiv tool venv and the per-platform wheelhouses. A wheelhouse is fetched again only
# when the requirements change, so a re-run is fast and works offline.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${AGGAPI_PLUGINS_CACHE:-/var/cache/aggapi-plugins}"
PY="${PYTHON:-python3}"
SHIV_VERSION=1.0.8
PY_VERSION=3.11
ABI=cp311
PLATFORMS=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64)
declare -A WHEEL_TAG=(
  [linux/amd64]=manylinux2014_x86_64 [linux/arm64]=manylinux2014_aarch64
  [darwin/amd64]=macosx_11_0_x86_64 [darwin/arm64]=macosx_11_0_arm64)
declare -A MODULE=(
  [ncp]=aggapi.plugins.ncp [image-pull-progress]=aggapi.plugins.image_pull_progress)
declare -A EXE=([ncp]=kubectl-ncp [image-pull-progress]=kubectl-image_pull_progress)
declare -A COMPLETER=(
  [ncp]=kubectl_complete-ncp [image-pull-progress]=kubectl_complete-image_pull_progress)

VERSION="v$("$PY" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$REPO/pyproject.toml")"
BASE_URL=""
OUT="$REPO/dist/plugins"
while (($#)); do
  case "$1" in
    --version) VERSION="$2"; shift 2 ;;
    --base-url) BASE_URL="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: $0 [--version vX.Y.Z] [--base-url URL] [--out DIR]" >&2; exit 2 ;;
  esac
done
BASE_URL="${BASE_URL:-https://github.com/aggapi/aggapi/releases/download/$VERSION}"
T0=$(date +%s)
log() { echo "build-plugins: [$(($(date +%s) - T0))s] $*"; }
release() { "$PY" "$REPO/hack/plugin_release.py" "$@"; }

mkdir -p "$CACHE" "$OUT/krew"
OUT="$(cd "$OUT" && pwd)"
exec 9>"$CACHE/lock"   # one build at a time: the wheelhouses are shared
flock 9
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PIP=(--disable-pip-version-check -q)
# Archives and zipapps carry the last commit's time: same tree, same sha256.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 0)}"

# --- tools: shiv in its own venv (never the project's environment) ---------------------
TOOLS="$CACHE/tools-shiv-$SHIV_VERSION"
if [[ ! -x "$TOOLS/bin/shiv" ]]; then
  log "venv with shiv==$SHIV_VERSION"
  rm -rf "$TOOLS"
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install "${PIP[@]}" "shiv==$SHIV_VERSION"
fi

# --- wheelhouses: binary wheels for each target ----------------------------------------
mapfile -t REQS < <(release requirements)
target_flags() {
  echo --only-binary=:all: --platform "${WHEEL_TAG[$1]}" --python-version "$PY_VERSION" \
    --implementation cp --abi "$ABI"
}
for platform in "${PLATFORMS[@]}"; do
  house="$CACHE/wheels/${platform/\//-}"
  key="$(printf '%s\n' "${REQS[@]}" "${WHEEL_TAG[$platform]}" "$ABI")"
  if [[ -f "$house/.key" && "$(cat "$house/.key")" == "$key" ]]; then
    continue
  fi
  log "pip download for $platform (${WHEEL_TAG[$platform]}): ${REQS[*]}"
  rm -rf "$house"
  # shellcheck disable=SC2046
  "$TOOLS/bin/pip" download "${PIP[@]}" $(target_flags "$platform") -d "$house.tmp" "${REQS[@]}"
  printf '%s\n' "$key" >"$house.tmp/.key"
  mv "$house.tmp" "$house"
done

# --- aggapi itself (pure Python), from a copy: a build writes into its source tree ------
mkdir -p "$WORK/src" "$WORK/aggapi-wheel"
cp "$REPO/pyproject.toml" "$REPO/README.md" "$WORK/src/"
tar -C "$REPO" --exclude=__pycache__ --exclude='*.pyc' --exclude='*.so' -cf - aggapi | tar -C "$WORK/src" -xf -
log "aggapi wheel"
"$PY" -m pip wheel "${PIP[@]}" --no-deps --no-build-isolation -w "$WORK/aggapi-wheel" "$WORK/src" \
  2>/dev/null ||
  "$PY" -m pip wheel "${PIP[@]}" --no-deps -w "$WORK/aggapi-wheel" "$WORK/src"

# --- zipapps and archives --------------------------------------------------------------
cp "$REPO/LICENSE" "$WORK/LICENSE"
for platform in "${PLATFORMS[@]}"; do
  house="$CACHE/wheels/${platform/\//-}"
  site="$WORK/${platform/\//-}/site-packages"
  # shellcheck disable=SC2046
  "$TOOLS/bin/pip" install "${PIP[@]}" --no-index --find-links "$house" --no-compile \
    --target "$site" $(target_flags "$platform") "${REQS[@]}"
  rm -rf "$site/bin"   # console-script launchers for this host's Python: not wanted
  "$TOOLS/bin/pip" install "${PIP[@]}" --no-index --no-deps --no-compile --target "$site" \
    "$WORK"/aggapi-wheel/aggapi-*.whl
  rm -rf "$site/bin"
  # pip records the wheel's temp path: drop it, or no two builds would be identical.
  rm "$site"/aggapi-*.dist-info/direct_url.json
  sed -i '/direct_url\.json,/d' "$site"/aggapi-*.dist-info/RECORD
  for plugin in ncp image-pull-progress; do
    exe="$WORK/${platform/\//-}/${EXE[$plugin]}"
    "$TOOLS/bin/shiv" --site-packages "$site" -e "${MODULE[$plugin]}:main" \
      -p '/usr/bin/env python3' --reproducible -o "$exe" >/dev/null
    completer="$WORK/${platform/\//-}/${COMPLETER[$plugin]}"
    release completer "$plugin" "$completer"
    release archive "$OUT/$(release archive-name "$plugin" "$VERSION" "$platform")" \
      "$exe" "$completer" "$WORK/LICENSE"
  done
  log "archives for $platform"
done

for plugin in ncp image-pull-progress; do
  release manifest "$REPO/plugins/krew/$plugin.yaml" "$OUT/krew/$plugin.yaml" "$VERSION" \
    "$BASE_URL" "$OUT" "${PLATFORMS[@]}"
done
log "done: $OUT"
(cd "$OUT" && ls -l ./*-"$VERSION"-*.tar.gz krew/*.yaml | awk '{ printf "  %10d  %s\n", $5, $9 }')
