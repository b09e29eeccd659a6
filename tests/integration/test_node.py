"""The real node (issue 10, part 1): kubelet + containerd in the local cluster, real pods.

The node is ``spyre-real-0`` (label and taint ``spyre.dev/real-node=true``), beside the kwok
nodes. Its pods run the busybox image built on this machine (tests/cluster/ociimage.py).
The last test stops the node, checks that nothing is left on the host, and starts it again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import ociimage
from tests.cluster.controlplane import (
    DNS_SERVICE_IP,
    REPO_ROOT,
    ControlPlane,
    node_slot,
    wait_until,
)
from tests.cluster.node import (
    NODE_LABEL,
    NODE_SELECTOR,
    NODE_TOLERATION,
    SPYRE_CARDS,
    RealNode,
    host_snapshot,
    node_cgroup_dirs,
    running_nodes,
)

pytestmark = pytest.mark.integration

TIMEOUT = 90


def container(name: str = "main", image: str | None = None, **extra: Any) -> dict[str, Any]:
    """A container that passes PodSecurity 'restricted', running the local busybox image."""
    c: dict[str, Any] = {
        "name": name,
        "image": image or ociimage.busybox_image(),
        "imagePullPolicy": "Never",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    c.update(extra)
    return c


def pod(name: str, *, on_real_node: bool = True, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container(args=["-c", "echo started; exec sleep 3600"])],
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": "Never",
    }
    if on_real_node:
        s["nodeSelector"] = dict(NODE_SELECTOR)
        s["tolerations"] = [dict(NODE_TOLERATION)]
    s.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": s}


def get_pod(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return cp.kubectl_json("get", "pod", name, "-n", ns)  # type: ignore[no-any-return]


def wait_phase(cp: ControlPlane, ns: str, name: str, phases: tuple[str, ...]) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def ok() -> bool:
        p = get_pod(cp, ns, name)
        box.update(p)
        return p["status"].get("phase") in phases

    try:
        wait_until(ok, TIMEOUT, f"pod {name} {'/'.join(phases)}", 0.5)
    except TimeoutError as e:
        raise AssertionError(f"{e}: status {json.dumps(box.get('status'), indent=1)}") from None
    return box


def delete_pod(cp: ControlPlane, ns: str, name: str) -> None:
    cp.kubectl("delete", "pod", name, "-n", ns, "--ignore-not-found", "--grace-period=0",
               "--force", "--wait=true", timeout=TIMEOUT)


@pytest.fixture(scope="module")
def node_ns(control_plane: ControlPlane, real_node: RealNode) -> Iterator[str]:
    """A restricted namespace for this module's pods."""
    name = f"t-real-node-{uuid.uuid4().hex[:6]}"
    labels = {f"pod-security.kubernetes.io/{m}": "restricted" for m in ("enforce", "warn")}
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": name, "labels": labels}})
    wait_until(lambda: control_plane.kubectl("get", "serviceaccount", "default", "-n", name,
                                             check=False).returncode == 0, 30, "default SA")
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def shell_pod(control_plane: ControlPlane, node_ns: str) -> str:
    """A long-running busybox pod on the real node."""
    control_plane.apply(pod("shell"), "-n", node_ns)
    wait_phase(control_plane, node_ns, "shell", ("Running",))
    return "shell"


# --------------------------------------------------------------------------- tests
def test_node_registers_ready_with_spyre_cards(control_plane: ControlPlane,
                                               real_node: RealNode) -> None:
    n = control_plane.kubectl_json("get", "node", real_node.name)
    conds = {c["type"]: c["status"] for c in n["status"]["conditions"]}
    assert conds["Ready"] == "True"
    labels = n["metadata"]["labels"]
    kwok = control_plane.kubectl_json("get", "node", "spyre-node-0")["metadata"]["labels"]
    for k in ("ibm.com/spyre.present", "ibm.com/spyre.product"):
        assert labels[k] == kwok[k]
    assert labels["ibm.com/spyre.count"] == str(SPYRE_CARDS)
    assert labels[NODE_LABEL] == "true"
    assert "kwok.x-k8s.io/node" not in n["metadata"].get("annotations", {})
    assert {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"} in n["spec"]["taints"]
    for field in ("capacity", "allocatable"):
        assert n["status"][field]["ibm.com/spyre_vf"] == str(SPYRE_CARDS)
        assert n["status"][field]["ibm.com/spyre_pf"] == str(SPYRE_CARDS)
    addrs = {a["type"]: a["address"] for a in n["status"]["addresses"]}
    assert addrs["InternalIP"] == real_node.node_ip
    info = n["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6")
    # The kwok nodes are still there and Ready.
    for name in ("spyre-node-0", "spyre-node-1", "cpu-node-0"):
        k = control_plane.kubectl_json("get", "node", name)
        assert {c["type"]: c["status"] for c in k["status"]["conditions"]}["Ready"] == "True"


def test_pod_runs_and_logs_are_readable(control_plane: ControlPlane, node_ns: str,
                                        shell_pod: str) -> None:
    p = get_pod(control_plane, node_ns, shell_pod)
    assert p["spec"]["nodeName"] == "spyre-real-0"
    st = p["status"]["containerStatuses"][0]
    assert st["containerID"].startswith("containerd://")
    assert st["ready"] is True
    assert p["status"]["podIP"].startswith(f"10.245.{control_plane.node.slot}.")
    logs = control_plane.kubectl("logs", "-n", node_ns, shell_pod).stdout
    assert "started" in logs


def test_exec_in_pod(control_plane: ControlPlane, node_ns: str, shell_pod: str) -> None:
    out = control_plane.kubectl("exec", "-n", node_ns, shell_pod, "--", "sh", "-c",
                                "id -u; cat /proc/1/cmdline | tr '\\0' ' '").stdout
    uid, cmd = out.splitlines()[:2]
    assert uid == "65532"
    assert "sleep 3600" in cmd


def test_pod_reaches_api_server_through_kubernetes_service(
    control_plane: ControlPlane, node_ns: str, shell_pod: str
) -> None:
    svc = control_plane.kubectl_json("get", "service", "kubernetes", "-n", "default")
    cluster_ip = svc["spec"]["clusterIP"]
    env = control_plane.kubectl("exec", "-n", node_ns, shell_pod, "--", "env").stdout
    assert f"KUBERNETES_SERVICE_HOST={cluster_ip}" in env
    # Through the ClusterIP (kube-proxy's rules in the node): a TCP connect, then HTTPS GETs
    # that verify the server against the cluster CA and send the pod's service-account token
    # (https-get: busybox's own TLS shares no cipher suite with the Go API server).
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    get = f"https-get -cacert {sa}/ca.crt -token {sa}/token https://{cluster_ip}"
    script = (
        f"echo | timeout 5 nc {cluster_ip} 443 >/dev/null && echo tcp-ok; "
        f"{get}/version; {get}/readyz; "
        f"{get}/api/v1/namespaces/{node_ns}/serviceaccounts/default; echo rc=$?"
    )
    out = control_plane.kubectl("exec", "-n", node_ns, shell_pod, "--", "sh", "-c", script,
                                timeout=60).stdout
    assert "tcp-ok" in out, out
    assert '"gitVersion": "v1.36.3"' in out, out
    assert "HTTP 200\nok" in out, out  # /readyz
    # Authenticated as system:serviceaccount:<ns>:default, which RBAC lets read nothing.
    assert "HTTP 403" in out and f'system:serviceaccount:{node_ns}:default' in out, out
    assert out.rstrip().endswith("rc=1"), out


def test_pods_have_no_route_off_the_machine(control_plane: ControlPlane, node_ns: str,
                                            shell_pod: str) -> None:
    out = control_plane.kubectl("exec", "-n", node_ns, shell_pod, "--", "sh", "-c",
                                "ip route; echo ---; cat /etc/resolv.conf").stdout
    routes, resolv = out.split("---")
    assert "default" not in routes, routes
    # Cluster DNS (test_dns.py): the kube-dns Service, which answers only for the cluster.
    assert resolv.split("nameserver")[1].split()[0] == DNS_SERVICE_IP, resolv
    # Sending anywhere else fails at once: there is no route (nothing is sent). The kernel's
    # answer says so (a timeout would say nothing: `timeout` only bounds a hang).
    res = control_plane.kubectl("exec", "-n", node_ns, shell_pod, "--", "sh", "-c",
                                "echo | timeout 5 nc 192.0.2.1 80", check=False)
    assert res.returncode != 0
    assert "network is unreachable" in (res.stdout + res.stderr).lower(), res


def test_spyre_pod_is_placed_on_real_node_by_spyre_scheduler(
    control_plane: ControlPlane, node_ns: str
) -> None:
    spec = pod("spyre", schedulerName="spyre-scheduler")
    spec["spec"]["containers"][0]["resources"] = {
        "requests": {"ibm.com/spyre_vf": "1"}, "limits": {"ibm.com/spyre_vf": "1"}}
    control_plane.apply(spec, "-n", node_ns)
    try:
        p = wait_phase(control_plane, node_ns, "spyre", ("Running",))
        assert p["spec"]["nodeName"] == "spyre-real-0"
        assert p["spec"]["schedulerName"] == "spyre-scheduler"
        events = control_plane.kubectl("get", "events", "-n", node_ns, "--field-selector",
                                       "involvedObject.name=spyre,reason=Scheduled",
                                       "-o", "json")
        msgs = [e.get("message", "") + " " + e.get("reportingController", "") +
                e.get("source", {}).get("component", "")
                for e in json.loads(events.stdout)["items"]]
        assert any("spyre-real-0" in m for m in msgs), msgs
        assert p["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    finally:
        delete_pod(control_plane, node_ns, "spyre")


def test_card_accounting_is_real(control_plane: ControlPlane, node_ns: str) -> None:
    def cards_pod(name: str, n: int) -> dict[str, Any]:
        spec = pod(name, schedulerName="spyre-scheduler")
        spec["spec"]["containers"][0]["resources"] = {
            "requests": {"ibm.com/spyre_vf": str(n)}, "limits": {"ibm.com/spyre_vf": str(n)}}
        return spec

    def pending_insufficient(name: str) -> bool:
        p = get_pod(control_plane, node_ns, name)
        conds = {c["type"]: c for c in p["status"].get("conditions", [])}
        sched = conds.get("PodScheduled", {})
        return (not p["spec"].get("nodeName") and sched.get("status") == "False"
                and "Insufficient ibm.com/spyre_vf" in sched.get("message", ""))

    try:
        control_plane.apply(cards_pod("too-many", SPYRE_CARDS + 1), "-n", node_ns)
        control_plane.apply(cards_pod("five", 5), "-n", node_ns)
        wait_phase(control_plane, node_ns, "five", ("Running",))
        control_plane.apply(cards_pod("four", 4), "-n", node_ns)
        wait_until(lambda: pending_insufficient("four"), TIMEOUT, "four cards Pending", 0.5)
        assert pending_insufficient("too-many")
        delete_pod(control_plane, node_ns, "five")
        # The cards are free again: the waiting pod gets them and runs.
        wait_phase(control_plane, node_ns, "four", ("Running",))
        assert pending_insufficient("too-many")
    finally:
        for name in ("too-many", "five", "four"):
            delete_pod(control_plane, node_ns, name)


def test_pods_without_the_toleration_stay_on_kwok_nodes(control_plane: ControlPlane,
                                                         node_ns: str) -> None:
    spec = pod("kwok-bound", on_real_node=False, schedulerName="spyre-scheduler")
    spec["spec"]["containers"][0]["resources"] = {
        "requests": {"ibm.com/spyre_vf": "1"}, "limits": {"ibm.com/spyre_vf": "1"}}
    control_plane.apply(spec, "-n", node_ns)

    def decided() -> dict[str, Any] | None:
        p = get_pod(control_plane, node_ns, "kwok-bound")
        conds = {c["type"]: c for c in p["status"].get("conditions", [])}
        return p if p["spec"].get("nodeName") or conds.get("PodScheduled", {}).get(
            "status") == "False" else None

    try:
        p = wait_until(decided, TIMEOUT, "kwok-bound scheduled or unschedulable", 0.5)
        if p["spec"].get("nodeName"):
            assert p["spec"]["nodeName"] in ("spyre-node-0", "spyre-node-1")
        else:  # the kwok nodes' cards are taken by earlier tests: the real node's taint counts
            msg = {c["type"]: c for c in p["status"]["conditions"]}["PodScheduled"]["message"]
            assert "untolerated taint" in msg and NODE_LABEL in msg, msg
    finally:
        delete_pod(control_plane, node_ns, "kwok-bound")


def test_import_image_cli(control_plane: ControlPlane, real_node: RealNode, node_ns: str,
                          tmp_path: Path) -> None:
    name = f"localhost/spyre-import-test:{uuid.uuid4().hex[:8]}"
    layer = ociimage._busybox_layer()
    archive = ociimage.write_oci_archive(tmp_path / "img.tar", name, layer,
                                         ["/bin/sh", "-c", "echo imported-image-runs"])
    res = subprocess.run([sys.executable, str(REPO_ROOT / "tests/cluster/controlplane.py"),
                          "import-image", str(archive)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert name in res.stdout.split()
    assert name in real_node.images()
    # Layer blobs are dropped once unpacked; a second import of the same archive is a no-op.
    assert real_node.import_image(archive) == [name]
    assert real_node.import_image(archive, name=name + "-again") == [name, name + "-again"]
    assert name + "-again" in real_node.images()
    real_node.ctr("images", "remove", name + "-again")
    spec = pod("imported")
    spec["spec"]["containers"] = [container(image=name)]
    control_plane.apply(spec, "-n", node_ns)
    try:
        wait_phase(control_plane, node_ns, "imported", ("Succeeded",))
        assert "imported-image-runs" in control_plane.kubectl(
            "logs", "-n", node_ns, "imported").stdout
    finally:
        delete_pod(control_plane, node_ns, "imported")
        real_node.ctr("images", "remove", name, check=False)


def test_pod_writes_to_a_static_pv(control_plane: ControlPlane, node_ns: str) -> None:
    """Real pods (non-root) use the cluster's static hostPath PVs through claims."""
    control_plane.apply({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }, "-n", node_ns)  # fmt: skip
    spec = pod("writer", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}])
    spec["spec"]["containers"] = [container(
        args=["-c", "echo written-by-$(id -u) > /data/f && cat /data/f"],
        volumeMounts=[{"name": "d", "mountPath": "/data"}],
    )]  # fmt: skip
    control_plane.apply(spec, "-n", node_ns)
    try:
        wait_phase(control_plane, node_ns, "writer", ("Succeeded",))
        pvc = control_plane.kubectl_json("get", "pvc", "data", "-n", node_ns)
        path = control_plane.pv_root / pvc["spec"]["volumeName"] / "f"
        assert path.read_text().strip() == "written-by-65532"
        assert "written-by-65532" in control_plane.kubectl("logs", "-n", node_ns, "writer").stdout
    finally:
        delete_pod(control_plane, node_ns, "writer")
        control_plane.kubectl("delete", "pvc", "data", "-n", node_ns, "--wait=false")


@pytest.mark.slow
def test_zz_down_leaves_nothing_behind(control_plane: ControlPlane, real_node: RealNode,
                                       shell_pod: str) -> None:
    """With pods running: (1) `node-down` of the session's node, (2) a whole second cluster
    with its real node in its own root, stopped by `down` (what `make cluster-down` runs).
    Neither leaves a process, mount, network namespace, link, iptables rule, cgroup or
    sysctl change behind. Then the session's node is started again for whoever is next."""
    baseline = json.loads(real_node.baseline_file.read_text())
    assert real_node.host_if in host_snapshot()["links"]
    script = str(REPO_ROOT / "tests/cluster/controlplane.py")

    def check_clean(node: RealNode, root: Path) -> None:
        now = host_snapshot(node.cgroup_name)
        others = node.other_nodes()  # other checkouts' nodes (their kubelets set sysctls too)
        for key in ("cgroups", "paths") + (() if others else ("sysctls",)):
            assert now[key] == baseline[key], (key, baseline[key], now[key])
        # (Other jobs on the machine may add mounts, links or rules meanwhile; leaks()
        # counts what can be ours: processes, cgroups, mounts, links, netns, iptables,
        # sysctls, paths.)
        assert node.leaks(baseline, sysctls=not others) == []
        assert not {node.host_if, node.node_if, "spyre-cni0"} & set(now["links"])
        assert not [m for m in now["mounts"] if str(root) in m]

    # (1) the node alone
    res = subprocess.run([sys.executable, script, "node-down"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    check_clean(real_node, control_plane.root)
    assert real_node.pid() is None and real_node.forward_pid() is None
    assert control_plane.kubectl("get", "node", real_node.name, check=False).returncode != 0

    # (2) a second cluster + node in its own (short: unix socket paths) root, then `down`
    used = {real_node.slot} | {int(c.rsplit("-", 1)[1]) for c in running_nodes()}
    while True:
        root = Path(tempfile.mkdtemp(prefix="spyre-cp-", dir="/tmp"))
        if node_slot(root / ".cluster") not in used:
            break
        root.rmdir()
    other = ControlPlane(root=root)
    try:
        res = subprocess.run([sys.executable, script, "--root", str(root), "up", "--with-node"],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        other.apply(pod("p"), "-n", "default")
        wait_phase(other, "default", "p", ("Running",))
        assert other.node.owner() == str(other.node.dir)
        res = subprocess.run([sys.executable, script, "--root", str(root), "down"],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr  # exit 4 would list leftovers
        check_clean(other.node, root)
        assert not other.pv_root.exists()
        assert not any(other.pid(c) for c in ("etcd", "kube-apiserver"))
    finally:
        subprocess.run([sys.executable, script, "--root", str(root), "down"],
                       capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)

    # A dead node's empty cgroups (a `down` that could not remove them in time, a checkout
    # deleted without one) are not the host's state: `up` removes them before its baseline.
    stale = [d for d in node_cgroup_dirs(real_node.cgroup_name) if d.parent.is_dir()]
    for d in stale:
        d.mkdir()
    real_node.up()
    assert real_node.ready()
    assert stale and json.loads(real_node.baseline_file.read_text())["cgroups"] == []
