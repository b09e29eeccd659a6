"""A real node in the local cluster: containerd + runc + CNI, kubelet and kube-proxy.

It joins the control plane of :mod:`tests.cluster.controlplane` beside the kwok nodes and
runs real pods. Everything the node does stays on this machine and is undone by ``down``:

* The node lives in its own pid, mount, network and UTS namespaces (``node_init.py`` is
  their PID 1). Killing it kills every process of the node, containers included, and frees
  every mount, every pod network namespace, the pod bridge and all iptables rules (they
  exist only inside the node's network namespace).
* The host and the node are joined by a veth pair: ``spyre-h<slot>`` 10.250.<slot>.1/30 on
  the host, ``spyre-n<slot>`` 10.250.<slot>.2/30 (the node's InternalIP) inside; the slot
  (1..250) comes from the checkout's path, so two checkouts' nodes can run side by side.
  Pods get 10.245.<slot>.0/24 on the bridge ``spyre-cni0`` with routes to the Service range
  and the link only: no default route anywhere in the node, so nothing routes off the
  machine.
* The API server keeps listening on 127.0.0.1; ``tcpforward.py`` relays 10.250.<slot>.1:<port>
  (the address the API server advertises for the ``kubernetes`` Service) to it, and
  CoreDNS's port likewise (TCP and UDP): the ``kube-dns`` Service (10.96.0.10) the kubelet
  gives pods as their nameserver routes there. CoreDNS answers only for the cluster domain.
* The kubelet's pods go under the cgroup ``/spyre-node-<slot>`` (``cgroupRoot``); the node's
  own processes join it too. ``down`` kills what is left in it and removes it.
* The kubelet sets six kernel sysctls at start (vm.overcommit_memory, kernel.panic, ...);
  their values from before ``up`` are saved and restored by ``down``.

Spyre cards: ``ibm.com/spyre_vf`` and ``ibm.com/spyre_pf`` (8 each by default) are
advertised by a PATCH of the node's status, the documented way for extended resources
without a device plugin; the node carries the kwok Spyre nodes' labels plus
``spyre.dev/real-node=true`` and the taint ``spyre.dev/real-node=true:NoSchedule`` (pods
meant for it select and tolerate it; the kwok-based tests' pods never land there).

Library::

    node = RealNode(ControlPlane()); node.up(); node.import_image("op.tar"); node.down()

CLI: ``controlplane.py node-up | node-down | node-status | import-image <tar> [--name N] |
prime-images`` (the last: the operator, engine and base images into the node's containerd, the
node running or not; ``make deps`` runs it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.cluster import ociimage

GIB = 1 << 30

if TYPE_CHECKING:
    from tests.cluster.controlplane import ControlPlane

HERE = Path(__file__).resolve().parent

NODE_NAME = "spyre-real-0"
NODE_LABEL = "spyre.dev/real-node"  # value "true"; also the taint key (NoSchedule)
NODE_TAINT = {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}
NODE_TOLERATION = {"key": NODE_LABEL, "operator": "Equal", "value": "true",
                   "effect": "NoSchedule"}
NODE_SELECTOR = {NODE_LABEL: "true"}
SPYRE_CARDS = 8
BRIDGE = "spyre-cni0"  # inside the node's network namespace only
CGROUP_PREFIX = "spyre-node-"  # + slot; the machine-wide names and addresses carry the slot
CGROUP_ROOT = Path("/sys/fs/cgroup")
CNI_BIN_DIR = "/usr/lib/cni"
NODE_BINARIES = ("kubelet", "kube-proxy")
NODE_COMMANDS = ("containerd", "runc", "ctr", "unshare", "nsenter", "ip", "iptables",
                 "conntrack", "openssl", "busybox", "go")
# Global (not per network namespace) sysctls the node could change; the kubelet sets the
# first six. Saved before `up`, restored and compared by `down`.
HOST_SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
    "net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait", "fs/inotify/max_user_instances",
    "fs/inotify/max_user_watches",
)
IPTABLES_SAVE = ("iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save",
                 "ip6tables-legacy-save")
# Paths the kubelet/containerd/CNI would use on the host whatever their configuration says;
# inside the node they are tmpfs or bind mounts (node_init.py). `down` checks none appeared.
HOST_PATHS = ("/var/lib/cni", "/var/lib/kubelet", "/run/containerd", "/var/log/containers",
              "/var/log/pods", "/opt/containerd", "/var/lib/containerd", "/etc/cni/net.d",
              "/usr/libexec/kubernetes", "/run/netns")
NODE_UP_TIMEOUT = float(os.environ.get("SPYRE_NODE_UP_TIMEOUT", "120"))


class NodeError(RuntimeError):
    """The real node could not be started or stopped cleanly."""


def _log(msg: str) -> None:
    print(f"[node] {msg}", file=sys.stderr, flush=True)


def _run(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def forwarders_of(host_ip: str) -> list[int]:
    """Every live tcpforward.py relaying from ``host_ip`` (a node slot's host end), whether or
    not a pid file names it: a checkout removed before its `down` leaves its forwarder behind
    with no pid file, and the next node of the slot would count it as its own leak."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            argv = (d / "cmdline").read_bytes().split(b"\0")
            ours = f"{host_ip}:".encode()
            if any(a.endswith(b"tcpforward.py") for a in argv) and _pid_alive(int(d.name)) \
                    and any(a.removeprefix(b"udp:").startswith(ours) for a in argv):
                out.append(int(d.name))
    return sorted(out)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------- host inspection
def cgroup_hierarchies() -> list[Path]:
    """Mount points of the cgroup hierarchies (v1 controllers, name=systemd, unified)."""
    out = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        mp = Path(left.split()[4])
        if fstype in ("cgroup", "cgroup2") and (mp == CGROUP_ROOT or mp.parent == CGROUP_ROOT):
            out.add(mp)
    return sorted(out)


def node_cgroup_dirs(name: str) -> list[Path]:
    return [h / name for h in cgroup_hierarchies()]


def _cgroup_pids(name: str) -> set[int]:
    pids: set[int] = set()
    for top in node_cgroup_dirs(name):
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in os.walk(top):
            with contextlib.suppress(OSError):
                pids |= {int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()}
    return pids


def _read_sysctl(key: str) -> str | None:
    try:
        return Path("/proc/sys", key).read_text().strip()
    except OSError:
        return None


def _links() -> list[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    return sorted(
        line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line
    )


def _iptables() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for tool in IPTABLES_SAVE:
        if not shutil.which(tool):
            continue
        res = _run(tool, check=False)
        lines = [re.sub(r"\[\d+:\d+\]", "", ln).strip() for ln in res.stdout.splitlines()
                 if ln and not ln.startswith("#")]
        out[tool] = lines
    return out


def _mounts() -> list[str]:
    """The host's mounts as "mountpoint source"."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        src = right.split()[1] if len(right.split()) > 1 else ""
        out.append(f"{left.split()[4]} {src}")
    return sorted(out)


def _node_dir_of(pids: set[int]) -> str | None:
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                m = re.match(rb"(/.*?/\.cluster/node)(/|$)", arg)
                if m:
                    return m.group(1).decode()
    return None


def running_nodes() -> dict[str, str]:
    """{cgroup name: node directory} of every real node running on this machine."""
    out: dict[str, str] = {}
    for h in cgroup_hierarchies()[:1]:
        for d in h.glob(CGROUP_PREFIX + "*"):
            owner = _node_dir_of(_cgroup_pids(d.name))
            if owner:
                out[d.name] = owner
    return out


def host_snapshot(cgroup_name: str = "") -> dict[str, Any]:
    """What `down` must leave as it was: sysctls, links, mounts, netns, iptables, cgroups."""
    netns_dir = Path("/run/netns")
    return {
        "sysctls": {k: _read_sysctl(k) for k in HOST_SYSCTLS},
        "links": _links(),
        "mounts": _mounts(),
        "netns": sorted(os.listdir(netns_dir)) if netns_dir.is_dir() else [],
        "iptables": _iptables(),
        "cgroups": [str(d) for d in node_cgroup_dirs(cgroup_name) if d.exists()]
        if cgroup_name else [],
        "paths": {p: os.path.exists(p) for p in HOST_PATHS},
    }


# ---------------------------------------------------------------------- the node
class RealNode:
    """The real node of the control plane ``cp``. Its machine-wide names and addresses carry
    a slot (1..250) derived from the checkout's path, so checkouts do not collide."""

    def __init__(self, cp: ControlPlane, name: str = NODE_NAME, cards: int = SPYRE_CARDS):
        from tests.cluster.controlplane import node_host_ip, node_slot

        self.cp = cp
        self.name = name
        self.cards = cards
        self.slot = slot = node_slot(cp.state_dir)
        self.host_if, self.node_if = f"spyre-h{slot}", f"spyre-n{slot}"
        self.host_ip, self.node_ip = node_host_ip(cp.state_dir), f"10.250.{slot}.2"
        self.link_cidr = f"10.250.{slot}.0/30"
        self.pod_cidr, self.bridge_ip = f"10.245.{slot}.0/24", f"10.245.{slot}.1"
        self.cgroup_name = f"{CGROUP_PREFIX}{slot}"
        self.dir = cp.state_dir / "node"
        self.pki = self.dir / "pki"
        self.conf = self.dir / "config"
        self.kubelet_dir = self.dir / "kubelet"
        self.containerd_root = self.dir / "containerd"
        self.socket = self.dir / "containerd.sock"
        self.pid_file = cp.pids / "node.pid"
        self.forward_pid_file = cp.pids / "node-apiforward.pid"
        self.baseline_file = self.dir / "host-baseline.json"
        self.image_cache = self._image_cache()
        #: while :meth:`prime_images` runs: the socket of its own containerd (the node is down)
        self._standalone: Path | None = None

    @staticmethod
    def _image_cache() -> Path:
        root = os.environ.get("SPYRE_BIN_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
            "spyre-model-operator", "bin")  # fmt: skip
        return Path(root).parent / "images"

    # ------------------------------------------------------------------ checks
    def check_prerequisites(self, binaries: bool = True) -> None:
        """Raise NodeError saying what is missing. ``binaries=False``: what importing images
        needs (its containerd), not the Kubernetes binaries (built beside it by ``make deps``)."""
        problems = []
        if os.geteuid() != 0:
            problems.append("the real node needs root (namespaces, cgroups, veth)")
        missing = [b for b in NODE_BINARIES
                   if binaries and not os.access(self.cp.bin_dir / b, os.X_OK)]
        if missing:
            problems.append(
                f"{', '.join(missing)} missing in {self.cp.bin_dir}: run `make binaries`"
            )
        cmds = [c for c in NODE_COMMANDS if not shutil.which(c)]
        cni = [p for p in ("bridge", "host-local", "loopback", "portmap")
               if not os.access(f"{CNI_BIN_DIR}/{p}", os.X_OK)]
        if cmds or cni:
            problems.append(f"missing {', '.join(cmds + cni)}: run tests/cluster/node-deps.sh "
                            "(part of `make binaries`)")
        if problems:
            raise NodeError("; ".join(problems))

    # ------------------------------------------------------------------ state
    def pid(self) -> int | None:
        """Host pid of the node's ``unshare`` process, if it is running."""
        pid = _read_pid(self.pid_file)
        if pid and _pid_alive(pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                return None
            if any(str(self.dir).encode() in a for a in argv):
                return pid
        return None

    def forward_pid(self) -> int | None:
        pid = _read_pid(self.forward_pid_file)
        if pid and _pid_alive(pid):
            with contextlib.suppress(OSError):
                if b"tcpforward.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
        return None

    def owner(self) -> str | None:
        """The node directory (``<checkout>/.cluster/node``) of whoever runs a node in this
        node's slot (cgroup) now; None if none runs. Normally this checkout; another one
        only if two checkout paths hash to the same slot."""
        return _node_dir_of(_cgroup_pids(self.cgroup_name))

    def other_nodes(self) -> dict[str, str]:
        """Real nodes of other checkouts running on this machine."""
        return {k: v for k, v in running_nodes().items() if v != str(self.dir)}

    def _check_not_foreign(self) -> None:
        owner = self.owner()
        if owner and owner != str(self.dir):
            root = Path(owner).parent.parent
            raise NodeError(
                f"checkout {root} runs a real node in the same slot ({self.slot}, from the "
                f"paths' hash); stop it there (`python tests/cluster/controlplane.py node-down "
                f"--root {root}`) or use another checkout path"
            )

    def running(self) -> bool:
        return self.pid() is not None and self.forward_pid() is not None

    def node_object(self) -> dict[str, Any] | None:
        res = self.cp.kubectl("get", "node", self.name, "-o", "json", check=False)
        return json.loads(res.stdout) if res.returncode == 0 else None

    def ready(self) -> bool:
        n = self.node_object()
        if not n:
            return False
        conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
        return conds.get("Ready") == "True"

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid(), "forwarder": self.forward_pid(),
                "ready": self.cp.apiserver_ready() and self.ready(),
                "containerd_socket": str(self.socket)}

    # ------------------------------------------------------------------ up
    def up(self, timeout: float = NODE_UP_TIMEOUT) -> RealNode:
        """Start the node (or keep the running one) and wait until it is Ready with its
        Spyre cards advertised. The control plane must be up."""
        self.check_prerequisites()
        with self.cp._lock():
            self._up(timeout)
        return self

    def _up(self, timeout: float) -> None:
        if not self.cp.apiserver_ready():
            raise NodeError("the control plane is not running; start it first (`up`)")
        self._check_not_foreign()
        self._ensure_apiserver_flags()
        if not self.cp.pid("coredns"):  # a control plane started before cluster DNS existed
            self.cp._ensure_ports()
            self.cp.start_component("coredns")
            self.cp._apply_dns_service()
        if not self.cp.pid("registry"):  # ... or before the registry
            self.cp._ensure_ports()
            self.cp.start_component("registry")
        if self.running() and self.ready() and self._config_current():
            self._advertise_cards()
            return
        if self.running() and not self._config_current():
            _log("the running node's configuration is out of date; restarting it")
            self._down(delete_node=False)
        if self.pid() or self.forward_pid() or _cgroup_pids(self.cgroup_name) or \
                self.host_if in _links():
            _log("a previous node is partly running; stopping it first")
            self._down(delete_node=False)
        t0 = time.monotonic()
        if not self.baseline_file.exists():
            # Empty cgroups of this slot (no process in them: checked above) can only be a dead
            # node's: a `down` that could not remove them in time, a checkout deleted without
            # one. They are not the host's state: a baseline with them made `down` look like
            # it changed the host (a warm run in a path used before, 2026-11-28).
            self._remove_cgroups(self.cgroup_name)
            self.dir.mkdir(parents=True, exist_ok=True)
            snap = host_snapshot(self.cgroup_name)
            # The kubelet's sysctls are global: if another checkout's node runs, the values
            # from before *its* start are the ones to come back to.
            for other in self.other_nodes().values():
                with contextlib.suppress(OSError, ValueError, KeyError):
                    snap["sysctls"] = json.loads(
                        (Path(other) / "host-baseline.json").read_text())["sysctls"]
                    break
            self.baseline_file.write_text(json.dumps(snap, indent=1))
        try:
            self._write_files()
            self._make_cgroups()
            self.cp.ensure_pv_dirs()
            pid = self._start_namespaces()
            self._setup_network(pid)
            self._start_forwarder()
            self._wait_containerd(timeout)
            t_rt = time.monotonic() - t0
            self.ensure_base_images()
            wait = self._waiter(t0, timeout)
            wait(lambda: self.node_object() is not None, "the node to register")
            self._advertise_cards()
            wait(self.ready, "the node to be Ready")
            wait(self._cards_allocatable, "the Spyre cards to be allocatable")
        except BaseException:
            _log(f"node start-up failed; logs: {self.cp.logs}/node-*.log")
            self._dump_logs()
            self._down(delete_node=False)
            raise
        _log(f"node {self.name} Ready in {time.monotonic() - t0:.1f}s "
             f"(containerd after {t_rt:.1f}s)")

    def _config_current(self) -> bool:
        """The running node has this code's kubelet configuration and forwards what it
        should (e.g. a node started before cluster DNS existed has neither)."""
        try:
            kubelet = (self.conf / "kubelet.yaml").read_text()
            raw = Path(f"/proc/{self.forward_pid()}/cmdline").read_bytes()
            argv = [a for a in raw.split(b"\0") if a]
        except OSError:
            return False
        want = [a.encode() for a in self._forwards()]
        return kubelet == self._kubelet_yaml() and argv[-len(want):] == want

    def _waiter(self, t0: float, timeout: float):  # type: ignore[no-untyped-def]
        from tests.cluster.controlplane import wait_until

        def wait(pred, what):  # type: ignore[no-untyped-def]
            def ok() -> bool:
                if not self.pid():
                    raise NodeError(f"the node died; see {self.cp.logs}/node-*.log")
                return bool(pred())

            wait_until(ok, max(timeout - (time.monotonic() - t0), 5), what, 0.25)

        return wait

    def _dump_logs(self, lines: int = 12) -> None:
        for c in ("init", "containerd", "kubelet", "kube-proxy", "apiforward"):
            f = self.cp.logs / f"node-{c}.log"
            if f.exists():
                tail = f.read_text(errors="replace").splitlines()[-lines:]
                _log(f"--- {f}\n" + "\n".join(tail))

    def _ensure_apiserver_flags(self) -> None:
        """A cluster started by older code lacks the flags the node needs: restart the API
        server in place (same port, certificates and data) with the current command line."""
        pid = self.cp.pid("kube-apiserver")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode() if pid else ""
        if "--kubelet-preferred-address-types=InternalIP" in argv and \
                f"--advertise-address={self.host_ip}" in argv:
            return
        _log("restarting kube-apiserver with the flags the real node needs")
        self.cp._ensure_pki()
        self.cp.restart(("kube-apiserver",))
        st = self.cp.state
        st["commands"] = self.cp._commands(st["ports"])
        self.cp.state_file.write_text(json.dumps(st, indent=2))

    # ------------------------------------------------------------------ files
    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.pki)

    def _cert(self, name: str, subj: str, client: bool, san: str = "") -> None:
        ca, cakey = self.cp.pki / "ca.crt", self.cp.pki / "ca.key"
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key")
        self._openssl("req", "-new", "-key", f"{name}.key", "-subj", subj, "-out", f"{name}.csr")
        ext = ["keyUsage=critical,digitalSignature,keyEncipherment",
               f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}",
               "basicConstraints=CA:FALSE"] + ([f"subjectAltName={san}"] if san else [])
        (self.pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
        self._openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(ca), "-CAkey", str(cakey),
                      "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", f"{name}.ext",
                      "-out", f"{name}.crt")

    def _kubeconfig(self, path: Path, user: str, cert: str) -> None:
        import base64

        ca = base64.b64encode((self.cp.pki / "ca.crt").read_bytes()).decode()
        port = self.cp.state["ports"]["apiserver"]
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: spyre-local
  cluster:
    server: https://{self.host_ip}:{port}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate: {self.pki / (cert + '.crt')}
    client-key: {self.pki / (cert + '.key')}
contexts:
- name: default
  context: {{cluster: spyre-local, user: {user}}}
current-context: default
""")
        path.chmod(0o600)

    def _write_files(self) -> None:
        for d in (self.dir, self.pki, self.conf, self.conf / "net.d", self.kubelet_dir,
                  self.containerd_root, self.dir / "volume-plugins", self.cp.logs):
            d.mkdir(parents=True, exist_ok=True)
        for stale in (self.socket, self.dir / "containerd.ready"):
            stale.unlink(missing_ok=True)
        # Fresh certificates every start (the CA may have changed); EC keys are instant.
        self._cert("kubelet-client", f"/O=system:nodes/CN=system:node:{self.name}", client=True)
        self._cert("kubelet-serving", f"/CN={self.name}", client=False,
                   san=f"IP:{self.node_ip},DNS:{self.name}")
        self._cert("kube-proxy", "/CN=system:kube-proxy", client=True)
        for f in self.pki.iterdir():
            f.chmod(0o600)
        self._kubeconfig(self.conf / "kubelet.kubeconfig", f"system:node:{self.name}",
                         "kubelet-client")
        self._kubeconfig(self.conf / "kube-proxy.kubeconfig", "system:kube-proxy", "kube-proxy")
        # The node's resolv.conf (its own processes, pods with dnsPolicy Default): a nameserver
        # in the caller's own network namespace where nothing listens, so lookups fail at once
        # and no query ever leaves the machine. Other pods get cluster DNS (clusterDNS).
        (self.conf / "resolv.conf").write_text(
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
        )
        images = ociimage.busybox_images(self.image_cache)
        pause = next(n for n in images if "/pause:" in n)
        (self.conf / "containerd.toml").write_text(self._containerd_toml(pause))
        self._write_registry_hosts()
        (self.conf / "net.d" / "10-spyre.conflist").write_text(json.dumps(self._cni(), indent=1))
        (self.conf / "kubelet.yaml").write_text(self._kubelet_yaml())
        (self.conf / "kube-proxy.yaml").write_text(self._kube_proxy_yaml())
        node_cfg = {
            "node_name": self.name,
            "node_dir": str(self.dir),
            "log_dir": str(self.cp.logs),
            "node_if": self.node_if,
            "node_ip": self.node_ip,
            "resolv_conf": str(self.conf / "resolv.conf"),
            "kubelet_dir": str(self.kubelet_dir),
            "containerd_socket": str(self.socket),
            "cgroup_dirs": [str(d / "system") for d in node_cgroup_dirs(self.cgroup_name)],
            "commands": self._commands(),
        }
        (self.dir / "node.json").write_text(json.dumps(node_cfg, indent=1))

    def _containerd_toml(self, pause: str) -> str:
        d = self.dir
        return f"""# Generated by tests/cluster/node.py. Runs inside the node's namespaces
# (/run is a tmpfs there).
version = 2
root = "{self.containerd_root}"
state = "/run/containerd"
oom_score = 0

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{self.socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'opt'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # This machine does not let processes lower their oom_score_adj; without this every
  # sandbox fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{self.registry_hosts_dir}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.conf / 'net.d'}"
    max_conf_num = 1
"""

    @property
    def registry_hosts_dir(self) -> Path:
        """containerd's registry host configuration (``certs.d``-style: one directory per
        registry name, each with a ``hosts.toml``)."""
        return self.conf / "registries"

    def _write_registry_hosts(self) -> None:
        """The cluster's registry, named ``127.0.0.1:<port>`` in image references (where
        `make release` pushed), is reached from the node at the host end of its link (the
        forwarder relays it to loopback), over plain HTTP: what a site does for a registry
        mirror. Nothing else is configured, so no other registry resolves."""
        reg = self.cp.registry
        port = reg.rsplit(":", 1)[1]
        shutil.rmtree(self.registry_hosts_dir, ignore_errors=True)  # an earlier port
        d = self.registry_hosts_dir / reg
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(
            f'# Generated by tests/cluster/node.py.\nserver = "http://{reg}"\n\n'
            f'[host."http://{self.host_ip}:{port}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )

    def _cni(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "spyre",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr, "gateway": self.bridge_ip}]],
                        # No default route: pods reach the pod network, the Service range
                        # and the node's link, nothing else.
                        "routes": [{"dst": self.cp_service_cidr()}, {"dst": self.link_cidr}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    @staticmethod
    def cp_service_cidr() -> str:
        from tests.cluster.controlplane import SERVICE_CIDR

        return SERVICE_CIDR

    def _kubelet_yaml(self) -> str:
        from tests.cluster.controlplane import CLUSTER_DOMAIN, DNS_SERVICE_IP

        return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The host is cgroup v1 (hybrid) and stays so; the kubelet 1.36 refuses v1 unless told.
failCgroupV1: false
# containerd 1.6 cannot report its cgroup driver over CRI; the kubelet falls back to this.
cgroupDriver: cgroupfs
cgroupRoot: /{self.cgroup_name}
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://{self.socket}
imageServiceEndpoint: unix://{self.socket}
address: {self.node_ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: {self.pki / 'kubelet-serving.crt'}
tlsPrivateKeyFile: {self.pki / 'kubelet-serving.key'}
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {self.cp.pki / 'ca.crt'}}}
authorization:
  mode: Webhook
registerNode: true
registerWithTaints:
- {{key: {NODE_TAINT['key']}, value: "{NODE_TAINT['value']}", effect: {NODE_TAINT['effect']}}}
# Cluster DNS: the kube-dns Service (CoreDNS, controlplane.py), which answers only for the
# cluster domain. The node's own resolv.conf (dnsPolicy Default) points nowhere.
clusterDNS: [{DNS_SERVICE_IP}]
clusterDomain: {CLUSTER_DOMAIN}
resolvConf: {self.conf / 'resolv.conf'}
volumePluginDir: {self.dir / 'volume-plugins'}
failSwapOn: false
protectKernelDefaults: false
serializeImagePulls: false
maxPods: 110
# Absolute floors, not percentages: on a shared build machine with a big disk, 2% is several
# GB that other jobs (image builds, other checkouts' nodes) come and go through, and a short
# dip below it evicted every pod here (DiskPressure) in the middle of a test.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 512Mi
  imagefs.available: 512Mi
  nodefs.inodesFree: 2%
imageGCHighThresholdPercent: 98
imageGCLowThresholdPercent: 95
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 1m
syncFrequency: 10s
fileCheckFrequency: 20s
shutdownGracePeriod: 0s
# The kubelet cannot lower its own oom_score_adj here (-999 is the default).
oomScoreAdj: 0
shutdownGracePeriodCriticalPods: 0s
containerLogMaxSize: 50Mi
logging:
  format: text
"""

    def _kube_proxy_yaml(self) -> str:
        return f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {self.conf / 'kube-proxy.kubeconfig'}
hostnameOverride: {self.name}
mode: iptables
clusterCIDR: {self.pod_cidr}
nodePortAddresses: ["{self.node_ip}/32"]
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
iptables:
  localhostNodePorts: false
  masqueradeAll: false
  syncPeriod: 30s
  minSyncPeriod: 1s
# Leave the kernel's conntrack settings alone (some are global, not per network namespace).
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
"""

    def _commands(self) -> dict[str, list[str]]:
        b = self.cp.bin_dir
        labels = {
            "ibm.com/spyre.present": "true",
            "ibm.com/spyre.product": "IBM_Spyre",
            "ibm.com/spyre.count": str(self.cards),
            "topology.kubernetes.io/zone": "zone-a",
            "type": "real",
            NODE_LABEL: "true",
        }
        return {
            "containerd": ["containerd", "--config", str(self.conf / "containerd.toml"),
                           "--log-level", "warn"],
            "kubelet": [
                str(b / "kubelet"),
                f"--config={self.conf / 'kubelet.yaml'}",
                f"--kubeconfig={self.conf / 'kubelet.kubeconfig'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.node_ip}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
                f"--root-dir={self.kubelet_dir}",
                f"--cert-dir={self.kubelet_dir / 'pki'}",
                "--v=1",
            ],
            "kube-proxy": [str(b / "kube-proxy"), f"--config={self.conf / 'kube-proxy.yaml'}",
                           "--v=1"],
        }

    # ------------------------------------------------------------------ processes
    def _make_cgroups(self) -> None:
        root_cpuset = CGROUP_ROOT / "cpuset"
        for top in node_cgroup_dirs(self.cgroup_name):
            # <top>: the kubelet's cgroupRoot (kubepods below); <top>/system: the node's own
            # processes (cgroup v2 allows no processes beside child cgroups with controllers).
            for d in (top, top / "system"):
                d.mkdir(exist_ok=True)
                if top.parent == root_cpuset:
                    # cpuset v1: a new cgroup starts with no CPUs/memory nodes; copy the root's.
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        if not (d / f).read_text().strip():
                            (d / f).write_text((root_cpuset / f).read_text())

    def _start_namespaces(self) -> int:
        log = open(self.cp.logs / "node-init.log", "ab")  # noqa: SIM115 - handed to the child
        argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount",
                "--net", "--uts", "--", sys.executable, str(HERE / "node_init.py"),
                str(self.dir / "node.json")]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, cwd=str(self.dir),
                                start_new_session=True)
        log.close()
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.write_text(f"{proc.pid}\n")
        my_ns = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{proc.pid}/ns/net") != my_ns:
                    return proc.pid
            if proc.poll() is not None or time.monotonic() > deadline:
                raise NodeError(f"unshare exited with {proc.returncode}; see node-init.log")
            time.sleep(0.02)

    def _setup_network(self, pid: int) -> None:
        hif, nif = self.host_if, self.node_if
        _run("ip", "link", "add", hif, "type", "veth", "peer", "name", nif, "netns", str(pid))
        with contextlib.suppress(OSError):
            Path(f"/proc/sys/net/ipv6/conf/{hif}/disable_ipv6").write_text("1")
        _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", hif)
        _run("ip", "link", "set", hif, "up")
        # Replies to pods (they reach the API server through the Service) go back via the node.
        _run("ip", "route", "add", self.pod_cidr, "via", self.node_ip, "dev", hif)
        ns = ["nsenter", f"--net=/proc/{pid}/ns/net", "--"]
        _run(*ns, "sysctl", "-q", "-w", f"net.ipv6.conf.{nif}.disable_ipv6=1", check=False)
        _run(*ns, "ip", "addr", "add", f"{self.node_ip}/30", "dev", nif)
        _run(*ns, "ip", "link", "set", nif, "up")
        # The node itself (hostNetwork pods, kube-proxy's own checks) reaches Service IPs too;
        # kube-proxy's OUTPUT rules rewrite them, this route only lets the packets out.
        _run(*ns, "ip", "route", "add", self.cp_service_cidr(), "via", self.host_ip, "dev", nif)

    def _forwards(self) -> list[str]:
        """tcpforward.py's arguments: the API server (TCP), CoreDNS (TCP and UDP) and the
        registry (TCP), from the host end of the link to their ports on 127.0.0.1."""
        ports = self.cp.state["ports"]
        api, dns, reg = ports["apiserver"], ports["coredns"], ports["registry"]
        return [f"{self.host_ip}:{api}", f"127.0.0.1:{api}",
                f"{self.host_ip}:{dns}", f"127.0.0.1:{dns}",
                f"udp:{self.host_ip}:{dns}", f"127.0.0.1:{dns}",
                f"{self.host_ip}:{reg}", f"127.0.0.1:{reg}"]

    def _start_forwarder(self) -> None:
        log = open(self.cp.logs / "node-apiforward.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "tcpforward.py"), *self._forwards()],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.forward_pid_file.write_text(f"{proc.pid}\n")

    def _wait_containerd(self, timeout: float) -> None:
        from tests.cluster.controlplane import wait_until

        def ok() -> bool:
            if not self.pid():
                raise NodeError("the node died before containerd started; see node-init.log")
            return (self.dir / "containerd.ready").exists()

        wait_until(ok, timeout, "containerd in the node", 0.1)

    # ------------------------------------------------------------------ cards
    def _advertise_cards(self) -> None:
        """PATCH the node's status with the Spyre cards (extended resources)."""
        ops = []
        for field in ("capacity", "allocatable"):
            for r in ("ibm.com~1spyre_vf", "ibm.com~1spyre_pf"):
                ops.append({"op": "add", "path": f"/status/{field}/{r}", "value": str(self.cards)})
        self.cp.kubectl("patch", "node", self.name, "--subresource=status", "--type=json",
                        "-p", json.dumps(ops))

    def _cards_allocatable(self) -> bool:
        n = self.node_object() or {}
        alloc = n.get("status", {}).get("allocatable", {})
        return alloc.get("ibm.com/spyre_vf") == str(self.cards) and \
            alloc.get("ibm.com/spyre_pf") == str(self.cards)

    # ------------------------------------------------------------------ images
    def ctr(self, *args: str, input: bytes | None = None, check: bool = True,  # noqa: A002
            timeout: float | None = 3600) -> subprocess.CompletedProcess[bytes]:
        """``ctr`` against the node's containerd, namespace ``k8s.io`` (the CRI's)."""
        res = subprocess.run(["ctr", "--address", str(self._standalone or self.socket),
                              "--namespace", "k8s.io",
                              *args], input=input, capture_output=True, timeout=timeout)
        if check and res.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {res.stderr.decode(errors='replace').strip()}")
        return res

    def images(self) -> list[str]:
        """Names of the images in the node's containerd (as the kubelet sees them)."""
        return self.ctr("images", "list", "-q").stdout.decode().split()

    def image_digests(self) -> dict[str, str]:
        """{image name: manifest (or index) digest} in the node's containerd."""
        rows = [ln.split() for ln in self.ctr("images", "list").stdout.decode().splitlines()[1:]]
        return {r[0]: r[2] for r in rows if len(r) > 2}

    def import_image(self, archive: Path | str, name: str | None = None,
                     keep_layers: bool = False, force: bool = False) -> list[str]:
        """Import an OCI or docker archive (``buildah push ... oci-archive:X`` or
        ``docker-archive:X``) into the node's containerd; returns the imported image names.

        Unless ``keep_layers``, the layer blobs are dropped from containerd's content store
        once unpacked (what containerd's ``discard_unpacked_layers`` does for pulls): the
        snapshots are what containers run from, and it halves the disk an image takes (the
        9 GB engine: 8.5 GB instead of 17). Such an image cannot be exported again.

        ``name`` tags the (single) imported image with that reference as well. Pods use it
        with ``imagePullPolicy: Never`` or ``IfNotPresent`` (there is no registry). Note the
        kubelet normalises references: ``foo:1`` means ``docker.io/library/foo:1``,
        ``localhost/foo:1`` stays as it is. Images survive node and cluster restarts
        (containerd's root is ``.cluster/node/containerd``).

        An archive imported before (same path, size and mtime) whose images are still there
        with the same digests is not read again (the engine's takes minutes); ``force``
        imports it anyway."""
        if not self._standalone and (not self.pid() or not self.socket.exists()):
            raise NodeError("the real node is not running; start it with `node-up`")
        archive = Path(archive).resolve()
        if not archive.is_file():
            raise NodeError(f"no image archive at {archive}")
        marker = self._import_marker(archive)
        if not force and marker.exists():
            with contextlib.suppress(ValueError, OSError):
                seen: dict[str, str] = json.loads(marker.read_text())
                have = self.image_digests()
                if seen and all(have.get(n) == d for n, d in seen.items()):
                    names = sorted(seen)
                    if name and name not in names:
                        self.ctr("images", "tag", "--force", names[0], name)
                        names.append(name)
                    return names
        before = set(self.images())
        res = self.ctr("images", "import", str(archive), check=False)
        if res.returncode != 0:
            raise NodeError(f"ctr import {archive}: {res.stderr.decode(errors='replace').strip()}")
        out = res.stdout.decode()
        names = sorted({m.group(1) for m in re.finditer(r"unpacking (\S+) \(", out)}
                       | (set(self.images()) - before))
        names = [n for n in names if not n.startswith("sha256:")]
        if not keep_layers:
            for n in names:
                self._discard_layers(n)
        self._drop_older_tags(names)
        have = self.image_digests()
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({n: have[n] for n in names if n in have}))
        if name:
            if len(names) != 1:
                raise NodeError(f"--name needs exactly one image in {archive}, found {names}")
            self.ctr("images", "tag", "--force", names[0], name)
            names.append(name)
        return names

    def prime_images(self, archives: list[Path]) -> dict[str, float]:
        """Import image archives into the node's containerd root ahead of the node's start: the
        set-up (``make deps``) does this once the images are built, while the Go builds still
        hold the CPU, instead of the first real-node test (the engine's 9 GB take 2-6 min from
        a cold page cache). A running node imports them itself. While the node is down, a
        containerd of its own opens the node's root (no CRI plugin, its own state and socket,
        in a private mount namespace: nothing of it stays on the host) and the archives go in
        as :meth:`import_image` puts them (the same markers: the node's later imports of these
        archives return at once). Returns {archive name: seconds}."""
        took: dict[str, float] = {}
        self.check_disk_for(archives)
        with self.cp._lock():
            if self.pid() and self.socket.exists():
                context: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            else:
                context = self._standalone_containerd()
            with context:
                for archive in archives:
                    t0 = time.monotonic()
                    self.import_image(archive)
                    took[Path(archive).name] = time.monotonic() - t0
        return took

    def _import_marker(self, archive: Path) -> Path:
        """Where an import of ``archive`` (this path, size and mtime) is recorded."""
        st = archive.stat()
        key = hashlib.sha256(f"{archive}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
        return self.dir / "imported" / f"{key[:24]}.json"

    def check_disk_for(self, archives: list[Path]) -> None:
        """Refuse, saying how much is needed, an import the disk cannot hold: containerd writes
        an archive's layers, unpacks them, then drops them, so an import peaks at about twice the
        archive (the engine's 9 GB: ~18 GB). Without this, a full disk shows up minutes later as
        ``ctr``'s ENOSPC in the middle of a layer (CI of a34a7e4: 11 GB free at the start)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        new = [Path(a).resolve() for a in archives if Path(a).is_file()]
        new = [a for a in new if not self._import_marker(a).exists()]
        if not new:
            return
        need = sum(2 * a.stat().st_size for a in new) + GIB
        free = shutil.disk_usage(self.dir).free
        if free < need:
            raise NodeError(
                f"not enough disk to import the images into the real node: {free / GIB:.1f} GiB "
                f"free under {self.dir}, an import of {', '.join(a.name for a in new)} "
                f"needs up to {need / GIB:.1f} GiB (make test needs ~40 GiB free in all: "
                "see .ci/README.md). Free space, e.g. `make cluster-down` in other checkouts, "
                "`make images-prune`, other checkouts' .cluster/ directories")

    @contextlib.contextmanager
    def _standalone_containerd(self):  # type: ignore[no-untyped-def]
        import tempfile

        from tests.cluster.controlplane import wait_until

        for d in (self.containerd_root, self.dir / "opt", self.cp.logs):
            d.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="spyre-node-prime-"))  # short: a socket path
        sock = tmp / "containerd.sock"
        (tmp / "config.toml").write_text(f"""# tests/cluster/node.py prime_images
version = 2
root = "{self.containerd_root}"
state = "{tmp / 'state'}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.dir / 'opt'}"
""")
        with open(self.cp.logs / "node-prime-containerd.log", "ab") as log:
            proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "containerd", "--config",
                 str(tmp / "config.toml"), "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        try:
            def serving() -> bool:
                if proc.poll() is not None:
                    raise NodeError(f"containerd for the node's images exited ({proc.returncode});"
                                    f" see {self.cp.logs / 'node-prime-containerd.log'}")
                return subprocess.run(["ctr", "--address", str(sock), "version"],
                                      capture_output=True, timeout=30).returncode == 0

            wait_until(serving, 60, "containerd for the node's images")
            self._standalone = sock
            yield
        finally:
            self._standalone = None
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)

    def _drop_older_tags(self, names: list[str]) -> None:
        """Remove other tags of the imported repositories (``localhost/spyre-engine:<old>``).

        The images are tagged with the hash of their inputs, so every engine change imports
        another 9 GB; without this the node's containerd kept every one of them, the disk filled
        up and the kubelet's image GC removed the pause and busybox images as well."""
        repos = {n.rsplit(":", 1)[0] for n in names if ":" in n}
        stale = [i for i in self.images()
                 if ":" in i and i.rsplit(":", 1)[0] in repos and i not in names]
        if stale:
            self.ctr("images", "rm", *stale, check=False)

    def _discard_layers(self, image: str) -> None:
        rows = [ln.split() for ln in self.ctr("images", "list").stdout.decode().splitlines()[1:]]
        digest = next((r[2] for r in rows if r and r[0] == image), None)
        layers: list[str] = []
        todo = [digest] if digest else []
        while todo:  # an index lists manifests; a manifest lists layers
            doc = json.loads(self.ctr("content", "get", todo.pop()).stdout)
            layers += [d["digest"] for d in doc.get("layers", [])]
            todo += [m["digest"] for m in doc.get("manifests", [])
                     if m.get("platform", {}).get("architecture") in (None, "amd64")]
        if layers:
            self.ctr("content", "rm", *layers, check=False)

    def ensure_base_images(self) -> None:
        """The pause (sandbox) image and the busybox test image, built here if needed."""
        have = set(self.images())
        for name, path in ociimage.busybox_images(self.image_cache).items():
            if name not in have:
                self.import_image(path)

    # ------------------------------------------------------------------ down
    def down(self, delete_node: bool = True) -> list[str]:
        """Stop the node and undo everything it changed on the host. Returns leftovers
        (empty when the host is as it was before ``up``)."""
        with self.cp._lock():
            return self._down(delete_node)

    def _down(self, delete_node: bool = True) -> list[str]:
        if not self.dir.exists() and not self.pid_file.exists():
            return []  # never started here
        owner = self.owner()
        if owner and owner != str(self.dir):
            _log(f"the real node running belongs to {owner}; leaving it alone")
            return []
        was_up = self.pid() is not None or self.baseline_file.exists()
        if delete_node and self.cp._load_state() and self.cp.apiserver_ready():
            self.cp.kubectl("delete", "node", self.name, "--ignore-not-found", "--wait=false",
                            check=False, timeout=30)
        # The pid file's forwarder, and any other of this slot (a removed checkout's).
        for fwd in {self.forward_pid(), *forwarders_of(self.host_ip)} - {None}:
            self._kill(fwd)  # type: ignore[arg-type]
        pid = self.pid()
        # Kill everything in the node's cgroups (the init first: the kernel then kills the
        # whole pid namespace) and the unshare process; repeat until nothing is left.
        deadline = time.monotonic() + 30
        while True:
            pids = _cgroup_pids(self.cgroup_name)
            if pid and _pid_alive(pid):
                pids.add(pid)
            if not pids:
                break
            for p in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
                _reap(p)
            if time.monotonic() > deadline:
                raise NodeError(f"node processes survive SIGKILL: {sorted(pids)}")
            time.sleep(0.05)
        if pid:
            _reap(pid)
        self.pid_file.unlink(missing_ok=True)
        self.forward_pid_file.unlink(missing_ok=True)
        self._remove_cgroups(self.cgroup_name)
        # The veth pair (and with it the node's network namespace) goes once the last
        # reference is gone; the kernel frees namespaces asynchronously.
        deadline = time.monotonic() + 20
        while self.host_if in _links() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.host_if in _links():
            _run("ip", "link", "delete", self.host_if, check=False)
        baseline = self._baseline()
        others = self.other_nodes()
        if baseline and not others:  # else the last node to stop restores them
            for key, value in baseline["sysctls"].items():
                if value is not None and _read_sysctl(key) != value:
                    with contextlib.suppress(OSError):
                        Path("/proc/sys", key).write_text(value)
        for stale in (self.socket, Path(f"{self.socket}.ttrpc"), self.dir / "containerd.ready"):
            stale.unlink(missing_ok=True)
        # Pod directories of the dead kubelet (their mounts died with the mount namespace).
        pods_dir = self.kubelet_dir / "pods"
        if pods_dir.exists() and not any(str(pods_dir) in m for m in _mounts()):
            shutil.rmtree(pods_dir, ignore_errors=True)
        leaks = self.leaks(baseline, sysctls=not others) if was_up else []
        if leaks:
            _log("left behind: " + "; ".join(leaks))
        else:
            self.baseline_file.unlink(missing_ok=True)
        return leaks

    def _kill(self, pid: int) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + 3
            while _pid_alive(pid) and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.05)
            if not _pid_alive(pid):
                break
        _reap(pid)

    @staticmethod
    def _remove_cgroups(name: str) -> None:
        for top in node_cgroup_dirs(name):
            if not top.is_dir():
                continue
            dirs = [Path(dp) for dp, _d, _f in os.walk(top)]
            for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
                for _ in range(50):
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)  # a dying process may still be accounted for

    def _baseline(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.baseline_file.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def leaks(self, baseline: dict[str, Any] | None = None, sysctls: bool = True) -> list[str]:
        """What the node left on the host: processes, mounts, network namespaces, links
        (veth, bridge), iptables rules, sysctls, cgroups, directories. Compared with the
        snapshot taken before ``up`` when there is one (sysctls only if ``sysctls``: not
        while another checkout's node runs, whose kubelet set them too)."""
        out: list[str] = []
        marker = str(self.dir).encode()
        forwarders = set(forwarders_of(self.host_ip))
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if not _pid_alive(int(d.name)):  # a zombie holds nothing; its parent reaps it
                    continue
                argv = (d / "cmdline").read_bytes()
                if marker in argv or int(d.name) in forwarders:
                    cmd = argv.replace(b"\0", b" ")[:100].decode(errors="replace")
                    out.append(f"process {d.name}: {cmd}")
                elif re.search(rb":/" + self.cgroup_name.encode() + rb"(/|$)",
                               (d / "cgroup").read_bytes(), re.M):
                    out.append(f"process {d.name} in cgroup /{self.cgroup_name}")
        out += [f"cgroup {d}" for d in node_cgroup_dirs(self.cgroup_name) if d.exists()]
        mounts = _mounts()
        # Ours: under .cluster/node, pod netns bind mounts, the node's tmpfs (spyre-node-*).
        out += [f"mount {m}" for m in mounts
                if str(self.dir) in m or "/run/netns/cni-" in m or "spyre-node-" in m]
        links = _links()
        out += [f"link {ln}" for ln in links if ln in (self.host_if, self.node_if, BRIDGE)]
        if baseline:
            # Other jobs on the machine (buildah, podman) may add their own links, netns and
            # rules meanwhile; count only what can be ours.
            now = host_snapshot(self.cgroup_name)
            out += [f"netns {n}" for n in sorted(set(now["netns"]) - set(baseline["netns"]))
                    if n.startswith("cni-")]
            ours = ("KUBE-", "CNI-", "10.245.", "10.250.", "10.96.", "spyre")
            for tool, lines in now["iptables"].items():
                before = set(baseline["iptables"].get(tool, []))
                extra = [ln for ln in lines if ln not in before and any(o in ln for o in ours)]
                if extra:
                    out.append(f"iptables rules left ({tool}): {extra[:5]}")
            for k, v in now["sysctls"].items() if sysctls else ():
                if v != baseline["sysctls"].get(k):
                    out.append(f"sysctl {k} = {v} (was {baseline['sysctls'].get(k)})")
            for p, existed in baseline.get("paths", {}).items():
                if now["paths"].get(p) and not existed:
                    out.append(f"path {p} created")
        return out
