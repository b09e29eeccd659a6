#!/usr/bin/env bash
# The autoscaling pipeline of the local cluster (tests/cluster/metrics.py), installed the way a
# production cluster has it: Prometheus (Debian's package, run as a plain process, never as the
# package's service) and prometheus-adapter built from its Go module. Idempotent; prints the
# adapter binary's path on stdout. With --prometheus-only, only Prometheus: `make deps` installs
# it (the local session's dashboard test scrapes with it), and `make test` builds the adapter
# in the background (tests/streams.py; ~1.5 min cold, for the autoscaling tests only), before
# KEDA; a test that needs it first waits here for that build (one build at a time: a lock).
#
# The Go proxy here refuses the module's version list, so `go install ...@v` (which asks for it
# to check deprecations) fails: the pinned version is downloaded and built as its own main
# module, with its own go.sum.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
log() { echo "[metrics-deps] $*" >&2; }

if ! dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q "install ok installed"; then
  if [ "$(id -u)" != 0 ]; then
    log "autoscaling tests need Debian's prometheus package (apt-get install as root)"
  else
    log "installing prometheus"
    "$here/apt-install.sh" prometheus
  fi
fi

[ "${1:-}" = --prometheus-only ] && exit 0

cache_root="${SPYRE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/bin}"
out="$cache_root/prometheus-adapter-$PROMETHEUS_ADAPTER_VERSION"
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [ ! -x "$out/adapter" ]; then
  log "building prometheus-adapter $PROMETHEUS_ADAPTER_VERSION (~3-6 min on 2 cores)"
  start=$(date +%s)
  src=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/prometheus-adapter@$PROMETHEUS_ADAPTER_VERSION" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  (cd "$work" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" \
     go build -trimpath -ldflags "-s -w" -o "$out/adapter.tmp" ./cmd/adapter)
  mv "$out/adapter.tmp" "$out/adapter"
  log "built in $(( $(date +%s) - start ))s"
fi
echo "$out/adapter"
