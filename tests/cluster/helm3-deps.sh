#!/usr/bin/env bash
# Helm 3, beside the cluster's Helm 4 (build.sh): many sites (OpenShift's console among them)
# still install charts with Helm 3, and the chart tests install, upgrade and uninstall with both.
# Built from its Go module like the other binaries, into a cache directory of its own (pinning
# another version rebuilds nothing else). Idempotent; prints the binary's path on stdout.
# Cold: a few minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
cache_root="${SPYRE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/bin}"
out="$cache_root/helm-$HELM3_VERSION"
if [ -x "$out/helm" ]; then
  echo "$out/helm"
  exit 0
fi
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [ ! -x "$out/helm" ]; then
  echo "[helm3-deps] building helm $HELM3_VERSION" >&2
  start=$(date +%s)
  GOBIN="$out/.gobin" CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM3_VERSION"
  mv "$out/.gobin/helm" "$out/helm"
  rmdir "$out/.gobin"
  echo "[helm3-deps] built in $(( $(date +%s) - start ))s" >&2
fi
echo "$out/helm"
