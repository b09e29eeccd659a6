#!/usr/bin/env bash
# apt-get install Debian packages for the set-up scripts (node-deps.sh, metrics-deps.sh,
# tests/images/build.sh), one install at a time: `make deps` runs two set-up chains side by
# side, and a second apt-get beside the first fails on dpkg's lock. The install is tried from
# the package lists on hand first, then after one `apt-get update`. Root only; quiet unless it
# fails.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 PACKAGE..." >&2; exit 2; }
export DEBIAN_FRONTEND=noninteractive
# Our own lock serialises our installs (apt's lists lock has no wait); DPkg::Lock::Timeout
# waits for any other apt user of the machine.
exec 9>"${TMPDIR:-/tmp}/spyre-model-operator-apt.lock"
flock 9
apt=(apt-get -o DPkg::Lock::Timeout=600 -y -q)
"${apt[@]}" install --no-install-recommends "$@" >/dev/null 2>&1 || {
  "${apt[@]}" update >/dev/null
  "${apt[@]}" install --no-install-recommends "$@" >/dev/null
}
