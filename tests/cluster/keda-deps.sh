#!/usr/bin/env bash
# KEDA and its HTTP add-on for scale-to-zero (wake on the first request), built from their Go
# modules like the other binaries of the local cluster, to run as plain processes with the
# cluster's kubeconfig. Idempotent; prints the cache dir on stdout. It holds:
#   keda                  KEDA operator (github.com/kedacore/keda/v2 cmd/operator)
#   keda-adapter          KEDA metrics API server: external metrics for the HPA, 1..N (cmd/adapter)
#   http-operator         HTTP add-on operator: HTTPScaledObject -> ScaledObject (./operator)
#   http-scaler           HTTP add-on external scaler, gRPC, polled by KEDA (./scaler)
#   http-interceptor      HTTP add-on proxy that holds requests while the target is at zero (./interceptor)
#   crds/keda/*.yaml      KEDA's CRDs (config/crd/bases)
#   crds/http-add-on/*.yaml  HTTPScaledObject (config/crd/bases)
# KEDA's admission webhooks (cmd/webhooks) are optional and not built.
#
# The Go proxy here refuses some modules' version lists, so `go install ...@v` fails: each pinned
# version is downloaded and built as its own main module, with its own go.sum (as metrics-deps.sh).
# KEDA v2.21 needs Go >= 1.26.0. Extra go flags (e.g. -p=1 on a busy machine) go in
# KEDA_DEPS_GOFLAGS.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
log() { echo "[keda-deps] $*" >&2; }

cache_root="${SPYRE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/bin}"
out="$cache_root/keda-$KEDA_VERSION-http-$KEDA_HTTP_ADDON_VERSION"
mkdir -p "$out"
# One build at a time: `make test` builds KEDA in the background (tests/streams.py) while the
# tests that need it may call this script too; they wait here for that build and reuse it.
exec 9>"$out/.lock"
flock 9

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# module source dir in the module cache (downloaded if missing)
module_dir() {
  GOFLAGS=-mod=mod go mod download -json "$1@$2" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

# a writable copy of a module, built as its own main module
module_copy() {
  local name=$1 src=$2
  if [ ! -d "$work/$name" ]; then
    mkdir -p "$work/$name"
    cp -r "$src/." "$work/$name/"
    chmod -R u+w "$work/$name"
  fi
  echo "$work/$name"
}

# build <module copy> <package> <binary name> <ldflags -X ...>
build() {
  local dir=$1 pkg=$2 bin=$3 xflags=$4
  if [ -x "$out/$bin" ]; then
    return
  fi
  log "building $bin ($pkg)"
  local start
  start=$(date +%s)
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod ${KEDA_DEPS_GOFLAGS:-}" \
     go build -trimpath -ldflags "-s -w $xflags" -o "$out/$bin.tmp" "$pkg")
  mv "$out/$bin.tmp" "$out/$bin"
  log "built $bin in $(( $(date +%s) - start ))s ($(du -h "$out/$bin" | cut -f1))"
}

keda_src=$(module_dir github.com/kedacore/keda/v2 "$KEDA_VERSION")
http_src=$(module_dir github.com/kedacore/http-add-on "$KEDA_HTTP_ADDON_VERSION")

if [ ! -x "$out/keda" ] || [ ! -x "$out/keda-adapter" ]; then
  log "building KEDA $KEDA_VERSION (first build: ~330 MB of modules, 1.9 GB unpacked; ~10 min on 2 cores)"
  keda=$(module_copy keda "$keda_src")
  kx="-X=github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v} -X=github.com/kedacore/keda/v2/version.GitCommit=$KEDA_VERSION"
  build "$keda" ./cmd/operator keda "$kx"
  build "$keda" ./cmd/adapter keda-adapter "$kx"
fi

if [ ! -x "$out/http-operator" ] || [ ! -x "$out/http-scaler" ] || [ ! -x "$out/http-interceptor" ]; then
  log "building KEDA HTTP add-on $KEDA_HTTP_ADDON_VERSION"
  http=$(module_copy http-add-on "$http_src")
  hx="-X github.com/kedacore/http-add-on/pkg/build.version=$KEDA_HTTP_ADDON_VERSION -X github.com/kedacore/http-add-on/pkg/build.gitCommit=$KEDA_HTTP_ADDON_VERSION"
  build "$http" ./operator http-operator "$hx"
  build "$http" ./scaler http-scaler "$hx"
  build "$http" ./interceptor http-interceptor "$hx"
fi

mkdir -p "$out/crds/keda" "$out/crds/http-add-on"
cp "$keda_src"/config/crd/bases/*.yaml "$out/crds/keda/"
cp "$http_src"/config/crd/bases/*.yaml "$out/crds/http-add-on/"
chmod u+w "$out"/crds/*/*.yaml

echo "$out"
