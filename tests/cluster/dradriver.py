"""The real node's DRA driver: ``spyre-dra-driver`` (tests/cluster/dradriver/main.go, built by
``dra-deps.sh``) as a kubelet plugin of the real node, standing in for IBM's ``spyre.ibm.com``.

It runs as a process of this machine, as a driver's DaemonSet pod with hostPath mounts would on
a node: it registers through the kubelet's plugin registry (``<kubelet root>/plugins_registry``),
serves the kubelet's DRA gRPC calls on a socket under ``<kubelet root>/plugins/spyre.ibm.com``,
and publishes the node's ResourceSlice with a ServiceAccount of its own (the RBAC a driver's
chart grants: ResourceSlices, the claims it prepares, the node). Each prepare and unprepare is a
JSON line in ``records``; a prepared claim is a CDI spec under ``cdi_dir`` until unprepared.

The node's containerd (Debian's 1.6) has no CDI support (1.7 and later read the specs the
kubelet names): the container gets no device environment here, the kubelet's calls and the
driver's answers are real.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.cluster import procs
from tests.cluster.controlplane import REPO_ROOT, ControlPlane, wait_until

DRIVER = "spyre.ibm.com"
NAMESPACE = "spyre-dra-driver"
#: The node's stand-in devices, name -> pciFunctionIndex (IBM's names are PCI addresses): the
#: PF with VFs enabled (index 0), the privileged VF (1) and two standard VFs (2, 3).
DEVICES = {"0000-1a-00-0": 0, "0000-1a-00-1": 1, "0000-1a-00-2": 2, "0000-1a-00-3": 3}
#: IBM's spyre-standard-vf selector (its Spyre Operator's DRA mode), verbatim.
STANDARD_VF = (
    'device.attributes["spyre.ibm.com"].pciFunctionIndex != 1 && '
    '!(device.attributes["spyre.ibm.com"].pciFunctionIndex == 0 && '
    'device.attributes["spyre.ibm.com"].vfEnabled == true)'
)
STANDARD = ("0000-1a-00-2", "0000-1a-00-3")


def binary() -> Path:
    """Build (or reuse) the driver; its path."""
    out = subprocess.run([str(REPO_ROOT / "tests/cluster/dra-deps.sh")], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    return Path(out) / "spyre-dra-driver"


def rbac(ns: str = NAMESPACE) -> list[dict[str, Any]]:
    """The driver's ServiceAccount and what it may do, cluster-wide."""
    name = "spyre-dra-driver"
    rules = [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete",
                   "deletecollection"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    ]  # fmt: skip


def device_class(name: str, expression: str = STANDARD_VF) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}  # fmt: skip


class DraDriver:
    """The driver on ``cp``'s real node (which must be up)."""

    NAME = "spyre-dra-driver"

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.node = cp.node
        self.dir = cp.state_dir / "dra-driver"
        self.cdi_dir = self.dir / "cdi"
        self.records_file = self.dir / "records.jsonl"
        self.procs = procs.PidFiles(self.dir)

    def start(self, timeout: float = 120) -> None:
        """Start it (a clean record and CDI dir) and wait until its ResourceSlice lists every
        device."""
        exe = binary()
        self.stop()
        self.dir.mkdir(parents=True, exist_ok=True)
        for f in [self.records_file, *self.cdi_dir.glob("*.json")]:
            f.unlink(missing_ok=True)
        self.cp.apply(rbac())
        kc = self.cp.token_kubeconfig(NAMESPACE, self.NAME, self.dir / "kubeconfig")
        argv = [str(exe), f"--kubeconfig={kc}", f"--node-name={self.node.name}",
                f"--kubelet-dir={self.node.kubelet_dir}", f"--cdi-dir={self.cdi_dir}",
                f"--record={self.records_file}", f"--driver-name={DRIVER}",
                "--devices=" + ",".join(f"{n}={i}" for n, i in DEVICES.items()), "-v=2"]
        log = open(self.cp.logs / "dra-driver.log", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.record(self.NAME, proc.pid)
        t0 = time.monotonic()

        def published() -> bool:
            if not self.procs.pid(self.NAME):
                raise RuntimeError(f"spyre-dra-driver exited; see {self.cp.logs}/dra-driver.log")
            return set(self.devices()) == set(DEVICES)

        wait_until(published, timeout, "the driver's ResourceSlice", 0.5)
        print(f"[dra-driver] serving {len(DEVICES)} devices on {self.node.name} in "
              f"{time.monotonic() - t0:.1f}s", flush=True)

    def devices(self) -> list[str]:
        """The devices of the node's ResourceSlices of this driver."""
        sel = f"spec.nodeName={self.node.name},spec.driver={DRIVER}"
        items = self.cp.kubectl_json("get", "resourceslices", "--field-selector", sel)["items"]
        return [d["name"] for s in items for d in s["spec"].get("devices") or []]

    def records(self) -> list[dict[str, Any]]:
        """What the kubelet asked for, in order (prepare/unprepare, claim uid, devices)."""
        if not self.records_file.exists():
            return []
        return [json.loads(ln) for ln in self.records_file.read_text().splitlines() if ln]

    def prepared(self) -> dict[str, list[str]]:
        """Claim uid -> devices of each CDI spec the driver holds (what is prepared now)."""
        out: dict[str, list[str]] = {}
        for f in sorted(self.cdi_dir.glob("*.json")):
            spec = json.loads(f.read_text())
            uid = f.stem.removeprefix(f"{DRIVER}-")
            out[uid] = [d["name"].removeprefix(f"{uid}-") for d in spec["devices"]]
        return out

    def stop(self) -> None:
        """Stop it and remove its ResourceSlices (a driver uninstalled)."""
        self.procs.stop([self.NAME])
        if self.cp.apiserver_ready():
            self.cp.kubectl("delete", "resourceslices", "--field-selector",
                            f"spec.nodeName={self.node.name},spec.driver={DRIVER}",
                            "--ignore-not-found", check=False)  # fmt: skip


def stop_leftovers(state_dir: Path) -> None:
    """Stop the driver of a cluster being torn down (no API calls)."""
    procs.stop_leftovers(state_dir / "dra-driver")

