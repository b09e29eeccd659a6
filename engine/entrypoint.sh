#!/bin/bash
set -e
senlib=/home/engine/.senlib.json
if [ -r "$senlib" ] && [ ! -e "$HOME/.senlib.json" ]; then
  if ! ln -s "$senlib" "$HOME/.senlib.json" 2>/dev/null; then
    echo "spyre-engine-entrypoint: cannot link $senlib into $HOME" >&2
  fi
fi
setup="${SPYRE_AIU_SETUP:-/etc/profile.d/ibm-aiu-setup.sh}"
if [ -r "$setup" ]; then
  rc=0
  # shellcheck disable=SC1090
  source "$setup" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "spyre-engine-entrypoint: $setup exited $rc (read-only root?); starting" >&2
  fi
fi
exec spyre-engine "$@"
