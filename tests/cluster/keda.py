"""KEDA and its HTTP add-on on the local cluster, the way a production cluster runs them.

KEDA v2.21.0 (operator, metrics apiserver) and the HTTP add-on v0.12.0 (operator, external
scaler, interceptor), built from their Go modules by ``keda-deps.sh``, run as plain processes
like prometheus-adapter (``metrics.py``), but **inside the real node's network namespace**: the
add-on dials Services by name (the interceptor forwards to ``<service>.<namespace>:<port>``,
KEDA's operator dials the scaler's address), so they need what a pod has: kube-proxy's rules
for ClusterIPs and cluster DNS. Each process gets a private mount namespace whose
``/etc/resolv.conf`` is a pod's (CoreDNS at 10.96.0.10, the ``keda`` namespace's search list).

In-cluster names point at them the way the stock Helm charts name them, through selector-less
Services whose EndpointSlices hold the node's IP:

* ``keda-add-ons-http-interceptor-proxy`` (8080): where requests for scaled apps go;
* ``keda-add-ons-http-interceptor-admin`` (9090): the scaler reads the pending counts there;
* ``keda-add-ons-http-external-scaler`` (9090): KEDA's operator streams ``IsActive`` from it;
* ``keda-metrics-apiserver`` (443) behind the APIService ``v1beta1.external.metrics.k8s.io``
  (what KEDA's HPA reads for 1..N).

KEDA's operator and metrics apiserver talk over mutual TLS, always: a CA and one pair made
here with openssl (``--enable-cert-rotation=false --cert-dir``).

    stack = KedaStack(cp); stack.up(); ...; stack.down()

``down`` removes the APIService first (an aggregated API that does not answer stalls API
discovery, and with it namespace deletion). Processes are recorded under ``.cluster/keda``;
``stop_leftovers`` stops them when the cluster goes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import background, procs
from tests.cluster.controlplane import REPO_ROOT, ControlPlane, wait_until
from tests.cluster.procs import PidFiles

NAMESPACE = "keda"
APISERVICE = "v1beta1.external.metrics.k8s.io"
#: The in-cluster Services (named like the stock charts') and the ports they expose.
INTERCEPTOR_PROXY = "keda-add-ons-http-interceptor-proxy"
INTERCEPTOR_ADMIN = "keda-add-ons-http-interceptor-admin"
EXTERNAL_SCALER = "keda-add-ons-http-external-scaler"
METRICS_APISERVER = "keda-metrics-apiserver"
PROXY_PORT, ADMIN_PORT, SCALER_PORT = 8080, 9090, 9090
#: Ports the processes listen on in the node's network namespace (nothing else binds there
#: but the kubelet, kube-proxy and containerd, on their own well-known ports).
LISTEN = {
    "interceptor-proxy": 18080, "interceptor-admin": 18090, "interceptor-metrics": 18223,
    "scaler": 18091, "http-operator-metrics": 18180, "http-operator-health": 18181,
    "keda-metrics": 18280, "keda-health": 18281, "keda-grpc": 18666,
    "adapter": 18443, "adapter-metrics": 18380,
}  # fmt: skip
#: How long the interceptor holds a request while a workload is at zero, unless the route says
#: otherwise (HTTPScaledObject spec.timeouts.conditionWait). The add-on's default is 1.5 s.
CONDITION_WAIT = "120s"
PROCESSES = ("keda", "keda-adapter", "http-operator", "http-scaler", "http-interceptor")


def keda_dir() -> Path:
    """Build (or reuse) the five binaries and the CRDs; their directory."""
    with background.needed():  # the background build may hold its lock: lift its CPU
        out = subprocess.run(
            [str(REPO_ROOT / "tests/cluster/keda-deps.sh")], check=True, capture_output=True,
            text=True,
        )  # fmt: skip
    return Path(out.stdout.strip().splitlines()[-1])


class KedaStack:
    """KEDA + the HTTP add-on for one control plane with its real node running."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.node = cp.node
        self.dir = cp.state_dir / "keda"
        self.procs = PidFiles(self.dir)

    # ------------------------------------------------------------------ state
    def running(self) -> bool:
        return all(self.procs.pid(n) for n in PROCESSES)

    # ------------------------------------------------------------------ up / down
    def up(self, timeout: float = 120) -> None:
        bins = keda_dir()
        node_pid = self.node.pid()
        if node_pid is None:
            raise RuntimeError("KEDA runs in the real node's network namespace: start the node")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._apply_crds(bins / "crds")
        self._register()
        if self.running():
            self._wait_ready(timeout)
            return
        self.stop_processes()
        self._write_files()
        env = {
            "KUBECONFIG": str(self.dir / "kubeconfig"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.dir),
        }
        ns, port = NAMESPACE, LISTEN
        self._spawn(node_pid, "keda", env | {
            "WATCH_NAMESPACE": "", "POD_NAMESPACE": ns, "KEDA_CLUSTER_OBJECT_NAMESPACE": ns,
        }, [
            str(bins / "keda"),
            f"--metrics-bind-address=127.0.0.1:{port['keda-metrics']}",
            f"--health-probe-bind-address=127.0.0.1:{port['keda-health']}",
            f"--metrics-service-bind-address=127.0.0.1:{port['keda-grpc']}",
            f"--cert-dir={self.dir / 'certs'}", "--enable-cert-rotation=false",
            "--leader-elect=false", "--zap-log-level=info",
        ])  # fmt: skip
        self._spawn(node_pid, "keda-adapter", env | {"WATCH_NAMESPACE": "", "POD_NAMESPACE": ns}, [
            str(bins / "keda-adapter"),
            f"--secure-port={port['adapter']}",
            f"--port={port['adapter-metrics']}",
            f"--cert-dir={self.dir / 'adapter-certs'}",
            f"--metrics-service-address=127.0.0.1:{port['keda-grpc']}",
            "--metrics-service-grpc-authority=localhost",
            f"--lister-kubeconfig={self.dir / 'kubeconfig'}",
            f"--authentication-kubeconfig={self.dir / 'kubeconfig'}",
            f"--authorization-kubeconfig={self.dir / 'kubeconfig'}",
            "--v=1",
        ])  # fmt: skip
        self._spawn(node_pid, "http-operator", env | {
            "KEDAHTTP_OPERATOR_EXTERNAL_SCALER_SERVICE": EXTERNAL_SCALER,
            "KEDAHTTP_OPERATOR_EXTERNAL_SCALER_PORT": str(SCALER_PORT),
            "KEDA_HTTP_OPERATOR_NAMESPACE": ns, "KEDA_HTTP_OPERATOR_WATCH_NAMESPACE": "",
        }, [
            str(bins / "http-operator"),
            f"--metrics-bind-address=127.0.0.1:{port['http-operator-metrics']}",
            f"--health-probe-bind-address=127.0.0.1:{port['http-operator-health']}",
        ])  # fmt: skip
        self._spawn(node_pid, "http-scaler", env | {
            "KEDA_HTTP_SCALER_PORT": str(port["scaler"]),
            "KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE": ns,
            "KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE": INTERCEPTOR_ADMIN,
            "KEDA_HTTP_SCALER_TARGET_ADMIN_DEPLOYMENT": INTERCEPTOR_ADMIN,
            "KEDA_HTTP_SCALER_TARGET_ADMIN_PORT": str(port["interceptor-admin"]),
        }, [str(bins / "http-scaler")])  # fmt: skip
        self._spawn(node_pid, "http-interceptor", env | {
            "KEDA_HTTP_CURRENT_NAMESPACE": ns, "KEDA_HTTP_WATCH_NAMESPACE": "",
            "KEDA_HTTP_PROXY_PORT": str(port["interceptor-proxy"]),
            "KEDA_HTTP_ADMIN_PORT": str(port["interceptor-admin"]),
            "OTEL_PROM_EXPORTER_PORT": str(port["interceptor-metrics"]),
            "KEDA_CONDITION_WAIT_TIMEOUT": CONDITION_WAIT,
        }, [str(bins / "http-interceptor")])  # fmt: skip
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.down()
            raise

    def _apply_crds(self, crds: Path) -> None:
        # server-side: KEDA's ScaledJob CRD is too large for client-side apply's annotation
        files = sorted(crds.glob("*/*.yaml"))
        self.cp.kubectl("apply", "--server-side", "--force-conflicts",
                        *[a for f in files for a in ("-f", str(f))])  # fmt: skip

    def _write_files(self) -> None:
        """The kubeconfig (the API server as the node reaches it), pod-like resolv.conf, certs."""
        kc = yaml.safe_load(self.cp.kubeconfig.read_text())
        api = self.cp.state["ports"]["apiserver"]
        for c in kc["clusters"]:
            c["cluster"]["server"] = f"https://{self.node.host_ip}:{api}"
        (self.dir / "kubeconfig").write_text(yaml.safe_dump(kc))
        (self.dir / "kubeconfig").chmod(0o600)
        (self.dir / "resolv.conf").write_text(
            f"nameserver 10.96.0.10\nsearch {NAMESPACE}.svc.cluster.local svc.cluster.local "
            "cluster.local\noptions ndots:5 timeout:1 attempts:2\n"
        )
        certs = self.dir / "certs"
        if not (certs / "tls.crt").exists():
            self._make_certs(certs)
        adapter = self.dir / "adapter-certs"
        adapter.mkdir(exist_ok=True)
        for f in ("ca.crt", "tls.crt", "tls.key"):
            (adapter / f).write_bytes((certs / f).read_bytes())

    @staticmethod
    def _make_certs(d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)

        def ssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

        ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
            "-subj", "/CN=keda-local-ca")  # fmt: skip
        ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=localhost")  # fmt: skip
        (d / "ext.cnf").write_text(
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
            "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n"
        )
        ssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "tls.crt", "-days", "3650",
            "-extfile", "ext.cnf")  # fmt: skip

    def _spawn(self, node_pid: int, name: str, env: dict[str, str], argv: list[str]) -> None:
        """``argv`` in the node's network namespace, with a pod's resolv.conf."""
        log = open(self.cp.logs / f"keda-{name}.log", "ab")  # noqa: SIM115 - owned by the child
        wrapped = [
            "nsenter", f"--net=/proc/{node_pid}/ns/net", "--",
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"',
            str(self.dir / "resolv.conf"), *argv,
        ]  # fmt: skip
        proc = subprocess.Popen(
            wrapped, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.dir,
        )  # fmt: skip
        log.close()
        self.procs.record(name, proc.pid)

    def _register(self) -> None:
        ip = self.node.node_ip

        def exposed(name: str, port: int, target: int) -> list[dict[str, Any]]:
            return [
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": name, "namespace": NAMESPACE},
                 "spec": {"ports": [{"name": "main", "port": port, "targetPort": target}]}},
                {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": name, "namespace": NAMESPACE,
                              "labels": {"kubernetes.io/service-name": name}},
                 "addressType": "IPv4",
                 "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
                 "ports": [{"name": "main", "port": target, "protocol": "TCP"}]},
            ]  # fmt: skip

        objs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            *exposed(INTERCEPTOR_PROXY, PROXY_PORT, LISTEN["interceptor-proxy"]),
            *exposed(INTERCEPTOR_ADMIN, ADMIN_PORT, LISTEN["interceptor-admin"]),
            *exposed(EXTERNAL_SCALER, SCALER_PORT, LISTEN["scaler"]),
            *exposed(METRICS_APISERVER, 443, LISTEN["adapter"]),
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": APISERVICE},
             "spec": {"service": {"namespace": NAMESPACE, "name": METRICS_APISERVER,
                                  "port": 443},
                      "group": "external.metrics.k8s.io", "version": "v1beta1",
                      "insecureSkipTLSVerify": True,  # the adapter's own certificate
                      "groupPriorityMinimum": 100, "versionPriority": 100}},
        ]  # fmt: skip
        self.cp.apply(objs)

    def _wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            for name in PROCESSES:
                if not self.procs.pid(name):
                    raise RuntimeError(
                        f"{name} exited; see {self.cp.logs / ('keda-' + name + '.log')}"
                    )
            svc = self.cp.kubectl_json("get", "apiservice", APISERVICE)
            conds = (svc.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Available" and c["status"] == "True" for c in conds)

        wait_until(ready, timeout, "KEDA's processes running and its APIService Available")

    def down(self) -> None:
        """Unregister the API first (see the module doc), then stop the processes."""
        try:
            self.cp.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found",
                            "--wait=false")  # fmt: skip
        except Exception:  # noqa: BLE001 - the API server may be gone already
            pass
        self.stop_processes()

    def stop_processes(self) -> None:
        self.procs.stop(PROCESSES)


#: The Service in front of an operator process's cold-start responder (``--coldstart-port``).
COLDSTART_SERVICE, COLDSTART_SERVICE_PORT = "spyre-coldstart", 8082


def host_coldstart_service(cp: ControlPlane, namespace: str, host_ip: str, port: int) -> str:
    """A Service in ``namespace`` for the cold-start responder of an operator running on the
    host (listening on ``port``): an EndpointSlice naming ``host_ip``, the host's address on
    the real node's link (what the chart's ``<release>-coldstart`` Service is to the operator's
    pods). Returns the operator's ``--coldstart-service`` value."""
    name, svc_port = COLDSTART_SERVICE, COLDSTART_SERVICE_PORT
    cp.apply({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
        "spec": {"ports": [{"name": "http", "port": svc_port, "targetPort": port}]}})  # fmt: skip
    cp.apply({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{name}-host", "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}]})  # fmt: skip
    return f"{namespace}/{name}:{svc_port}"


def coldstart_args(port: int) -> Callable[[str], list[str]]:
    """The operator's flags, for a namespace, to serve its cold-start responder on host
    ``port`` behind :func:`host_coldstart_service` (RealEnv's ``operator_args``)."""
    return lambda ns: ["--coldstart-port", str(port), "--coldstart-service",
                       f"{ns}/{COLDSTART_SERVICE}:{COLDSTART_SERVICE_PORT}"]  # fmt: skip


def stop_leftovers(state_dir: Path) -> None:
    """Stop KEDA's processes of a cluster being torn down (no API calls)."""
    procs.stop_leftovers(state_dir / "keda")
