#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback, run as plain processes.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake Spyre nodes
and pod lifecycles) are started from the pinned binaries that ``tests/cluster/build.sh``
builds into a cache outside the repository. State, certificates and logs live in
``.cluster/`` at the repository root (or under ``$SPYRE_CLUSTER_ROOT`` for the test session's
fixture: ``make test`` runs its kwok tests on a control plane of their own, tests/streams.py):

    .cluster/kubeconfig        admin kubeconfig (token of user "admin", group system:masters)
    .cluster/bin/{kubectl,helm}
    .cluster/logs/<component>.log
    .cluster/pids/<component>.pid
    .cluster/state.json        ports, binary dir and the command line of every component
    .cluster/pki/              throwaway CA, serving cert, service-account keys, admin token
    .cluster/etcd/             etcd data (wiped by ``down``)

CLI::

    python tests/cluster/controlplane.py up      # idempotent; prints the kubeconfig path
    python tests/cluster/controlplane.py up --with-node   # also the real node (SPYRE_REAL_NODE=1)
    python tests/cluster/controlplane.py down    # stops every process it started (node too)
    python tests/cluster/controlplane.py status
    python tests/cluster/controlplane.py node-up | node-down | node-status
    python tests/cluster/controlplane.py import-image X.tar [--name REF]  # into the node

The real node (kubelet + containerd, real pods) is in ``node.py``; ``down`` stops it first
and reports anything it left on the host (exit code 4).

Library::

    from tests.cluster.controlplane import ControlPlane
    cp = ControlPlane(root=Path(repo))
    cp.up(); cp.kubectl("get", "nodes"); cp.restart(("kube-apiserver", "etcd")); cp.down()

Only the standard library is used (plus the ``openssl`` command line tool).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.cluster.node import RealNode

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent

# Start order; stopping goes the other way round.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
              "coredns", "registry")
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)

SERVICE_CIDR = "10.96.0.0/16"
REAL_NODE_LABEL = "spyre.dev/real-node"


def node_slot(state_dir: Path) -> int:
    """1..250, from the state directory's path: the real node's addresses, interface and
    cgroup names are machine-wide, so each checkout gets its own (node.py)."""
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()
    return int(digest, 16) % 250 + 1


def node_host_ip(state_dir: Path) -> str:
    """The host end of the real node's veth pair (10.250.<slot>.1). The API server advertises
    it for the `kubernetes` Service (lease endpoint reconciler) and node.py relays it to
    127.0.0.1 while the node runs; without a node it is simply unreachable."""
    return f"10.250.{node_slot(state_dir)}.1"
SERVICE_IP = "10.96.0.1"
# Cluster DNS: CoreDNS (a control-plane process on 127.0.0.1) behind the conventional
# kube-system/kube-dns Service, which the real node's kubelet gives pods as their nameserver.
CLUSTER_DOMAIN = "cluster.local"
DNS_SERVICE_IP = "10.96.0.10"
# The reverse zone of SERVICE_CIDR (10.96.0.0/16); there is no IPv6 Service range.
DNS_REVERSE_ZONE = "96.10.in-addr.arpa"
POD_CIDR = "10.244.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node=fake"

# Static PersistentVolumes for the "local" StorageClass. Retain + fixtures that make
# Released volumes Available again (ControlPlane.recycle_pvs) keep the pool from draining.
PV_COUNT_SMALL = 40  # 100Gi each
PV_COUNT_LARGE = 8  # 1Ti each
STORAGE_CLASS = "local"
# hostPath of each static PV: .cluster/pv/<pv name> (ControlPlane.pv_root). Only pods on the
# real node use them; node.py creates them world-writable (pods run as non-root; hostPath
# ignores fsGroup), recycle_pvs() empties a Released one, `down` removes them all.

UP_TIMEOUT = float(os.environ.get("SPYRE_CLUSTER_UP_TIMEOUT", "120"))


class ClusterError(RuntimeError):
    """The control plane could not be started, or is not healthy."""


class BinariesMissing(ClusterError):
    """The pinned binaries have not been built yet."""


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:  # include what kubectl said, not just the exit code
        cmd = " ".join(str(c) for c in self.cmd[3:]) if isinstance(self.cmd, list) else self.cmd
        err = (self.stderr or "").strip() or (self.output or "").strip()
        return f"kubectl {cmd} failed with exit code {self.returncode}: {err}"


def _log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def _read_versions(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip().strip('"').strip("'")
    return out


def default_bin_dir() -> Path:
    """The cache directory build.sh builds into (same formula as build.sh)."""
    v = _read_versions(HERE / "versions.env")
    cache_root = os.environ.get("SPYRE_BIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "spyre-model-operator",
        "bin",
    )
    name = (
        f"k8s-{v['K8S_VERSION']}.etcd-{v['ETCD_VERSION']}"
        f".kwok-{v['KWOK_VERSION']}.helm-{v['HELM_VERSION']}"
    )
    return Path(cache_root) / name


def coredns_bin() -> Path:
    """The CoreDNS binary build.sh builds (its own cache directory, beside default_bin_dir)."""
    v = _read_versions(HERE / "versions.env")
    return default_bin_dir().parent / f"coredns-{v['COREDNS_VERSION']}" / "coredns"


def registry_bin() -> Path:
    """The OCI registry registry-deps.sh builds (CNCF distribution, beside default_bin_dir)."""
    v = _read_versions(HERE / "versions.env")
    return (default_bin_dir().parent / f"distribution-{v['DISTRIBUTION_VERSION']}"
            / "registry")


# Ports are picked outside the kernel's ephemeral range (spyre_engine.testing.process explains
# why): one implementation for the cluster, the operators and the engines the tests start.
from spyre_engine.ports import PICK_RANGE as PICK_RANGE  # noqa: E402
from spyre_engine.ports import free_ports as free_ports  # noqa: E402

#: Held while a control plane starts (any root): its ports are picked free and then bound by
#: its components seconds later, and two clusters starting at once (``make test``'s cluster
#: sessions each run one) could pick the same port in between.
START_LOCK = Path(os.environ.get("TMPDIR") or "/tmp") / "spyre-controlplane-start.lock"


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created) between processes, held inside the block."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class NotYet(Exception):  # noqa: N818 - it names the state, as the predicates raise it
    """A predicate's own "not yet", with what it saw (the deadline's error names it)."""


#: What a predicate may raise while the thing it polls is still coming up: a connection refused
#: or an HTTP error (OSError), a kubectl/subprocess failure (a 404, a timeout), a key or item
#: not there yet, a partial JSON document, and :class:`NotYet`. A ``TypeError`` or
#: ``AttributeError`` is "not yet" only when it is about ``None`` (``None["status"]``,
#: ``None.get``: an object not filled in); see :func:`not_yet`. Anything else (a ``TypeError``
#: of a wrong call, an ``AttributeError`` of a misspelt method, a ``ValueError``), and above all
#: ``AssertionError``, is a bug in the test or the code and ends the wait at once.
NOT_YET: tuple[type[Exception], ...] = (
    OSError, subprocess.SubprocessError, KeyError, IndexError, json.JSONDecodeError, NotYet,
)
#: Raised about ``None``: retried as "not yet"; of any other object, they end the wait.
ABOUT_NONE: tuple[type[Exception], ...] = (TypeError, AttributeError)


def not_yet(exc: BaseException, retry: tuple[type[Exception], ...] = NOT_YET) -> bool:
    """True when ``exc`` means "not yet" (polled through); False when it ends the wait."""
    if isinstance(exc, AssertionError):
        return False
    if isinstance(exc, retry):
        return True
    # None["x"], None.get, `in None`, len(None), None + 1: CPython names the type 'NoneType'
    return isinstance(exc, ABOUT_NONE) and "'NoneType'" in str(exc)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.2,
    retry: tuple[type[Exception], ...] = NOT_YET,
) -> Any:
    """Poll ``predicate`` until it returns something truthy and return that value.

    An ``AssertionError`` or any exception outside ``retry`` propagates at once: an assertion
    inside a wait fails the test. Exceptions in ``retry`` mean "not yet" and are polled
    through; at the deadline the ``TimeoutError`` names the last one (and chains it).
    """
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:
            if not not_yet(exc, retry):
                raise
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {type(last_exc).__name__}: {last_exc})" if last_exc else ""
            raise TimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}{detail}"
            ) from last_exc
        time.sleep(interval)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (avoids zombies in pytest)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


class ControlPlane:
    """The local control plane rooted at ``root`` (the repository)."""

    def __init__(self, root: Path | str | None = None, bin_dir: Path | str | None = None):
        self.root = Path(root).resolve() if root else REPO_ROOT
        self.state_dir = self.root / ".cluster"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.pki = self.state_dir / "pki"
        self.logs = self.state_dir / "logs"
        self.pids = self.state_dir / "pids"
        self.link_dir = self.state_dir / "bin"
        self.state_file = self.state_dir / "state.json"
        self.component_kubeconfig = self.state_dir / "components.kubeconfig"
        self.pv_root = self.state_dir / "pv"
        self._bin_dir = Path(bin_dir) if bin_dir else None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._node: RealNode | None = None

    # ------------------------------------------------------------------ paths & state
    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            state = self._load_state()
            if state and Path(state.get("bin_dir", "")).is_dir():
                self._bin_dir = Path(state["bin_dir"])
            else:
                self._bin_dir = default_bin_dir()
        return self._bin_dir

    def check_binaries(self) -> None:
        missing = [b for b in BINARIES if not os.access(self.bin_dir / b, os.X_OK)]
        for extra in (coredns_bin(), registry_bin()):
            if not os.access(extra, os.X_OK):
                missing.append(str(extra))
        if missing:
            raise BinariesMissing(
                f"control-plane binaries missing in {self.bin_dir}: {', '.join(missing)}. "
                "Build them with `make binaries` "
                "(tests/cluster/build.sh; about 25 min cold on 2 cores)."
            )

    def _load_state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    @property
    def state(self) -> dict[str, Any]:
        st = self._load_state()
        if not st:
            raise ClusterError(f"no cluster state in {self.state_file}; run `up` first")
        return st

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.state['ports']['apiserver']}"

    @property
    def admin_token(self) -> str:
        return (self.pki / "admin.token").read_text().strip()

    # ------------------------------------------------------------------ kubectl
    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | bytes | None = None,  # noqa: A002 - mirrors subprocess.run
        timeout: float | None = 120,
        kubeconfig: Path | str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        if isinstance(input, bytes):
            input = input.decode()
        cmd = [
            str(self.bin_dir / "kubectl"),
            "--kubeconfig",
            str(kubeconfig or self.kubeconfig),
            *[str(a) for a in args],
        ]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise KubectlError(res.returncode, cmd, res.stdout, res.stderr)
        return res

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Until CRD ``crd`` is Established, by polling its conditions. Not ``kubectl wait
        --for=condition=Established``: it exits at once with ".status.conditions accessor
        error: <nil>" when it reads the CRD while its conditions are null (seen twice in the
        full run of c9da6be, on a CRD that existed; knative/operator#2338 saw the same)."""
        def established() -> bool:
            obj = self.kubectl_json("get", "crd", crd)
            conds = (obj.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True"
                       for c in conds)

        wait_until(established, timeout, f"CRD {crd} Established", 0.5)

    def kubectl_json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json", **kw).stdout)

    def apply(self, manifest: str | dict[str, Any] | list[dict[str, Any]], *extra: str) -> str:
        """``kubectl apply`` a YAML/JSON string, an object or a list of objects."""
        if not isinstance(manifest, str):
            items = manifest if isinstance(manifest, list) else [manifest]
            manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        return self.kubectl("apply", "-f", "-", *extra, input=manifest).stdout

    # ------------------------------------------------------------------ health
    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        return ctx

    def _get(self, url: str, timeout: float = 2.0, token: bool = True) -> tuple[int, str]:
        req = urllib.request.Request(url)
        if token:
            req.add_header("Authorization", f"Bearer {self.admin_token}")
        ctx = self._ssl_context() if url.startswith("https") else None
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def apiserver_ready(self) -> bool:
        try:
            code, _ = self._get(f"{self.server}/readyz")
            return code == 200
        except Exception:  # noqa: BLE001
            return False

    def etcd_healthy(self) -> bool:
        try:
            port = self.state["ports"]["etcd"]
            code, body = self._get(f"http://127.0.0.1:{port}/health", token=False)
            return code == 200 and '"health":"true"' in body.replace(" ", "")
        except Exception:  # noqa: BLE001
            return False

    def pid(self, component: str) -> int | None:
        try:
            pid = int((self.pids / f"{component}.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_ours(pid, component) else None

    def _is_ours(self, pid: int, component: str | None = None) -> bool:
        if not _pid_alive(pid):
            return False
        argv = _cmdline(pid)
        if not argv:
            return False
        exe = os.path.basename(argv[0])
        if component and exe != component:
            return False
        if exe not in COMPONENTS:
            return False
        marker = str(self.state_dir) + "/"
        return any(marker in a for a in argv)

    def running(self) -> dict[str, bool]:
        return {c: self.pid(c) is not None for c in COMPONENTS}

    def healthy(self) -> bool:
        if not self._load_state():
            return False
        if not all(self.running().values()):
            return False
        return self.apiserver_ready()

    # ------------------------------------------------------------------ up / down
    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise up/down between processes (e.g. two pytest runs)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with _flocked(self.state_dir / "lock"):
            yield

    def up(self, timeout: float = UP_TIMEOUT) -> Path:
        """Start the cluster, or reuse a healthy running one. Returns the kubeconfig path."""
        self.check_binaries()
        with self._lock(), _flocked(START_LOCK):  # one control plane starting at a time
            return self._up(timeout)

    def _up(self, timeout: float) -> Path:
        if self._load_state() and self.pid("etcd") and self.pid("kube-apiserver"):
            if self.apiserver_ready():
                # Keep the data; bring back only what died (e.g. after a fault-injection test).
                self._ensure_ports()
                for c in COMPONENTS:
                    if not self.pid(c):
                        _log(f"{c} is not running; starting it again")
                        self._start(c)
                        if c == "coredns":
                            self._apply_dns_service()
        if self.healthy():
            _log("reusing the running cluster")
            self._link_tools()
            self.recycle_pvs()
            return self.kubeconfig
        if any(self.pid(c) for c in COMPONENTS) or self._stray_pids():
            _log("a previous cluster is only partly running; stopping it first")
            self._down()
        t0 = time.monotonic()
        # A cluster stopped without `down` (the machine or the session was cut) leaves etcd's
        # data behind: reused with the new ports it keeps the old `kubernetes` Service
        # endpoint (the API server's previous port), and pods cannot reach the API server.
        self._wipe_data()
        for d in (self.state_dir, self.pki, self.logs, self.pids, self.link_dir):
            d.mkdir(parents=True, exist_ok=True)
        for f in self.logs.glob("*.log"):  # keep the previous run's logs as *.log.prev
            f.replace(f.with_suffix(".log.prev"))
        (self.state_dir / ".gitignore").write_text("*\n")
        self._link_tools()
        self._ensure_pki()
        etcd_port, etcd_peer, api_port, kcm_port, sched_port, dns, dns_ready, reg = free_ports(8)
        state: dict[str, Any] = {
            "bin_dir": str(self.bin_dir),
            "ports": {
                "etcd": etcd_port,
                "etcd_peer": etcd_peer,
                "apiserver": api_port,
                "controller_manager": kcm_port,
                "scheduler": sched_port,
                "coredns": dns,
                "coredns_ready": dns_ready,
                "registry": reg,
            },
            "started_at": time.time(),
        }
        self.state_file.write_text(json.dumps(state, indent=2))
        self._write_kubeconfigs()
        self._write_configs()
        state["commands"] = self._commands(state["ports"])
        self.state_file.write_text(json.dumps(state, indent=2))

        try:
            self._start("etcd")
            wait_until(self.etcd_healthy, 30, "etcd /health")
            self._start("kube-apiserver")
            wait_until(self.apiserver_ready, timeout, "kube-apiserver /readyz", interval=0.25)
            t_api = time.monotonic() - t0
            for c in ("kube-controller-manager", "kube-scheduler", "kwok", "coredns", "registry"):
                self._start(c)
            self._bootstrap_objects()
            self._wait_ready(max(timeout - (time.monotonic() - t0), 10))
            wait_until(self.coredns_ready, max(timeout - (time.monotonic() - t0), 10),
                       "CoreDNS /ready", interval=0.25)
            wait_until(self.registry_ready, max(timeout - (time.monotonic() - t0), 10),
                       "the registry's /v2/", interval=0.25)
        except BaseException:
            _log("start-up failed; logs are in " + str(self.logs))
            self._dump_log_tails()
            self._down()
            raise
        _log(
            f"ready in {time.monotonic() - t0:.1f}s (apiserver after {t_api:.1f}s); "
            f"kubeconfig {self.kubeconfig}"
        )
        return self.kubeconfig

    def down(self) -> list[str]:
        """Stop every process this control plane started (the real node too) and wipe
        etcd's data. Returns what the real node left on the host (empty: nothing)."""
        with self._lock():
            return self._down()

    @property
    def node(self) -> RealNode:
        """The real node (tests/cluster/node.py); started only by ``node.up()``."""
        from tests.cluster.node import RealNode

        if self._node is None:
            self._node = RealNode(self)
        return self._node

    def _down(self) -> list[str]:
        """Stop everything; returns what the real node left behind (empty: nothing)."""
        from tests.cluster import dradriver, keda, metrics

        metrics.stop_leftovers(self.state_dir)
        keda.stop_leftovers(self.state_dir)
        dradriver.stop_leftovers(self.state_dir)
        leaks = self.node._down(delete_node=False)
        for c in reversed(COMPONENTS):
            self._stop(c)
        for pid in self._stray_pids():
            _log(f"killing leftover process {pid}: {' '.join(_cmdline(pid))[:120]}")
            self._kill_pid(pid)
        for f in self.pids.glob("*.pid") if self.pids.is_dir() else []:
            f.unlink(missing_ok=True)
        for p in (self.state_file, self.kubeconfig, self.component_kubeconfig):
            p.unlink(missing_ok=True)
        self._wipe_data()
        return leaks

    def _wipe_data(self) -> None:
        """Remove etcd's data and, with it, the PVs' contents (only with etcd stopped)."""
        etcd_dir = self.state_dir / "etcd"
        if etcd_dir.exists():
            subprocess.run(["rm", "-rf", str(etcd_dir)], check=False)
        if self.pv_root.is_dir():  # the PVs are gone with etcd's data; so is what was on them
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.pv_root)], check=False)

    def restart(self, components: Sequence[str] = ("kube-apiserver", "etcd")) -> None:
        """Stop the given components and start them again in place (same ports, certs, data)."""
        unknown = set(components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown components: {sorted(unknown)}")
        for c in reversed(COMPONENTS):
            if c in components:
                self._stop(c)
        for c in COMPONENTS:
            if c in components:
                self.start_component(c)

    def stop_component(self, component: str) -> None:
        """Stop one component (for fault injection); ``start_component`` brings it back."""
        self._stop(component)

    def start_component(self, component: str, timeout: float = 60) -> None:
        if self.pid(component):
            return
        self._start(component)
        if component == "etcd":
            wait_until(self.etcd_healthy, timeout, "etcd /health")
        elif component == "kube-apiserver":
            wait_until(self.apiserver_ready, timeout, "kube-apiserver /readyz", interval=0.25)
        elif component == "coredns":
            wait_until(self.coredns_ready, timeout, "CoreDNS /ready", interval=0.25)
        elif component == "registry":
            wait_until(self.registry_ready, timeout, "the registry's /v2/", interval=0.25)

    # ------------------------------------------------------------------ process handling
    def _start(self, component: str) -> int:
        argv = self._commands(self.state["ports"])[component]
        log = open(self.logs / f"{component}.log", "ab")  # noqa: SIM115 - handed to the child
        log.write(f"\n==== {time.strftime('%H:%M:%S')} starting {component}\n".encode())
        log.flush()
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        if component == "kwok":
            # kwok also loads ~/.kwok/kwok.yaml when it exists; keep it hermetic.
            env["HOME"] = str(self.state_dir / "kwok-home")
            Path(env["HOME"]).mkdir(exist_ok=True)
            self._write_kwok_stages()
        if component == "coredns":
            self._write_corefile()
        if component == "registry":
            self._write_registry_config()
            # distribution 3 exports traces over OTLP by default (to localhost:4318): off.
            env["OTEL_TRACES_EXPORTER"] = "none"
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(self.state_dir),
            env=env,
            start_new_session=True,  # own process group: killpg() takes everything down
        )
        log.close()
        self._procs[component] = proc
        (self.pids / f"{component}.pid").write_text(f"{proc.pid}\n")
        time.sleep(0.05)
        if proc.poll() is not None:
            raise ClusterError(f"{component} exited at once with {proc.returncode}; see its log")
        return proc.pid

    def _kill_pid(self, pid: int, grace: float = 10.0) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
            deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5)
            while time.monotonic() < deadline:
                _reap(pid)
                if not _pid_alive(pid):
                    break
                time.sleep(0.05)
            if not _pid_alive(pid):
                break
        _reap(pid)
        proc = next((p for p in self._procs.values() if p.pid == pid), None)
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)

    def _stop(self, component: str) -> None:
        pid_file = self.pids / f"{component}.pid"
        pid = self.pid(component)
        if pid:
            # kube-apiserver stops listening at once on SIGTERM but can then sit for a
            # minute waiting for open watch connections; do not wait that long.
            self._kill_pid(pid, grace=3.0 if component == "kube-apiserver" else 10.0)
        else:
            # The process is gone; its group might not be (it never forks, but be thorough).
            with contextlib.suppress(OSError, ValueError):
                old = int(pid_file.read_text().strip())
                for p in self._group_members(old):
                    self._kill_pid(p)
        self._procs.pop(component, None)
        pid_file.unlink(missing_ok=True)

    @staticmethod
    def _group_members(pgid: int) -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[2]) == pgid:
                    out.append(int(d.name))
        return out

    def _stray_pids(self) -> list[int]:
        """Processes of our components that reference this .cluster dir but have no pid file."""
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid() and self._is_ours(int(d.name)):
                out.append(int(d.name))
        return out

    def _dump_log_tails(self, lines: int = 15) -> None:
        for c in COMPONENTS:
            f = self.logs / f"{c}.log"
            if f.exists():
                tail = f.read_text(errors="replace").splitlines()[-lines:]
                _log(f"--- {f} (last {len(tail)} lines)\n" + "\n".join(tail))

    # ------------------------------------------------------------------ files
    def _link_tools(self) -> None:
        self.link_dir.mkdir(parents=True, exist_ok=True)
        for b in ("kubectl", "helm"):
            link = self.link_dir / b
            target = self.bin_dir / b
            if link.is_symlink() and os.readlink(link) == str(target):
                continue
            link.unlink(missing_ok=True)
            link.symlink_to(target)

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=self.pki)

    def _client_cert(self, name: str, subject: str) -> None:
        """``<name>.key`` and ``<name>.crt``: a client certificate signed by the cluster CA."""
        ext = f"{name}.ext"
        (self.pki / ext).write_text(
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n"
        )
        self._openssl("genrsa", "-out", f"{name}.key", "2048")
        self._openssl("req", "-new", "-key", f"{name}.key", "-subj", subject,
                      "-out", f"{name}.csr")  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", ext,
            "-out", f"{name}.crt",
        )  # fmt: skip

    def _ensure_pki(self) -> None:
        p = self.pki
        if not (p / "ca.crt").exists() or not (p / "ca.key").exists():
            self._openssl("genrsa", "-out", "ca.key", "2048")
            self._openssl(
                "req", "-x509", "-new", "-nodes", "-key", "ca.key", "-sha256", "-days", "3650",
                "-subj", "/CN=spyre-local-ca", "-out", "ca.crt",
            )  # fmt: skip
            (p / "apiserver.crt").unlink(missing_ok=True)
            (p / "apiserver-kubelet-client.crt").unlink(missing_ok=True)
            (p / "front-proxy-client.crt").unlink(missing_ok=True)
        san = ",".join(
            [
                "IP:127.0.0.1",
                f"IP:{SERVICE_IP}",
                f"IP:{node_host_ip(self.state_dir)}",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        ext = (
            f"subjectAltName={san}\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
        )
        old_ext = (p / "apiserver.ext").read_text() if (p / "apiserver.ext").exists() else ""
        if old_ext != ext:  # e.g. certificates from before the real node's address was added
            (p / "apiserver.crt").unlink(missing_ok=True)
        if not (p / "apiserver.crt").exists():
            (p / "apiserver.ext").write_text(ext)
            self._openssl("genrsa", "-out", "apiserver.key", "2048")
            self._openssl(
                "req", "-new", "-key", "apiserver.key", "-subj", "/CN=kube-apiserver",
                "-out", "apiserver.csr",
            )  # fmt: skip
            self._openssl(
                "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", "apiserver.ext",
                "-out", "apiserver.crt",
            )  # fmt: skip
        if not (p / "apiserver-kubelet-client.crt").exists():
            # The API server's client certificate towards kubelets (logs, exec, port-forward).
            self._client_cert(
                "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client"
            )
        if not (p / "front-proxy-client.crt").exists():
            # The aggregator's client certificate towards aggregated API servers (the metrics
            # adapter, tests/cluster/metrics.py); its CN is the allowed requestheader name.
            self._client_cert("front-proxy-client", "/CN=front-proxy-client")
        if not (p / "sa.key").exists():
            self._openssl("genrsa", "-out", "sa.key", "2048")
            (p / "sa.pub").unlink(missing_ok=True)
        if not (p / "sa.pub").exists():
            self._openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        if not (p / "admin.token").exists():
            (p / "admin.token").write_text(secrets.token_hex(24) + "\n")
        token = self.admin_token
        # token,user,uid,"group1,group2"
        (p / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
        for f in p.iterdir():
            f.chmod(0o600)

    def _kubeconfig_text(self, user: str, token: str, namespace: str | None = None) -> str:
        ca = base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()
        ns = f"\n    namespace: {namespace}" if namespace else ""
        return f"""apiVersion: v1
kind: Config
clusters:
- name: spyre-local
  cluster:
    server: {self.server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: {user}@spyre-local
  context:
    cluster: spyre-local
    user: {user}{ns}
current-context: {user}@spyre-local
"""

    def _write_kubeconfigs(self) -> None:
        for path in (self.kubeconfig, self.component_kubeconfig):
            path.write_text(self._kubeconfig_text("admin", self.admin_token))
            path.chmod(0o600)

    @property
    def kwok_stages(self) -> Path:
        return self.state_dir / "kwok-stages.yaml"

    def _write_kwok_stages(self) -> None:
        """All of tests/cluster/kwok/*.yaml in one file (re-read on every kwok start)."""
        docs = [f.read_text().strip() for f in sorted((HERE / "kwok").glob("*.yaml"))]
        self.kwok_stages.write_text("\n---\n".join(docs) + "\n")

    def _write_configs(self) -> None:
        kc = self.component_kubeconfig
        (self.state_dir / "scheduler.yaml").write_text(
            f"""apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {kc}
  qps: 100
  burst: 200
leaderElection:
  leaderElect: false
profiles:
- schedulerName: default-scheduler
# Spyre workloads: pack accelerator cards tightly so whole nodes stay free for big models.
- schedulerName: spyre-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources:
        - name: ibm.com/spyre_vf
          weight: 5
        - name: ibm.com/spyre_pf
          weight: 5
        - name: cpu
          weight: 1
        - name: memory
          weight: 1
"""
        )

    def _commands(self, ports: dict[str, int]) -> dict[str, list[str]]:
        b, s, p = self.bin_dir, self.state_dir, self.pki
        kc = str(self.component_kubeconfig)
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
        return {
            "etcd": [
                str(b / "etcd"),
                "--name=spyre",
                f"--data-dir={s / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=spyre={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=5m",
                "--log-level=warn",
            ],
            "kube-apiserver": [
                str(b / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                # The `kubernetes` Service's endpoint: the host end of the real node's veth
                # pair, relayed to 127.0.0.1 while the node runs (node.py). Unused otherwise.
                f"--advertise-address={node_host_ip(self.state_dir)}",
                "--endpoint-reconciler-type=lease",
                f"--secure-port={ports['apiserver']}",
                f"--cert-dir={s / 'apiserver-certs'}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--token-auth-file={p / 'tokens.csv'}",
                # front-proxy (aggregated API servers); also fills the
                # extension-apiserver-authentication ConfigMap the other components read.
                f"--requestheader-client-ca-file={p / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={p / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={p / 'front-proxy-client.key'}",
                # Aggregated APIs are reached at their endpoints, not a ClusterIP: the API
                # server runs on the host, where no kube-proxy programs Service addresses.
                "--enable-aggregator-routing=true",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # logs/exec/port-forward: dial the node's InternalIP, never resolve its name.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                "--allow-privileged=true",
                "--profiling=false",
                "--event-ttl=1h",
                "--v=1",
            ],
            "kube-controller-manager": [
                str(b / "kube-controller-manager"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['controller_manager']}",
                f"--cert-dir={s / 'kcm-certs'}",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}",
                # (the default, /usr/libexec/kubernetes/..., would be created on the host)
                f"--flex-volume-plugin-dir={s / 'flexvolume'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*",
                "--use-service-account-credentials=false",
                "--node-monitor-grace-period=2m",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
            "kube-scheduler": [
                str(b / "kube-scheduler"),
                f"--config={s / 'scheduler.yaml'}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['scheduler']}",
                f"--cert-dir={s / 'scheduler-certs'}",
                "--v=1",
            ],
            "kwok": [
                str(b / "kwok"),
                f"--kubeconfig={kc}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}",
                f"--cidr={POD_CIDR}",
                f"--config={self.kwok_stages}",
            ],
            "coredns": [str(coredns_bin()), "-conf", str(self.corefile)],
            "registry": [str(registry_bin()), "serve", str(self.registry_config)],
        }

    # ------------------------------------------------------------------ cluster objects
    def _storage_manifest(self) -> list[dict[str, Any]]:
        objs: list[dict[str, Any]] = [
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": STORAGE_CLASS,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": "kubernetes.io/no-provisioner",
                "reclaimPolicy": "Retain",
                "volumeBindingMode": "Immediate",
                "allowVolumeExpansion": True,
            }
        ]
        sizes = [("100Gi", PV_COUNT_SMALL, "pv"), ("1Ti", PV_COUNT_LARGE, "pv-large")]
        for size, count, prefix in sizes:
            for i in range(count):
                name = f"{prefix}-{i:03d}"
                objs.append(
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolume",
                        "metadata": {"name": name, "labels": {"spyre.dev/local-pv": "true"}},
                        "spec": {
                            "capacity": {"storage": size},
                            "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                            "persistentVolumeReclaimPolicy": "Retain",
                            "storageClassName": STORAGE_CLASS,
                            "volumeMode": "Filesystem",
                            "hostPath": {"path": str(self.pv_root / name), "type": ""},
                        },
                    }
                )
        return objs

    def _bootstrap_objects(self) -> None:
        nodes = (HERE / "manifests" / "nodes.yaml").read_text()
        wait_until(
            lambda: self.kubectl("apply", "-f", "-", input=nodes, check=False).returncode == 0,
            30,
            "creating the fake nodes",
            interval=0.5,
        )
        self.apply(self._storage_manifest())
        self._apply_dns_service()

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(deadline - time.monotonic(), 1)

        def nodes_ready() -> bool:
            items = [
                n
                for n in self.kubectl_json("get", "nodes")["items"]
                if n["metadata"].get("labels", {}).get(REAL_NODE_LABEL) != "true"
            ]
            if len(items) < 2:
                return False
            for n in items:
                conds = {c["type"]: c["status"] for c in n["status"].get("conditions", [])}
                taints = [t["key"] for t in n["spec"].get("taints", [])]
                if conds.get("Ready") != "True" or "node.kubernetes.io/not-ready" in taints:
                    return False
            return True

        wait_until(nodes_ready, left(), "the fake nodes to be Ready and untainted", 0.5)
        wait_until(
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default",
                                 check=False).returncode == 0,
            left(),
            "the default ServiceAccount",
            0.5,
        )  # fmt: skip
        wait_until(
            lambda: (
                len(self.kubectl_json("get", "pv", "-l", "spyre.dev/local-pv=true")["items"])
                >= PV_COUNT_SMALL + PV_COUNT_LARGE
            ),
            left(),
            "the static PersistentVolumes",
            0.5,
        )
        wait_until(
            lambda: self.kubectl("get", "storageclass", STORAGE_CLASS, check=False).returncode == 0,
            left(),
            "the StorageClass",
            0.5,
        )

    # ------------------------------------------------------------------ cluster DNS
    @property
    def corefile(self) -> Path:
        return self.state_dir / "Corefile"

    def _ensure_ports(self) -> None:
        """Ports for CoreDNS and the registry in a state file written before they were
        components."""
        st = self.state
        if "coredns" not in st["ports"]:
            st["ports"]["coredns"] = free_ports(1, udp=True)[0]  # TCP and UDP
            st["ports"]["coredns_ready"] = free_ports(1)[0]
        if "registry" not in st["ports"]:
            st["ports"]["registry"] = free_ports(1)[0]
        st["commands"] = self._commands(st["ports"])
        self.state_file.write_text(json.dumps(st, indent=2))

    # ------------------------------------------------------------------ the OCI registry
    @property
    def registry_config(self) -> Path:
        return self.state_dir / "registry.yml"

    @property
    def registry_dir(self) -> Path:
        """The registry's storage: kept across cluster restarts (a release pushed once is
        pulled again), removed with ``.cluster``."""
        return self.state_dir / "registry"

    @property
    def registry(self) -> str:
        """``host:port`` of the cluster's OCI registry on loopback (plain HTTP, no auth)."""
        return f"127.0.0.1:{self.state['ports']['registry']}"

    def _write_registry_config(self) -> None:
        """CNCF distribution's configuration: the filesystem driver, loopback only, plain
        HTTP (the node's containerd is told so: node.py), deletes allowed."""
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self.registry_config.write_text(
            "# Generated by tests/cluster/controlplane.py.\n"
            "version: 0.1\n"
            "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.registry_dir}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.registry}\n"
        )

    def registry_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.registry}/v2/", timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, ValueError, KeyError, ClusterError):
            return False

    def _write_corefile(self) -> None:
        """CoreDNS answers for the cluster domain and the Service range's reverse zone only,
        on 127.0.0.1; any other name is REFUSED (`acl`). The binary has no `forward` plugin
        (coredns/main.go), so no query can leave the machine. Pods reach it through the
        kube-dns Service (node.py relays the node's link to 127.0.0.1)."""
        ports = self.state["ports"]
        self.corefile.write_text(f"""# Generated by tests/cluster/controlplane.py
{CLUSTER_DOMAIN}:{ports['coredns']} {DNS_REVERSE_ZONE}:{ports['coredns']} {{
    bind 127.0.0.1
    errors
    log
    ready 127.0.0.1:{ports['coredns_ready']}
    kubernetes {CLUSTER_DOMAIN} {DNS_REVERSE_ZONE} {{
        kubeconfig {self.component_kubeconfig}
        pods insecure
        ttl 5
    }}
    cache 5
}}
# Any other name: REFUSED (and logged). Without this block CoreDNS refuses such names as well
# (no zone matches) but says nothing about them.
.:{ports['coredns']} {{
    bind 127.0.0.1
    log
    acl {{
        block
    }}
}}
""")

    def coredns_ready(self) -> bool:
        """CoreDNS's /ready: 200 once the kubernetes plugin has synced with the API server."""
        port = self.state["ports"]["coredns_ready"]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def dns_query(self, name: str, qtype: str = "A", timeout: float = 2.0) -> tuple[str, list[str]]:
        """Ask CoreDNS (UDP, on the host) for ``name``: (rcode name, answers as text)."""
        from tests.cluster.dnsquery import query

        return query("127.0.0.1", self.state["ports"]["coredns"], name, qtype, timeout)

    def _apply_dns_service(self) -> None:
        """The kube-dns Service (10.96.0.10:53 UDP and TCP), selector-less, with an
        EndpointSlice at the host end of the real node's link (CoreDNS's port, relayed to
        127.0.0.1 by node.py while the node runs)."""
        port = self.state["ports"]["coredns"]
        labels = {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
        self.apply([
            {
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
                "spec": {
                    "clusterIP": DNS_SERVICE_IP,
                    "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": port},
                              {"name": "dns-tcp", "port": 53, "protocol": "TCP",
                               "targetPort": port}],
                },
            },
            {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {
                    "name": "kube-dns-host", "namespace": "kube-system",
                    "labels": {**labels, "kubernetes.io/service-name": "kube-dns"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [node_host_ip(self.state_dir)],
                               "conditions": {"ready": True}}],
                "ports": [{"name": "dns", "port": port, "protocol": "UDP"},
                          {"name": "dns-tcp", "port": port, "protocol": "TCP"}],
            },
        ])  # fmt: skip

    def recycle_pvs(self) -> list[str]:
        """Make Released static PVs Available again (what a deleter would do). Returns names."""
        pvs = self.kubectl_json("get", "pv", "-l", "spyre.dev/local-pv=true")["items"]
        done = []
        for pv in pvs:
            if pv.get("status", {}).get("phase") in ("Released", "Failed"):
                name = pv["metadata"]["name"]
                res = self.kubectl(
                    "patch", "pv", name, "--type=json",
                    "-p", '[{"op":"remove","path":"/spec/claimRef"}]', check=False,
                )  # fmt: skip
                if res.returncode == 0:
                    done.append(name)
                    self._wipe_pv_dir(name)
        return done

    @staticmethod
    def pv_names() -> list[str]:
        return [f"pv-{i:03d}" for i in range(PV_COUNT_SMALL)] + [
            f"pv-large-{i:03d}" for i in range(PV_COUNT_LARGE)
        ]

    def ensure_pv_dirs(self) -> None:
        """Create the static PVs' hostPath directories (mode 0777) for real pods."""
        for name in self.pv_names():
            d = self.pv_root / name
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o777)

    def _wipe_pv_dir(self, name: str) -> None:
        """Empty a released PV's directory, as a deleter would (the volume is reused)."""
        d = self.pv_root / name
        if not d.is_dir() or d.is_symlink():
            return
        for child in d.iterdir():
            if child.is_dir() and not child.is_symlink():
                subprocess.run(["rm", "-rf", "--one-file-system", str(child)], check=False)
            else:
                child.unlink(missing_ok=True)

    # ------------------------------------------------------------------ service accounts
    def token_kubeconfig(
        self,
        namespace: str,
        serviceaccount: str,
        path: Path | str,
        duration: str = "24h",
        audiences: Iterable[str] = (),
    ) -> Path:
        """Write a kubeconfig that authenticates as ``namespace/serviceaccount`` with a
        token from the TokenRequest API (``kubectl create token``)."""
        args = ["create", "token", serviceaccount, "-n", namespace, f"--duration={duration}"]
        args += [f"--audience={a}" for a in audiences]
        token = self.kubectl(*args).stdout.strip()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        user = f"system:serviceaccount:{namespace}:{serviceaccount}"
        path.write_text(self._kubeconfig_text(user, token, namespace=namespace))
        path.chmod(0o600)
        return path

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"components": {}, "kubeconfig": str(self.kubeconfig)}
        for c in COMPONENTS:
            out["components"][c] = self.pid(c)
        st = self._load_state()
        out["ports"] = st["ports"] if st else None
        out["apiserver_ready"] = bool(st) and self.apiserver_ready()
        out["node"] = self.node.status() if out["apiserver_ready"] else {"pid": self.node.pid()}
        return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    if str(REPO_ROOT) not in sys.path:  # run as a script: make `tests.cluster` importable
        sys.path.insert(0, str(REPO_ROOT))
    from tests.cluster.node import NodeError

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "command",
        choices=("up", "down", "status", "restart", "node-up", "node-down", "node-status",
                 "import-image", "prime-images"),
    )  # fmt: skip
    ap.add_argument("args", nargs="*", help="restart: components; import-image: archives")
    ap.add_argument("--root", default=str(REPO_ROOT), help="repository root (default: this repo)")
    ap.add_argument(
        "--with-node",
        action="store_true",
        default=os.environ.get("SPYRE_REAL_NODE", "") not in ("", "0"),
        help="up: also start the real node (default from SPYRE_REAL_NODE=1)",
    )
    ap.add_argument("--name", help="import-image: also tag the imported image with this name")
    args = ap.parse_args(argv)
    cp = ControlPlane(root=Path(args.root))
    try:
        if args.command == "up":
            t0 = time.monotonic()
            kc = cp.up()
            _log(f"up took {time.monotonic() - t0:.1f}s")
            if args.with_node:
                t1 = time.monotonic()
                cp.node.up()
                _log(f"node up took {time.monotonic() - t1:.1f}s")
            print(kc)
        elif args.command == "down":
            leaks = cp.down()
            if leaks:
                _log("stopped, but the real node left behind: " + "; ".join(leaks))
                return 4
            _log("stopped")
        elif args.command == "restart":
            cp.restart(tuple(args.args) or ("kube-apiserver", "etcd"))
        elif args.command == "node-up":
            t0 = time.monotonic()
            cp.node.up()
            _log(f"node up took {time.monotonic() - t0:.1f}s")
        elif args.command == "node-down":
            leaks = cp.node.down()
            if leaks:
                _log("node stopped, but left behind: " + "; ".join(leaks))
                return 4
            _log("node stopped; nothing left behind")
        elif args.command == "node-status":
            st = cp.node.status()
            for k, v in st.items():
                print(f"{k:24s} {v}")
            return 0 if st.get("ready") else 1
        elif args.command == "prime-images":
            return _prime_images(cp)
        elif args.command == "import-image":
            if not args.args:
                ap.error("import-image needs at least one archive")
            for archive in args.args:
                t0 = time.monotonic()
                names = cp.node.import_image(archive, name=args.name)
                _log(f"imported {archive} in {time.monotonic() - t0:.1f}s")
                for n in names:
                    print(n)
        else:
            st = cp.status()
            for c, pid in st["components"].items():
                print(f"{c:24s} {'running pid ' + str(pid) if pid else 'stopped'}")
            print(f"{'apiserver':24s} {'ready' if st['apiserver_ready'] else 'not ready'}")
            node = st["node"]
            state = "ready" if node.get("ready") else "running" if node.get("pid") else "stopped"
            print(f"{'real node':24s} {state}")
            if st["ports"]:
                print(f"{'ports':24s} {st['ports']}")
            print(f"{'kubeconfig':24s} {st['kubeconfig']}")
            return 0 if st["apiserver_ready"] else 1
    except (ClusterError, NodeError) as e:
        _log(f"error: {e}")
        return 2
    except TimeoutError as e:
        _log(f"error: {e}")
        return 3
    return 0


def _prime_images(cp: ControlPlane) -> int:
    """The set-up's step (``make deps``): the operator and engine images (built, or reused from
    their cache) and the node's base images, into the real node's containerd before the tests
    start the node. Skipped, saying why, where the real node cannot run (not root, packages)."""
    from tests.cluster import ociimage
    from tests.cluster.node import NodeError
    from tests.images import build

    try:  # the node's containerd only: kubelet may still be building beside (make -j2 deps)
        cp.node.check_prerequisites(binaries=False)
    except NodeError as e:
        _log(f"prime-images: skipped, the real node cannot run here: {e}")
        return 0
    archives = [*ociimage.busybox_images(cp.node.image_cache).values(),
                *(build.ensure_image(name).archive for name in ("operator", "engine"))]
    took = cp.node.prime_images([Path(a) for a in archives])
    _log("prime-images: " + ", ".join(f"{name} {secs:.0f}s" for name, secs in took.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
