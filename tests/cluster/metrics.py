"""Custom metrics for the HPA, the way production clusters serve them.

A real Prometheus (Debian's package, a plain process on the host) scrapes the serving pods'
``/metrics`` on the real node's pod network (the host routes the pod CIDR through the node's
veth). Debian builds Prometheus without Kubernetes service discovery, so the one stand-in is
discovery: a thread here lists the serving pods from the API server every 2 s and writes them
as ``file_sd`` targets (what ``kubernetes_sd_configs`` with ``role: pod``, or the Prometheus
Operator's PodMonitor, does in production). prometheus-adapter (built from its Go module by
``metrics-deps.sh``) serves ``custom.metrics.k8s.io`` from it, registered by an APIService, and
the controller manager's HPA controller reads it through API aggregation. Nothing is faked:
what the HPA sees is what the engines export.

    stack = MetricsStack(cp); stack.up(); ...; stack.down()

The adapter listens on the host end of the node's veth (an address the API server can be
given as an endpoint; loopback cannot be one). ``down`` removes the APIService first: an
aggregated API that does not answer stalls API discovery, and with it namespace deletion.
Processes are recorded under ``.cluster/metrics`` and stopped by ``controlplane.py down``.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

from tests.cluster import background, procs
from tests.cluster.controlplane import (
    REPO_ROOT,
    ControlPlane,
    free_ports,
    node_host_ip,
    wait_until,
)
from tests.cluster.procs import PidFiles

NAMESPACE = "spyre-metrics"
APISERVICE = "v1beta1.custom.metrics.k8s.io"
#: Fast enough for a test to see a scale-up within a minute or two.
SCRAPE_INTERVAL = "5s"
RELIST_INTERVAL = "10s"

#: The adapter rule users need too (docs/reference.md: Autoscaling): vLLM's series, renamed
#: without the colon (custom metric names cannot hold one), summed per pod.
SERIES = (
    '{__name__=~"vllm:(num_requests_waiting|num_requests_running|kv_cache_usage_perc)",'
    'namespace!="",pod!=""}'
)
ADAPTER_RULES = f"""\
rules:
- seriesQuery: '{SERIES}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name:
    matches: "^vllm:(.*)$"
    as: "vllm_${{1}}"
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
"""


def adapter_binary() -> Path:
    """Build (or reuse) prometheus-adapter and install Prometheus; the adapter's path."""
    with background.needed():  # the background build may hold its lock: lift its CPU
        out = subprocess.run(
            [str(REPO_ROOT / "tests/cluster/metrics-deps.sh")],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    return Path(out.stdout.strip().splitlines()[-1])


class MetricsStack:
    """Prometheus + prometheus-adapter + the APIService, for one control plane."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.dir = cp.state_dir / "metrics"
        self.procs = PidFiles(self.dir)
        self.host_ip = node_host_ip(cp.state_dir)
        self._stop = threading.Event()
        self._discovery: threading.Thread | None = None
        #: The last error of the background discovery, if its latest pass failed (a test's
        #: diagnostics show it: a scale-up Prometheus never saw may start there).
        self.discovery_error: BaseException | None = None

    @property
    def prometheus_url(self) -> str:
        return json.loads((self.dir / "ports.json").read_text())["prometheus_url"]

    # ------------------------------------------------------------------ up / down
    def up(self, timeout: float = 180) -> None:
        adapter = adapter_binary()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._start_discovery()
        if self.procs.pid("prometheus") and self.procs.pid("adapter"):
            self._register(json.loads((self.dir / "ports.json").read_text())["adapter"])
            self._wait_served(timeout)
            return
        self.stop_processes()
        prom_port, adapter_port = free_ports(2)
        prom_url = f"http://127.0.0.1:{prom_port}"
        (self.dir / "ports.json").write_text(
            json.dumps({"prometheus": prom_port, "adapter": adapter_port,
                        "prometheus_url": prom_url})
        )  # fmt: skip
        (self.dir / "prometheus.yml").write_text(self._prometheus_config())
        (self.dir / "adapter.yaml").write_text(ADAPTER_RULES)
        self._spawn("prometheus", [
            "/usr/bin/prometheus",
            f"--config.file={self.dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.dir / 'tsdb'}",
            "--storage.tsdb.retention.time=2h",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ])  # fmt: skip
        kc = str(self.cp.kubeconfig)
        self._spawn("adapter", [
            str(adapter),
            f"--prometheus-url={prom_url}/",
            f"--metrics-relist-interval={RELIST_INTERVAL}",
            f"--config={self.dir / 'adapter.yaml'}",
            f"--bind-address={self.host_ip}",
            f"--secure-port={adapter_port}",
            f"--cert-dir={self.dir / 'adapter-certs'}",
            f"--lister-kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--v=1",
        ])  # fmt: skip
        self._register(adapter_port)
        self._wait_served(timeout)

    def _prometheus_config(self) -> str:
        return f"""\
global:
  scrape_interval: {SCRAPE_INTERVAL}
  evaluation_interval: {SCRAPE_INTERVAL}
scrape_configs:
- job_name: spyre-engines
  file_sd_configs:
  - files: [{self.dir / 'targets.json'}]
    refresh_interval: 5s
"""

    # ------------------------------------------------------------------ discovery
    def _start_discovery(self) -> None:
        if self._discovery is not None and self._discovery.is_alive():
            return
        self._stop.clear()
        self.discover()
        self._discovery = threading.Thread(target=self._discover_loop, daemon=True)
        self._discovery.start()

    def _discover_loop(self) -> None:
        while not self._stop.wait(2.0):
            try:
                self.discover()
                self.discovery_error = None
            except Exception as e:  # noqa: BLE001 - the API server may restart; try again
                self.discovery_error = e

    def discover(self) -> list[dict[str, Any]]:
        """Running serving pods -> ``file_sd`` targets (``ip:port`` of the ``metrics`` port, else
        ``http``; labels ``namespace`` and ``pod``), written atomically; returns them."""
        pods = self.cp.kubectl_json(
            "get", "pods", "-A", "-l",
            "app.kubernetes.io/managed-by=spyre-model-operator,"
            "app.kubernetes.io/component=server",
        )["items"]  # fmt: skip
        targets = []
        for p in pods:
            status = p.get("status") or {}
            if status.get("phase") != "Running" or not status.get("podIP"):
                continue
            ports = {port.get("name"): port.get("containerPort") for c in p["spec"]["containers"]
                     for port in c.get("ports") or []}  # fmt: skip
            # the chart's PodMonitor does the same: `metrics` where serving.metricsPort is set
            port = ports.get("metrics") or ports.get("http")
            if port:
                targets.append({
                    "targets": [f"{status['podIP']}:{port}"],
                    "labels": {"namespace": p["metadata"]["namespace"],
                               "pod": p["metadata"]["name"]},
                })  # fmt: skip
        tmp = self.dir / "targets.json.tmp"
        tmp.write_text(json.dumps(targets))
        tmp.replace(self.dir / "targets.json")
        return targets

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.cp.logs / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.dir,
        )  # fmt: skip
        self.procs.record(name, proc.pid)

    def _register(self, port: int) -> None:
        objs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "prometheus-adapter", "namespace": NAMESPACE},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
            },
            {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {
                    "name": "prometheus-adapter", "namespace": NAMESPACE,
                    "labels": {"kubernetes.io/service-name": "prometheus-adapter"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [self.host_ip],
                               "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
            {
                "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "service": {"namespace": NAMESPACE, "name": "prometheus-adapter",
                                "port": 443},
                    "group": "custom.metrics.k8s.io", "version": "v1beta1",
                    # the adapter's self-signed certificate (its --cert-dir)
                    "insecureSkipTLSVerify": True,
                    "groupPriorityMinimum": 100, "versionPriority": 100,
                },
            },
        ]  # fmt: skip
        self.cp.apply(objs)

    def _wait_served(self, timeout: float) -> None:
        def available() -> bool:
            for name in ("prometheus", "adapter"):
                if not self.procs.pid(name):
                    raise RuntimeError(
                        f"{name} exited; see {self.cp.logs / (name + '.log')}"
                    )
            svc = self.cp.kubectl_json("get", "apiservice", APISERVICE)
            conds = (svc.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Available" and c["status"] == "True" for c in conds):
                return False
            # and served through the aggregator (discovery of the group)
            return self.cp.kubectl("get", "--raw", "/apis/custom.metrics.k8s.io/v1beta1",
                                   check=False).returncode == 0

        wait_until(available, timeout, f"APIService {APISERVICE} Available")

    def custom_metric(self, namespace: str, metric: str) -> dict[str, float]:
        """Per-pod values the HPA would read: ``{pod: value}`` (empty when not served yet)."""
        try:
            out = json.loads(self.cp.kubectl(
                "get", "--raw",
                f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/{metric}",
            ).stdout)  # fmt: skip
        except Exception:  # noqa: BLE001 - not served yet (no series, relist pending)
            return {}
        return {
            i["describedObject"]["name"]: _quantity(i["value"]) for i in out.get("items") or []
        }

    def down(self) -> None:
        """Unregister the API first (see the module doc), then stop the processes."""
        try:
            self.cp.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found",
                            "--wait=false")  # fmt: skip
            self.cp.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found",
                            "--wait=false")  # fmt: skip
        except Exception:  # noqa: BLE001 - the API server may be gone already
            pass
        self._stop.set()
        if self._discovery is not None:
            self._discovery.join(10)
        self.stop_processes()

    def stop_processes(self) -> None:
        self.procs.stop(("adapter", "prometheus"))


def _quantity(v: str) -> float:
    if v.endswith("m"):
        return float(v[:-1]) / 1000
    if v.endswith("k"):
        return float(v[:-1]) * 1000
    return float(v)


def stop_leftovers(state_dir: Path) -> None:
    """Stop the metrics processes of a cluster being torn down (no API calls)."""
    procs.stop_leftovers(state_dir / "metrics")
