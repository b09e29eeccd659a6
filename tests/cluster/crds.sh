#!/usr/bin/env bash
# Fetch (or reuse) third-party CRDs the tests install into the real API server, from each
# project's own Go module through the Go module proxy (`go mod download`; no GitHub access):
#   - InferencePool (inference.networking.k8s.io/v1), Gateway API Inference Extension:
#     sigs.k8s.io/gateway-api-inference-extension, config/crd/bases/
#   - PodMonitor and ServiceMonitor (monitoring.coreos.com/v1), Prometheus Operator:
#     github.com/prometheus-operator/prometheus-operator, example/prometheus-operator-crd/
# Versions are pinned in versions.env. Prints the cache directory (outside the repository).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
gie="$GATEWAY_API_INFERENCE_EXTENSION_VERSION" prom="$PROMETHEUS_OPERATOR_VERSION"
cache_root="${SPYRE_CRD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/crds}"
out="$cache_root/gie-$gie.prometheus-operator-$prom"
files=(inference.networking.k8s.io_inferencepools.yaml monitoring.coreos.com_podmonitors.yaml
       monitoring.coreos.com_servicemonitors.yaml)
complete=1
for f in "${files[@]}"; do [ -s "$out/$f" ] || complete=0; done
if [ "$complete" = 1 ]; then echo "$out"; exit 0; fi

module_dir() {  # module@version -> its directory in the module cache
  local json
  json="$(cd "$tmp" && go mod download -json "$1")"
  python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d.get("Error")) if d.get("Error") else print(d["Dir"])' <<<"$json"
}
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out" "$tmp/out"
d="$(module_dir "sigs.k8s.io/gateway-api-inference-extension@$gie")"
cp "$d/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$tmp/out/"
d="$(module_dir "github.com/prometheus-operator/prometheus-operator@$prom")"
cp "$d/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" \
   "$d/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" "$tmp/out/"
chmod 0644 "$tmp/out"/*.yaml
mv "$tmp/out"/*.yaml "$out/"
echo "[crds] fetched ${files[*]} into $out" >&2
echo "$out"
