"""Cluster DNS: CoreDNS (tests/cluster/coredns/, a control-plane process) behind the kube-dns
Service, answering only for the cluster domain; pods on the real node resolve Services, and
the operator's ``status.endpoint``, by name.

Nothing may leave the machine: the binary has no ``forward`` plugin, names outside the
cluster domain are REFUSED, every socket CoreDNS holds is on loopback, and the node has no
default route.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.controlplane import (
    CLUSTER_DOMAIN,
    DNS_SERVICE_IP,
    ControlPlane,
    coredns_bin,
    wait_until,
)
from tests.cluster.node import RealNode

from .conftest import Kube, OperatorProcess
from .test_node import TIMEOUT, container, pod, wait_phase
from .test_operator import spec

pytestmark = pytest.mark.integration

# The page the web pod serves: a token only this run knows.
TOKEN = f"dns-test-{uuid.uuid4().hex[:8]}"
# Names outside the cluster domain; none may be answered, nor asked of anyone else.
OUTSIDE = ("example.com", "huggingface.co")


@pytest.fixture(scope="module")
def dns_ns(control_plane: ControlPlane, real_node: RealNode) -> Iterator[str]:
    """A restricted namespace with a web pod on the real node behind Service ``web`` (80 ->
    8080), and a client pod to run lookups from."""
    ns = f"t-dns-{uuid.uuid4().hex[:6]}"
    labels = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn")}
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": ns, "labels": labels}})
    wait_until(lambda: control_plane.kubectl("get", "serviceaccount", "default", "-n", ns,
                                             check=False).returncode == 0, 30, "default SA")
    web = pod("web", containers=[container(args=[
        "-c", f"mkdir -p /tmp/www && echo {TOKEN} > /tmp/www/index.html && "
              "exec httpd -f -p 8080 -h /tmp/www"])], restartPolicy="Always")
    web["metadata"]["labels"] = {"app": "web"}
    control_plane.apply(web, "-n", ns)
    control_plane.apply({"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": "web", "namespace": ns},
                         "spec": {"selector": {"app": "web"},
                                  "ports": [{"port": 80, "targetPort": 8080}]}})
    control_plane.apply(pod("client"), "-n", ns)
    wait_phase(control_plane, ns, "web", ("Running",))
    wait_phase(control_plane, ns, "client", ("Running",))
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def sh(cp: ControlPlane, ns: str, script: str,
       check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in the namespace's client pod."""
    return cp.kubectl("exec", "-n", ns, "client", "--", "sh", "-c", script, check=check,
                      timeout=60)


def coredns_sockets(cp: ControlPlane) -> list[tuple[str, str, str]]:
    """(protocol, local address, remote address) of every socket CoreDNS holds."""
    pid = cp.pid("coredns")
    assert pid, "CoreDNS is not running"
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        m = re.fullmatch(r"socket:\[(\d+)\]", str(Path(fd).readlink()))
        if m:
            inodes.add(m.group(1))
    out = []
    for proto in ("tcp", "udp", "tcp6", "udp6"):
        for line in Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]:
            f = line.split()
            if f[9] in inodes:
                out.append((proto, _addr(f[1]), _addr(f[2])))
    return out


def _addr(hexaddr: str) -> str:
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    # /proc/net prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{ipaddress.ip_address(words)}:{int(port, 16)}"


# --------------------------------------------------------------------------- tests
def test_coredns_binary_has_only_the_plugins_it_needs() -> None:
    """Built from coredns/main.go: no `forward` (nor any plugin that asks other servers)."""
    out = subprocess.run([str(coredns_bin()), "-plugins"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    plugins = set(out.split())
    ours = {"kubernetes", "bind", "ready", "cache", "errors", "log", "acl"}
    assert ours <= plugins, out
    # Plus what the kubernetes plugin pulls in; none of them sends queries anywhere.
    assert plugins <= ours | {"metadata", "prometheus", "transfer"}, out
    assert "forward" not in plugins


def test_coredns_answers_for_the_cluster_domain_only(control_plane: ControlPlane) -> None:
    cp = control_plane
    kubernetes_ip = cp.kubectl_json("get", "service", "kubernetes", "-n", "default")["spec"][
        "clusterIP"]
    assert cp.dns_query(f"kubernetes.default.svc.{CLUSTER_DOMAIN}") == ("NOERROR",
                                                                        [kubernetes_ip])
    assert cp.dns_query(f"kube-dns.kube-system.svc.{CLUSTER_DOMAIN}") == ("NOERROR",
                                                                          [DNS_SERVICE_IP])
    # Reverse lookups in the Service range.
    ptr = ".".join(reversed(kubernetes_ip.split("."))) + ".in-addr.arpa"
    assert cp.dns_query(ptr, "PTR") == ("NOERROR",
                                        [f"kubernetes.default.svc.{CLUSTER_DOMAIN}."])
    # Unknown names in the domain: NXDOMAIN, answered here.
    assert cp.dns_query(f"nothing.default.svc.{CLUSTER_DOMAIN}")[0] == "NXDOMAIN"
    # Everything else matches no zone: REFUSED at once, asked of no one.
    for name in OUTSIDE:
        assert cp.dns_query(name) == ("REFUSED", []), name
    assert cp.dns_query("8.8.8.8.in-addr.arpa", "PTR") == ("REFUSED", [])


def test_pods_get_cluster_dns(control_plane: ControlPlane, dns_ns: str) -> None:
    resolv = sh(control_plane, dns_ns, "cat /etc/resolv.conf").stdout
    assert f"nameserver {DNS_SERVICE_IP}" in resolv.splitlines(), resolv
    search = next(ln.split()[1:] for ln in resolv.splitlines() if ln.startswith("search"))
    assert search[:3] == [f"{dns_ns}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}",
                          CLUSTER_DOMAIN], resolv
    assert "options ndots:5" in resolv, resolv


def test_pod_reaches_a_service_by_name(control_plane: ControlPlane, dns_ns: str) -> None:
    cp = control_plane
    cluster_ip = cp.kubectl_json("get", "service", "web", "-n", dns_ns)["spec"]["clusterIP"]
    fqdn = f"web.{dns_ns}.svc.{CLUSTER_DOMAIN}"
    out = sh(cp, dns_ns, f"nslookup {fqdn}").stdout
    assert re.search(rf"Name:\s+{re.escape(fqdn)}\s+Address:\s+{re.escape(cluster_ip)}\b", out), out
    # The page through the Service, by its full name, its short name (search path) and the
    # `<svc>.<ns>.svc` form status.endpoint uses; kube-proxy routes to the web pod.
    for name in (fqdn, "web", f"web.{dns_ns}.svc"):
        page = wait_until(
            lambda n=name: sh(cp, dns_ns, f"wget -O- http://{n}/ 2>/dev/null").stdout.strip(),
            TIMEOUT, f"the web page through http://{name}/")
        assert page == TOKEN, (name, page)


def test_status_endpoint_resolves_from_a_pod(control_plane: ControlPlane, kube: Kube,
                                             operator: OperatorProcess,
                                             real_node: RealNode) -> None:
    """The operator's status.endpoint names the model's Service; a pod resolves it to that
    Service's ClusterIP (the pods behind it are kwok's here; tests/realpods send completions
    to status.endpoint on real serving pods)."""
    cp = control_plane
    # A compile shape the plugin's catalog lists (the endpoint is written once it is accepted).
    kube.apply_model("named", spec(compile={"maxModelLen": 3072, "maxNumSeqs": 16}))
    endpoint = kube.wait(lambda: kube.model("named").get("status", {}).get("endpoint"),
                         timeout=90, desc="status.endpoint")
    m = re.fullmatch(r"http://([^/:]+):(\d+)/v1", endpoint)
    assert m, endpoint
    host = m.group(1)
    svc_name, svc_ns = host.split(".")[:2]
    assert svc_ns == kube.ns and host == f"{svc_name}.{kube.ns}.svc"
    svc = wait_until(lambda: kube.get("service", svc_name), 60, f"Service {svc_name}")
    assert int(m.group(2)) in [p["port"] for p in svc["spec"]["ports"]]
    cp.apply(pod("client"), "-n", kube.ns)
    wait_phase(cp, kube.ns, "client", ("Running",))
    # As a client resolves it: the name as written, through the pod's search path; wget says
    # where it connects before it connects. The pods behind the Service are kwok's: nothing
    # answers at their addresses (no reset either), so the connection is given up after 5 s
    # (it would hang until kubectl's own timeout; seen in a full run).
    out = sh(cp, kube.ns, f"timeout 5 wget -O- {endpoint}/models 2>&1", check=False).stdout
    assert f"({svc['spec']['clusterIP']}:{m.group(2)})" in out, out


def test_names_outside_the_cluster_domain_are_refused(control_plane: ControlPlane,
                                                      dns_ns: str) -> None:
    """A pod asking for a name outside the cluster domain gets REFUSED from CoreDNS at once;
    CoreDNS logged the question and its answer, and holds no socket off loopback."""
    cp = control_plane
    log = cp.logs / "coredns.log"
    before = log.stat().st_size
    res = sh(cp, dns_ns, "nslookup example.com", check=False)
    assert res.returncode != 0, res.stdout
    # an answer (REFUSED), not a timeout: CoreDNS answered it and sent it nowhere else
    assert "REFUSED" in res.stdout + res.stderr, res.stdout + res.stderr

    def logged() -> str:
        with log.open() as f:
            f.seek(before)
            lines = [ln for ln in f.read().splitlines() if '"A IN example.com. ' in ln]
        return "\n".join(lines)

    lines = wait_until(logged, 10, "CoreDNS to log the example.com query")
    assert "REFUSED" in lines, lines
    for proto, local, remote in coredns_sockets(cp):
        for addr in (local, remote):
            ip = ipaddress.ip_address(addr.rsplit(":", 1)[0])
            assert ip.is_loopback or ip.is_unspecified, (proto, local, remote)
