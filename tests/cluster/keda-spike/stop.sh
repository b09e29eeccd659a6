#!/usr/bin/env bash
# stops only the processes run.sh started (by recorded pid: setsid makes each its own group)
for f in /tmp/keda-spike/pids/*; do [ -f "$f" ] || continue; p=$(cat "$f"); kill -- -"$p" 2>/dev/null && echo "stopped $(basename $f) $p"; rm -f "$f"; done
