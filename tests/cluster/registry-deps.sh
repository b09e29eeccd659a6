#!/usr/bin/env bash
# The OCI registry of the local cluster: CNCF distribution (`registry`, the reference
# implementation behind Docker Hub's and most sites' registries), built from its Go module like
# the other binaries. Idempotent; prints the binary's path on stdout. `make release` pushes the
# images and the chart to it in the tests and the real node's containerd pulls from it
# (tests/cluster/controlplane.py starts it on loopback; see tests/cluster/README.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
cache_root="${SPYRE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/bin}"
out="$cache_root/distribution-$DISTRIBUTION_VERSION"
if [ -x "$out/registry" ]; then
  echo "$out/registry"
  exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$(GOFLAGS=-mod=mod go mod download -json "github.com/distribution/distribution/v3@$DISTRIBUTION_VERSION" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
cp -r "$src/." "$work/"
chmod -R u+w "$work"
echo "[registry-deps] building distribution $DISTRIBUTION_VERSION (./cmd/registry)" >&2
start=$(date +%s)
(cd "$work" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" \
   go build -trimpath -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION" \
   -o "$out/registry.tmp" ./cmd/registry)
mv "$out/registry.tmp" "$out/registry"
echo "[registry-deps] built in $(( $(date +%s) - start ))s" >&2
echo "$out/registry"
