#!/usr/bin/env bash
# stand-in for the SpyreModel operator: FakeModel.spec.replicas -> Deployment web; Deployment ready -> FakeModel.status.replicas
export KUBECONFIG=/work/main/.cluster/kubeconfig
while true; do
  want=$(kubectl -n keda-spike get fakemodel fm -o jsonpath='{.spec.replicas}' 2>/dev/null); want=${want:-0}
  have=$(kubectl -n keda-spike get deploy web -o jsonpath='{.spec.replicas}')
  [ "$want" != "$have" ] && { echo "$(date +%T.%N) mirror: web replicas $have -> $want"; kubectl -n keda-spike scale deploy web --replicas="$want" >/dev/null; }
  ready=$(kubectl -n keda-spike get deploy web -o jsonpath='{.status.readyReplicas}'); ready=${ready:-0}
  kubectl -n keda-spike patch fakemodel fm --subresource=status --type=merge -p "{\"status\":{\"replicas\":$ready,\"selector\":\"app=web\"}}" >/dev/null
  sleep 1
done
