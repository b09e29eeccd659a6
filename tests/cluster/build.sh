#!/usr/bin/env bash
# Build (or reuse) the pinned control-plane binaries in a cache outside the repository.
# Prints the cache directory on stdout. Cold build on 2 cores: ~20-26 min (measured 25.6 min under load); warm: instant.
# kubelet and kube-proxy (the real node, node.py) come from the same k8s.io/kubernetes module.
# CoreDNS (cluster DNS) is built from the wrapper module coredns/ into its own directory.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/versions.env"
cache_root="${SPYRE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spyre-model-operator/bin}"
out="$cache_root/k8s-$K8S_VERSION.etcd-$ETCD_VERSION.kwok-$KWOK_VERSION.helm-$HELM_VERSION"
mkdir -p "$out"
log() { echo "[build] $*" >&2; }

k8s_ldflags() {
  local v="$K8S_VERSION" major minor
  major="${v#v}"; major="${major%%.*}"
  minor="${v#v*.}"; minor="${minor%%.*}"
  local f=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    f+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "-s -w$f"
}

# CoreDNS (cluster DNS, controlplane.py) from the wrapper module coredns/, which imports only
# the plugins its Corefile uses (no `forward`); its own cache directory, so pinning another
# version does not rebuild the rest. Cold: ~2 min on 2 cores (126 s, empty Go build cache).
coredns_out="$cache_root/coredns-$COREDNS_VERSION"
if [ ! -x "$coredns_out/coredns" ]; then
  grep -q "github.com/coredns/coredns $COREDNS_VERSION\$" "$here/coredns/go.mod" || {
    log "versions.env pins CoreDNS $COREDNS_VERSION but coredns/go.mod does not (go get it there)"
    exit 1
  }
  log "building coredns $COREDNS_VERSION into $coredns_out (cold: ~2-5 min on 2 cores)"
  t0=$(date +%s)
  mkdir -p "$coredns_out"
  (cd "$here/coredns" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" \
     go build -trimpath -ldflags "-s -w" -o "$coredns_out/coredns.tmp" .)
  mv "$coredns_out/coredns.tmp" "$coredns_out/coredns"
  log "built coredns in $(( $(date +%s) - t0 ))s"
fi

need=()
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy kwok helm; do
  [ -x "$out/$b" ] || need+=("$b")
done
if [ ${#need[@]} -eq 0 ]; then
  echo "$out"; exit 0
fi
log "building ${need[*]} into $out (cold build: ~20-26 min on 2 cores)"
start=$(date +%s)
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false -mod=mod"
for b in "${need[@]}"; do
  case "$b" in
    etcd)
      (cd "$here/gobuild" && go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3) ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet|kube-proxy)
      (cd "$here/gobuild" && go build -trimpath -ldflags "$(k8s_ldflags)" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b") ;;
    kwok)
      GOBIN="$out/.gobin-kwok" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
      mv "$out/.gobin-kwok/kwok" "$out/kwok.tmp"; rmdir "$out/.gobin-kwok" ;;
    helm)
      GOBIN="$out/.gobin-helm" go install -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
        "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
      mv "$out/.gobin-helm/helm" "$out/helm.tmp"; rmdir "$out/.gobin-helm" ;;
  esac
  mv "$out/$b.tmp" "$out/$b"
  log "built $b ($(( $(date +%s) - start ))s so far)"
done
log "done in $(( $(date +%s) - start ))s"
echo "$out"
