#!/usr/bin/env bash
# Item 4 of the spike: KEDA operator + HTTP add-on (operator, scaler, interceptor) as plain processes
# against the local cluster, in namespace keda-spike. Each in a private mount namespace whose
# /etc/hosts (bind mount of /tmp/keda-spike/hosts) resolves the two in-cluster names they dial.
set -euo pipefail
B=${B:-/root/.cache/spyre-model-operator/bin/keda-v2.21.0-http-v0.12.0}
S=/tmp/keda-spike
export KUBECONFIG=/work/main/.cluster/kubeconfig
mkdir -p $S/logs $S/pids
spawn() {
  local name=$1; shift
  setsid unshare -m --propagation private sh -c 'mount --bind /tmp/keda-spike/hosts /etc/hosts && exec "$@"' sh "$@" \
    > $S/logs/$name.log 2>&1 < /dev/null &
  echo $! > $S/pids/$name
  echo "$name pid $!"
}
spawn keda env WATCH_NAMESPACE=keda-spike KEDA_CLUSTER_OBJECT_NAMESPACE=keda-spike POD_NAMESPACE=keda-spike \
  nice -n 10 $B/keda --metrics-bind-address=127.0.0.1:19080 --health-probe-bind-address=127.0.0.1:19081 \
  --metrics-service-bind-address=127.0.0.1:19666 --cert-dir=$S/certs --enable-cert-rotation=false --zap-log-level=info
spawn http-operator env KEDAHTTP_OPERATOR_EXTERNAL_SCALER_SERVICE=keda-http-scaler KEDAHTTP_OPERATOR_EXTERNAL_SCALER_PORT=19090 \
  KEDA_HTTP_OPERATOR_NAMESPACE=keda-spike KEDA_HTTP_OPERATOR_WATCH_NAMESPACE=keda-spike \
  nice -n 10 $B/http-operator --metrics-bind-address=127.0.0.1:19180 --health-probe-bind-address=127.0.0.1:19181
spawn http-scaler env KEDA_HTTP_SCALER_PORT=19090 KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE=keda-spike \
  KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE=keda-http-interceptor-admin KEDA_HTTP_SCALER_TARGET_ADMIN_DEPLOYMENT=keda-http-interceptor-admin \
  KEDA_HTTP_SCALER_TARGET_ADMIN_PORT=19092 nice -n 10 $B/http-scaler
spawn http-interceptor env KEDA_HTTP_CURRENT_NAMESPACE=keda-spike KEDA_HTTP_WATCH_NAMESPACE=keda-spike \
  KEDA_HTTP_PROXY_PORT=19091 KEDA_HTTP_ADMIN_PORT=19092 OTEL_PROM_EXPORTER_PORT=19223 KEDA_CONDITION_WAIT_TIMEOUT=60s \
  nice -n 10 $B/http-interceptor
