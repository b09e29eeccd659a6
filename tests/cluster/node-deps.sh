#!/usr/bin/env bash
# Install the Debian packages the real node needs (idempotent; silent when all are present):
# containerd + runc (container runtime), containernetworking-plugins (bridge, host-local,
# loopback, portmap), iptables + conntrack (kube-proxy), busybox-static (the node's pause
# image and the test image are built from it, see ociimage.py); and strace, with which a unit
# test counts the signals .ci/run sends at its budget.
set -euo pipefail
pkgs=(containerd runc containernetworking-plugins iptables conntrack busybox-static strace)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "[node-deps] the real node needs: ${missing[*]} (apt-get install as root); skipping" >&2
  exit 0
fi
echo "[node-deps] installing ${missing[*]}" >&2
"$(dirname "$0")/apt-install.sh" "${missing[@]}"
# Debian's containerd package enables a systemd unit; on a machine without systemd nothing
# starts. The node runs its own containerd with its own config and paths (node.py).
