#!/usr/bin/env bash
# The release's supply-chain tools, built from their Go modules like the other binaries:
#   cosign  signs and verifies the images and the chart by digest, and attaches the SBOMs as
#           in-toto attestations (github.com/sigstore/cosign/v2 ./cmd/cosign; key pairs only,
#           used offline: no Rekor, Fulcio or TUF)
#   syft    the SBOMs, SPDX JSON (github.com/anchore/syft ./cmd/syft)
# Built into a cache directory named by the two versions; idempotent, prints that directory.
# Each pinned version is downloaded and built as its own main module, with its own go.sum (as
# keda-deps.sh; the Go proxy here refuses some modules' version lists, so `go install ...@v` is
# not relied on). syft v1.57 needs Go >= 1.26.8. Cold, on 2 shared cores: ~8 min for both (the
# module cache grows ~3.9 GB); with the modules already downloaded, ~3 min each. Extra go flags
# (e.g. -p=1 on a busy machine) go in SUPPLYCHAIN_DEPS_GOFLAGS.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
# Pins (versions.env may set them instead). cosign: the newest v2 the proxy serves (v3 exists).
: "${COSIGN_VERSION:=v2.6.5}"
: "${SYFT_VERSION:=v1.57.2}"
log() { echo "[supplychain-deps] $*" >&2; }

cache_root="${SPYRE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/bin}"
out="$cache_root/supplychain-cosign-$COSIGN_VERSION-syft-$SYFT_VERSION"
if [ -x "$out/cosign" ] && [ -x "$out/syft" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# module_info <module> <version>: "<source dir in the module cache> <commit time>" (downloaded if missing)
module_info() {
  GOFLAGS=-mod=mod go mod download -json "$1@$2" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d["Dir"], json.load(open(d["Info"])).get("Time", "unknown"))'
}

# build <module> <version> <package> <binary> <go build flags> <ldflags -X ...>
build() {
  local mod=$1 ver=$2 pkg=$3 bin=$4 flags=$5 xflags=$6
  if [ -x "$out/$bin" ]; then
    return
  fi
  local info src date start
  info=$(module_info "$mod" "$ver")
  src=${info% *} date=${info##* }
  [ -d "$src" ] || { echo "no source for $mod@$ver: $info" >&2; exit 1; }
  xflags=${xflags//@DATE@/$date}
  log "building $bin $ver ($mod $pkg)"
  start=$(date +%s)
  cp -r "$src/." "$work/$bin/"
  chmod -R u+w "$work/$bin"
  # shellcheck disable=SC2086
  (cd "$work/$bin" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod ${SUPPLYCHAIN_DEPS_GOFLAGS:-}" \
     go build -trimpath $flags -ldflags "-s -w $xflags" -o "$out/$bin.tmp" "$pkg")
  mv "$out/$bin.tmp" "$out/$bin"
  log "built $bin in $(( $(date +%s) - start ))s ($(du -h "$out/$bin" | cut -f1))"
}

mkdir -p "$work/cosign" "$work/syft"
# `cosign version` prints these (sigs.k8s.io/release-utils/version, as cosign's Makefile sets them).
rv=sigs.k8s.io/release-utils/version
build github.com/sigstore/cosign/v2 "$COSIGN_VERSION" ./cmd/cosign cosign "" \
  "-X $rv.gitVersion=$COSIGN_VERSION -X $rv.gitCommit=$COSIGN_VERSION -X $rv.gitTreeState=clean -X $rv.buildDate=@DATE@"
# `syft version` prints these (cmd/syft/main.go, as syft's .goreleaser.yaml sets them, with its
# build tags: no gpgme (cgo) for containers/image signatures, no btrfs graph driver).
build github.com/anchore/syft "$SYFT_VERSION" ./cmd/syft syft "-tags=containers_image_openpgp,exclude_graphdriver_btrfs" \
  "-X main.version=${SYFT_VERSION#v} -X main.gitCommit=$SYFT_VERSION -X main.buildDate=@DATE@ -X main.gitDescription=$SYFT_VERSION"

echo "$out"
