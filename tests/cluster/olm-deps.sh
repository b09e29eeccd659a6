#!/usr/bin/env bash
# The operator framework's bundle validators (tests/cluster/olm/main.go on its api Go module,
# github.com/operator-framework/api) and its ClusterServiceVersion CRD, for the OLM bundle test.
# Built into a cache directory named by the version and a hash of the program and its go.sum;
# idempotent, prints that directory (olm-validate, and the CRD beside it). Cold: a few minutes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
cache_root="${SPYRE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/bin}"
hash="$(cat "$here/olm/main.go" "$here/olm/go.mod" "$here/olm/go.sum" | sha256sum | cut -c1-12)"
out="$cache_root/olm-$OPERATOR_FRAMEWORK_API_VERSION-$hash"
crd=operators.coreos.com_clusterserviceversions.yaml
if [ -x "$out/olm-validate" ] && [ -s "$out/$crd" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [ ! -x "$out/olm-validate" ] || [ ! -s "$out/$crd" ]; then
  echo "[olm-deps] building olm-validate on operator-framework/api $OPERATOR_FRAMEWORK_API_VERSION" >&2
  start=$(date +%s)
  grep -q "github.com/operator-framework/api $OPERATOR_FRAMEWORK_API_VERSION\$" "$here/olm/go.mod" \
    || { echo "tests/cluster/olm/go.mod does not pin $OPERATOR_FRAMEWORK_API_VERSION" >&2; exit 1; }
  (cd "$here/olm" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" \
     go build -trimpath -ldflags "-s -w" -o "$out/.olm-validate" .)
  dir="$(cd "$here/olm" && go list -m -f '{{.Dir}}' github.com/operator-framework/api)"
  install -m 0644 "$dir/crds/$crd" "$out/$crd"
  mv "$out/.olm-validate" "$out/olm-validate"
  echo "[olm-deps] built in $(( $(date +%s) - start ))s" >&2
fi
echo "$out"
