#!/usr/bin/env bash
# A release as users receive one, pushed to a registry:
#   1. the image of hack/build-image.sh (its OCI archive) copied to REGISTRY/aggapi by
#      skopeo, digests preserved; everything after refers to it by digest;
#   2. the chart packaged (`helm package`, version from Chart.yaml) with values'
#      image.repository and image.digest set to that image, and pushed as an OCI artifact
#      (`helm push ... oci://REGISTRY/charts`);
#   3. an SPDX JSON SBOM of the image (syft, from the archive);
#   4. cosign signatures of the image and the chart (by digest; no transparency log:
#      the key is this run's own), and the SBOM attached to the image as a signed
#      attestation (`cosign verify-attestation --type spdxjson`).
# The key pair is generated at the first run into OUT (gitignored), encrypted with
# COSIGN_PASSWORD (from the environment, else generated into OUT/cosign.password).
# Prints the chart reference, the chart version and the image digest; OUT/release.json
# holds them for scripts (tests.framework.release).
#
# Usage: hack/release.sh --registry HOST[:PORT] [--username USER] [--plain-http]
#                        [--archive ARCHIVE] [--chart DIR] [--chart-version VERSION]
#                        [--out OUT]
#   password: REGISTRY_PASSWORD in the environment (never on the command line)
#   ARCHIVE   default: hack/build-image.sh's, built first if out of date
#   DIR       default manifests/charts/aggapi (another, e.g. an earlier commit's chart, to
#             publish a previous version for the upgrade e2e)
#   OUT       default .local/release
#   --plain-http: the registry speaks HTTP (a test registry), not HTTPS
# Needs skopeo (hack/install-deps.sh); helm, cosign and syft come from
# hack/build-binaries.sh (run here when their links are missing).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHART="$ROOT/manifests/charts/aggapi"
REGISTRY="" USERNAME="" PLAIN_HTTP=0 ARCHIVE="" CHART_VERSION="" OUT="$ROOT/.local/release"
while (($#)); do
  case "$1" in
    --registry) REGISTRY="$2"; shift 2 ;;
    --username) USERNAME="$2"; shift 2 ;;
    --plain-http) PLAIN_HTTP=1; shift ;;
    --archive) ARCHIVE="$2"; shift 2 ;;
    --chart) CHART="$2"; shift 2 ;;
    --chart-version) CHART_VERSION="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) sed -n '/^# Usage/,/^# Needs/p' "$0" >&2; exit 2 ;;
  esac
done
[[ -n $REGISTRY ]] || { echo "release: --registry HOST[:PORT] is required" >&2; exit 2; }
if [[ -n $USERNAME && -z ${REGISTRY_PASSWORD:-} ]]; then
  echo "release: --username needs REGISTRY_PASSWORD in the environment" >&2; exit 2
fi
T0=$SECONDS
log() { echo "release: [$((SECONDS - T0))s] $*" >&2; }
# The pinned tools (built once from their Go modules, cached; linked in .local/bin).
for t in helm cosign syft; do
  [[ -x $ROOT/.local/bin/$t ]] || bash "$ROOT/hack/build-binaries.sh" helm cosign syft >&2
done
HELM=$ROOT/.local/bin/helm COSIGN=$ROOT/.local/bin/cosign SYFT=$ROOT/.local/bin/syft
command -v skopeo >/dev/null || { echo "release: skopeo missing: run hack/install-deps.sh" >&2; exit 1; }

mkdir -p "$OUT"
chmod 0700 "$OUT"
if [[ -z $ARCHIVE ]]; then
  ARCHIVE="${AGGAPI_IMAGE_CACHE:-/var/cache/aggapi-image}/aggapi-dev.oci.tar"
  bash "$ROOT/hack/build-image.sh" -o "$ARCHIVE" >&2
fi
[[ -f $ARCHIVE ]] || { echo "release: $ARCHIVE missing (hack/build-image.sh -o $ARCHIVE)" >&2; exit 1; }

# One docker-style auth file for helm, skopeo and cosign (helm registry login writes it),
# so no credential lands in the invoking user's ~/.docker or ~/.config/helm.
AUTH_DIR="$OUT/auth"
mkdir -p "$AUTH_DIR"
chmod 0700 "$AUTH_DIR"
AUTH="$AUTH_DIR/config.json"
[[ -f $AUTH ]] || echo '{}' >"$AUTH"
export DOCKER_CONFIG="$AUTH_DIR"  # cosign reads $DOCKER_CONFIG/config.json
helm_oci=(--registry-config "$AUTH")
skopeo_tls=()
cosign_http=()
if ((PLAIN_HTTP)); then
  helm_oci+=(--plain-http)
  skopeo_tls=(--dest-tls-verify=false)
  cosign_http=(--allow-http-registry --allow-insecure-registry)
fi
if [[ -n $USERNAME ]]; then
  log "helm registry login $REGISTRY as $USERNAME"
  printf '%s' "$REGISTRY_PASSWORD" |
    "$HELM" registry login "$REGISTRY" "${helm_oci[@]}" --username "$USERNAME" --password-stdin >&2
fi

# --- 1. image, by digest ----------------------------------------------------------------
version=$(awk '$1=="version:"{print $2; exit}' "$CHART/Chart.yaml")
CHART_VERSION=${CHART_VERSION:-$version}
image_repo="$REGISTRY/aggapi"
log "skopeo copy oci-archive:$ARCHIVE docker://$image_repo:$CHART_VERSION"
skopeo copy --quiet --preserve-digests --authfile "$AUTH" "${skopeo_tls[@]}" \
  --digestfile "$OUT/image.digest" "oci-archive:$ARCHIVE" "docker://$image_repo:$CHART_VERSION" >&2
digest=$(cat "$OUT/image.digest")
[[ $digest == sha256:* ]] || { echo "release: no digest from skopeo ($digest)" >&2; exit 1; }
image_ref="$image_repo@$digest"
log "image $image_ref"

# --- 2. chart ---------------------------------------------------------------------------
pkg=$(mktemp -d "$OUT/chart.XXXXXX")
trap 'rm -rf "$pkg"' EXIT
cp -r "$CHART" "$pkg/aggapi"
# Only the two image lines change; values.yaml's comments (helm-docs) stay as they are.
python3 - "$pkg/aggapi/values.yaml" "$image_repo" "$digest" <<'PY'
import re, sys
path, repo, digest = sys.argv[1:]
text = open(path).read()
for key, val in (("repository", repo), ("digest", f'"{digest}"')):
    text, n = re.subn(rf"(?m)^(image:\n(?:  .*\n)*?  {key}:) .*$", rf"\1 {val}", text, count=1)
    if n != 1:
        sys.exit(f"release: no image.{key} in {path}")
open(path, "w").write(text)
PY
rm -f "$OUT"/aggapi-*.tgz
"$HELM" package "$pkg/aggapi" --version "$CHART_VERSION" --destination "$OUT" >&2
tgz="$OUT/aggapi-$CHART_VERSION.tgz"
log "helm push $tgz oci://$REGISTRY/charts"
push_out=$("$HELM" push "$tgz" "oci://$REGISTRY/charts" "${helm_oci[@]}" 2>&1) ||
  { echo "$push_out" >&2; exit 1; }
echo "$push_out" >&2
chart_digest=$(awk '$1=="Digest:"{print $2; exit}' <<<"$push_out")
[[ $chart_digest == sha256:* ]] || { echo "release: no digest from helm push" >&2; exit 1; }
chart_ref="oci://$REGISTRY/charts/aggapi"

# --- 3. SBOM ----------------------------------------------------------------------------
log "syft scan oci-archive:$ARCHIVE -o spdx-json"
SYFT_CHECK_FOR_APP_UPDATE=false "$SYFT" scan --quiet "oci-archive:$ARCHIVE" \
  -o "spdx-json=$OUT/sbom.spdx.json"

# --- 4. keys and signatures -------------------------------------------------------------
if [[ -z ${COSIGN_PASSWORD:-} ]]; then
  if [[ ! -f $OUT/cosign.password ]]; then
    (umask 077; head -c 24 /dev/urandom | base64 >"$OUT/cosign.password")
    rm -f "$OUT/cosign.key" "$OUT/cosign.pub"  # a key only the old password opens
  fi
  COSIGN_PASSWORD=$(cat "$OUT/cosign.password")
fi
export COSIGN_PASSWORD
if [[ ! -f $OUT/cosign.key ]]; then
  log "cosign generate-key-pair into $OUT"
  (cd "$OUT" && "$COSIGN" generate-key-pair --output-key-prefix cosign >&2)
fi
sign() {
  "$COSIGN" sign --yes --key "$OUT/cosign.key" --tlog-upload=false "${cosign_http[@]}" "$1" >&2
}
log "cosign sign $image_ref and $REGISTRY/charts/aggapi@$chart_digest"
sign "$image_ref"
sign "$REGISTRY/charts/aggapi@$chart_digest"
"$COSIGN" attest --yes --key "$OUT/cosign.key" --tlog-upload=false "${cosign_http[@]}" \
  --type spdxjson --predicate "$OUT/sbom.spdx.json" "$image_ref" >&2

python3 - "$OUT/release.json" <<PY
import json, sys
json.dump({"registry": "$REGISTRY", "chart": "$chart_ref", "chart_version": "$CHART_VERSION",
           "chart_digest": "$chart_digest", "image": "$image_ref", "image_digest": "$digest",
           "sbom": "$OUT/sbom.spdx.json", "public_key": "$OUT/cosign.pub",
           "package": "$tgz"}, open(sys.argv[1], "w"), indent=2)
PY
log "done"
echo "chart:         $chart_ref --version $CHART_VERSION ($chart_digest)"
echo "image:         $image_ref"
echo "image digest:  $digest"
echo "sbom:          $OUT/sbom.spdx.json"
echo "verify:        cosign verify --key $OUT/cosign.pub $image_ref"
