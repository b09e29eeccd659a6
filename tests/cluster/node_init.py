#!/usr/bin/env python3
"""PID 1 of the real node: ``node_init.py <node.json>``, run by ``tests/cluster/node.py`` as

    unshare --pid --fork --kill-child --mount-proc --mount --net --uts -- python3 node_init.py

so containerd (with its shims and every container), the kubelet and kube-proxy live in
namespaces that die with this process:

* a pid namespace: when this process dies (or ``unshare`` is killed) the kernel kills every
  process of the node, containers included;
* a private mount namespace: tmpfs on ``/run`` (containerd state, runc, shim sockets, pod
  network namespaces), ``/var/log`` (pod logs) and ``/var/lib`` (CNI state); a resolv.conf
  that points nowhere bind-mounted on ``/etc/resolv.conf``; the kubelet's directory on
  ``/var/lib/kubelet``. Every mount the node makes (overlay rootfs, secret tmpfs, netns bind
  mounts) exists only here and disappears with it;
* a network namespace: the node's only link is a veth pair to the host (set up from the
  host), the pod bridge lives here, and so do kube-proxy's and the CNI plugins' iptables
  rules and the ``ip_forward`` the bridge plugin turns on. There is no default route, so
  nothing the node or its pods do can leave the machine (image pulls and DNS fail at once).

Standard library only; the configuration is the JSON file written by ``node.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

cfg: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
children: dict[int, str] = {}
stopping = False


def log(msg: str) -> None:
    print(f"[node-init] {time.strftime('%H:%M:%S')} {msg}", flush=True)


def run(*args: str) -> None:
    subprocess.run(list(args), check=True)


def start(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    logf = open(Path(cfg["log_dir"]) / f"node-{name}.log", "ab")  # noqa: SIM115
    logf.write(f"\n==== {time.strftime('%H:%M:%S')} starting {name}\n".encode())
    logf.flush()
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": cfg["node_dir"]}
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                         env=env, cwd=cfg["node_dir"])
    logf.close()
    children[p.pid] = name
    log(f"started {name} (pid {p.pid} in the node's pid namespace)")
    return p


def shutdown(code: int) -> None:
    global stopping
    stopping = True
    for name in ("kube-proxy", "kubelet", "containerd"):
        for pid, n in list(children.items()):
            if n == name:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            children.pop(pid, None)
        else:
            time.sleep(0.05)
    log(f"exiting with {code}; the kernel kills what is left in the namespace")
    sys.exit(code)


def on_term(signum: int, frame: object) -> None:
    log(f"signal {signum}: stopping the node")
    shutdown(0)


def main() -> None:
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    # Join the node's cgroup in every hierarchy: all our processes (shims too) stay under it,
    # and the kubelet's pods go below it (cgroupRoot), so `down` can find and kill them all.
    for d in cfg["cgroup_dirs"]:
        Path(d, "cgroup.procs").write_text("0")
    run("hostname", cfg["node_name"])
    run("mount", "--make-rprivate", "/")
    run("mount", "-t", "tmpfs", "-o", "mode=755,size=1g", "spyre-node-run", "/run")
    run("mount", "-t", "tmpfs", "-o", "mode=755,size=4g", "spyre-node-log", "/var/log")
    # /var/lib: CNI's cache and IPAM state (/var/lib/cni), and /var/lib/kubelet (the kubelet
    # uses /var/lib/kubelet/device-plugins whatever its --root-dir says): no mount point on
    # the host is needed, nothing the node's programs need lives there.
    run("mount", "-t", "tmpfs", "-o", "mode=755,size=64m", "spyre-node-varlib", "/var/lib")
    for d in ("/var/lib/cni", "/var/lib/kubelet"):
        os.makedirs(d)
    run("mount", "--bind", cfg["kubelet_dir"], "/var/lib/kubelet")
    run("mount", "--bind", cfg["resolv_conf"], "/etc/resolv.conf")
    run("ip", "link", "set", "lo", "up")
    # The host moves one end of a veth pair in here and configures it.
    deadline = time.monotonic() + 30
    while True:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", cfg["node_if"]],
                             capture_output=True, text=True).stdout
        if f" {cfg['node_ip']}/" in out:
            break
        if time.monotonic() > deadline:
            log(f"the host did not configure {cfg['node_if']} in 30 s")
            sys.exit(1)
        time.sleep(0.05)
    log(f"network ready: {cfg['node_if']} {cfg['node_ip']}")

    start("containerd", cfg["commands"]["containerd"])
    sock = cfg["containerd_socket"]
    deadline = time.monotonic() + 60
    ctr = ["ctr", "--address", sock, "--namespace", "k8s.io"]
    while subprocess.run([*ctr, "version"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            log("containerd did not answer in 60 s")
            shutdown(1)
        time.sleep(0.1)
    # Containers of a previous run of the node are dead (their pid namespace died with it);
    # remove their records so the kubelet starts from a clean runtime.
    stale = subprocess.run([*ctr, "containers", "list", "-q"], capture_output=True,
                           text=True).stdout.split()
    if stale:
        subprocess.run([*ctr, "containers", "delete", *stale], capture_output=True)
        log(f"removed {len(stale)} stale container records")
    Path(cfg["node_dir"], "containerd.ready").write_text("ok\n")
    start("kubelet", cfg["commands"]["kubelet"])
    start("kube-proxy", cfg["commands"]["kube-proxy"])

    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            time.sleep(0.5)
            continue
        name = children.pop(pid, None)
        if name and not stopping:
            log(f"{name} exited ({status}); stopping the node")
            shutdown(1)


if __name__ == "__main__":
    main()
