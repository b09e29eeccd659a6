#!/usr/bin/env bash
# Build (or reuse) the operator and engine images; prints the docker-archive path of each
# (one per line; `--ref` for the image references, `--json` for both). Installs buildah and
# debootstrap from Debian's packages when they are missing. See tests/images/README.md.
#
#   tests/images/build.sh                 # both images
#   tests/images/build.sh engine --ref    # localhost/spyre-engine:<hash>
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "[images] installing ${need[*]}" >&2
  "$here/../cluster/apt-install.sh" "${need[@]}"
fi
if [ $# -eq 0 ]; then set -- all; fi
exec python3 "$here/build.py" "$@"
