#!/usr/bin/env bash
# The test node's DRA driver (tests/cluster/dradriver/main.go: a kubelet plugin on Kubernetes'
# own k8s.io/dynamic-resource-allocation/kubeletplugin, standing in for IBM's spyre.ibm.com),
# built into a cache directory named by the Kubernetes version and a hash of the program and
# its go.sum; idempotent, prints that directory (spyre-dra-driver). Cold: ~2 core-minutes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
cache_root="${SPYRE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/bin}"
hash="$(cat "$here/dradriver/main.go" "$here/dradriver/go.mod" "$here/dradriver/go.sum" | sha256sum | cut -c1-12)"
out="$cache_root/dra-driver-$K8S_VERSION-$hash"
if [ -x "$out/spyre-dra-driver" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [ ! -x "$out/spyre-dra-driver" ]; then
  echo "[dra-deps] building spyre-dra-driver on k8s.io/dynamic-resource-allocation" >&2
  start=$(date +%s)
  want="v0${K8S_VERSION#v1}"
  grep -q "k8s.io/dynamic-resource-allocation $want\$" "$here/dradriver/go.mod" \
    || { echo "tests/cluster/dradriver/go.mod does not pin k8s.io/dynamic-resource-allocation $want (K8S_VERSION $K8S_VERSION)" >&2; exit 1; }
  (cd "$here/dradriver" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" \
     go build -trimpath -ldflags "-s -w" -o "$out/.spyre-dra-driver" .)
  mv "$out/.spyre-dra-driver" "$out/spyre-dra-driver"
  echo "[dra-deps] built in $(( $(date +%s) - start ))s" >&2
fi
echo "$out"
