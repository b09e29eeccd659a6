#!/usr/bin/env bash
# `make demo`: the real thing, on the local cluster's real node (tests/realpods/demo.py):
#   control plane + real node -> operator and engine images built here and imported ->
#   the operator installed with the Helm chart (namespace spyre-system, watching spyre-demo) ->
#   the tiny model on a model PVC -> a SpyreModel (CPU backend `eager`) -> the precompile Job
#   compiles -> the serving pod loads the artifact from the read-only cache -> a completion
#   through the Service, the same prompt again, /metrics, and the time each step took.
#
#   operator/scripts/demo.sh [up] [--backend eager|inductor] [--scale-to-zero]   # make demo
#     (--scale-to-zero: make demo DEMO_ARGS=--scale-to-zero, with KEDA + its HTTP add-on)
#   operator/scripts/demo.sh down [--quiet]                    # make demo-down (make test too)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
cmd="${1:-up}"
[ $# -gt 0 ] && shift
case "$cmd" in
  up)
    printf '\n\033[1m==> Building (or reusing) the operator and engine images (tests/images)\033[0m\n'
    start=$SECONDS
    # Installs buildah/debootstrap from Debian's packages if missing; cached by input hash.
    tests/images/build.sh all >/dev/null
    echo "    images ready in $((SECONDS - start))s (cached: under a second)"
    exec "$PY" -m tests.realpods.demo up "$@"
    ;;
  down)
    exec "$PY" -m tests.realpods.demo down "$@"
    ;;
  *)
    echo "usage: $0 [up [--backend eager|inductor] [--scale-to-zero] | down [--quiet]]" >&2
    exit 2
    ;;
esac
