#!/usr/bin/env bash
# `make demo-kwok`: the kwok-only demo (no real pods, no images): local control plane + CRD +
# the operator as a local process + a sample SpyreModel going Compiling -> Ready, all played by
# kwok (its "compile" and "Ready" are kwok stages). `make demo` is the real one (demo.sh).
# The operator watches only $NS and holds its Lease there, so it never competes with the
# operators the tests start (they use the Lease in `default` and t-* namespaces).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
PY="$ROOT/.venv/bin/python"
KUBECTL="$ROOT/.cluster/bin/kubectl"
export KUBECONFIG="$ROOT/.cluster/kubeconfig"
NS=spyre-demo-kwok
SAMPLE=operator/samples/granite-generate.yaml
NAME=granite-3-3-8b

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "Starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
"$PY" tests/cluster/controlplane.py up >/dev/null
"$KUBECTL" version 2>/dev/null | sed 's/^/    /'
"$KUBECTL" get nodes -L ibm.com/spyre.product -L ibm.com/spyre.count | sed 's/^/    /'

say "Installing the SpyreModel CRD"
"$KUBECTL" apply --server-side --force-conflicts -f crds/serving.spyre.dev_spyremodels.yaml
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/spyremodels.serving.spyre.dev >/dev/null

say "Starting the operator (log: .cluster/logs/operator-demo.log)"
mkdir -p .cluster/logs
if [ -f .cluster/operator-demo.pid ] && kill -0 "$(cat .cluster/operator-demo.pid)" 2>/dev/null; then
  echo "    operator already running (pid $(cat .cluster/operator-demo.pid))"
else
  nohup "$PY" -m spyre_operator.cli run --namespace "$NS" --leader-election-namespace "$NS" \
    --metrics-port 18081 \
    --liveness http://127.0.0.1:18080/healthz > .cluster/logs/operator-demo.log 2>&1 &
  echo $! > .cluster/operator-demo.pid
  for _ in $(seq 1 60); do
    curl -fsS http://127.0.0.1:18080/healthz >/dev/null 2>&1 && break; sleep 0.5
  done
  echo "    operator pid $(cat .cluster/operator-demo.pid)"
fi

say "Applying $SAMPLE in namespace $NS"
"$KUBECTL" create namespace "$NS" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" label namespace "$NS" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null
"$KUBECTL" -n "$NS" apply -f "$SAMPLE"

say "Watching it compile, then serve"
deadline=$((SECONDS + 180)); last=""
while (( SECONDS < deadline )); do
  line=$("$KUBECTL" -n "$NS" get spyremodel "$NAME" --no-headers 2>/dev/null || true)
  if [ "$line" != "$last" ]; then echo "    $line"; last="$line"; fi
  ready=$("$KUBECTL" -n "$NS" get spyremodel "$NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}' 2>/dev/null || true)
  [ "$ready" = "Serving" ] && break
  sleep 1
done
"$KUBECTL" -n "$NS" wait --for=condition=Ready --timeout=30s "spyremodel/$NAME"

say "kubectl get spyremodels -o wide"
"$KUBECTL" -n "$NS" get spyremodels -o wide
say "Conditions"
"$KUBECTL" -n "$NS" get spyremodel "$NAME" \
  -o jsonpath='{range .status.conditions[*]}{.type}{"\t"}{.status}{"\t"}{.reason}{"\t"}{.message}{"\n"}{end}' \
  | column -t -s $'\t' | sed 's/^/    /'
say "What the operator created"
"$KUBECTL" -n "$NS" get pvc,jobs,deployments,services,pdb,pods -o wide
say "Events"
"$KUBECTL" -n "$NS" get events --field-selector involvedObject.kind=SpyreModel \
  --sort-by=.lastTimestamp | tail -n 10

cat <<EOT

Look around:
  export KUBECONFIG=$KUBECONFIG PATH=$ROOT/.cluster/bin:\$PATH
  kubectl -n $NS get spyremodels -o wide
  kubectl -n $NS describe spyremodel $NAME
  kubectl -n $NS edit spyremodel $NAME      # change compile.maxModelLen: a new artifact
                                             # compiles while the old pods keep serving
  tail -f .cluster/logs/operator-demo.log
Stop:
  make demo-down           # stops the operator started here (make test does it too)
  make cluster-down        # or stop the whole cluster
EOT
