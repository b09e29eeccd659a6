"""The local control plane behaves like a real cluster (issue 2, "Must show").

Every check polls with a timeout; nothing relies on a fixed sleep.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane, KubectlError, wait_until

pytestmark = pytest.mark.integration

SPYRE_NODES = {"spyre-node-0", "spyre-node-1"}
IMAGE = "registry.invalid/spyre/fake-server:1"
TIMEOUT = 60


# --------------------------------------------------------------------------- helpers
def restricted_container(name: str = "main", **extra: Any) -> dict[str, Any]:
    """A container that passes PodSecurity 'restricted'."""
    c: dict[str, Any] = {
        "name": name,
        "image": IMAGE,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    c.update(extra)
    return c


def pod_spec(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [restricted_container()],
        "terminationGracePeriodSeconds": 5,
    }
    spec.update(extra)
    return spec


def job(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations or {}, "labels": {"app": name}},
                "spec": pod_spec(restartPolicy="Never"),
            },
            **spec,
        },
    }


def deployment(
    name: str,
    annotations: dict[str, str] | None = None,
    replicas: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                "spec": pod_spec(**spec),
            },
        },
    }


def get(cp: ControlPlane, ns: str, *what: str) -> Any:
    return cp.kubectl_json("get", *what, "-n", ns)


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c["type"] == ctype:
            return c
    return None


def is_true(obj: dict[str, Any], ctype: str) -> bool:
    c = condition(obj, ctype)
    return bool(c and c["status"] == "True")


def pods_of(cp: ControlPlane, ns: str, app: str) -> list[dict[str, Any]]:
    return get(cp, ns, "pods", "-l", f"app={app}")["items"]


def one_pod(cp: ControlPlane, ns: str, app: str, pred: Callable[[dict[str, Any]], bool]) -> Any:
    def check() -> dict[str, Any] | None:
        pods = [p for p in pods_of(cp, ns, app) if pred(p)]
        return pods[0] if pods else None

    return check


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


def holds_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """Assert ``predicate`` stays true for ``seconds`` (polled), e.g. 'stays Pending'."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert predicate(), f"{what} stopped holding"
        time.sleep(0.3)


# --------------------------------------------------------------------------- tests
def test_kubectl_reports_v136_server(control_plane: ControlPlane, kubeconfig: Any) -> None:
    root = control_plane.root
    out = subprocess.run(
        [str(root / ".cluster/bin/kubectl"), "--kubeconfig", str(root / ".cluster/kubeconfig"),
         "version", "-o", "json"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    version = json.loads(out.stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.36."), version
    assert version["serverVersion"]["minor"] == "36"
    assert version["clientVersion"]["gitVersion"].startswith("v1.36."), version
    assert (root / ".cluster/bin/helm").exists()


def test_fake_spyre_nodes(control_plane: ControlPlane) -> None:
    nodes = {n["metadata"]["name"]: n for n in control_plane.kubectl_json("get", "nodes")["items"]}
    assert SPYRE_NODES <= set(nodes)
    for name in SPYRE_NODES:
        n = nodes[name]
        assert is_true(n, "Ready")
        alloc = n["status"]["allocatable"]
        assert alloc["ibm.com/spyre_vf"] == "8" and alloc["ibm.com/spyre_pf"] == "8"
        labels = n["metadata"]["labels"]
        assert labels["ibm.com/spyre.present"] == "true"
        assert labels["ibm.com/spyre.count"] == "8"
        assert labels["ibm.com/spyre.product"]


def test_spyre_deployment_becomes_available(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    dep = deployment("spyre-server", schedulerName="spyre-scheduler")
    res = {"ibm.com/spyre_vf": "2", "cpu": "1", "memory": "1Gi"}
    dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": res,
        "limits": res,
    }
    out = subprocess.run(
        [str(cp.bin_dir / "kubectl"), "--kubeconfig", str(cp.kubeconfig), "apply", "-n", ns,
         "-f", "-"],
        input=json.dumps(dep), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "warning" not in out.stderr.lower(), out.stderr  # PodSecurity would warn here

    wait_until(
        lambda: is_true(get(cp, ns, "deployment", "spyre-server"), "Available"),
        TIMEOUT,
        "Deployment spyre-server Available",
    )
    pod = wait_until(
        one_pod(cp, ns, "spyre-server", lambda p: is_true(p, "Ready")), TIMEOUT, "a Ready pod"
    )
    assert pod["spec"]["schedulerName"] == "spyre-scheduler"
    assert pod["spec"]["nodeName"] in SPYRE_NODES
    assert pod["status"]["phase"] == "Running"
    assert pod["status"].get("podIP")
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    # The pod was placed by the spyre-scheduler profile, not the default one.
    pod_name = pod["metadata"]["name"]

    def scheduled_by() -> str | None:
        events = get(cp, ns, "events", "--field-selector", "reason=Scheduled")["items"]
        for e in events:
            if e["involvedObject"]["name"] == pod_name:
                return str(e.get("reportingComponent"))
        return None

    assert wait_until(scheduled_by, TIMEOUT, "the Scheduled event") == "spyre-scheduler"


def test_restricted_pod_security_is_enforced(control_plane: ControlPlane, namespace: str) -> None:
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": IMAGE,
                                 "securityContext": {"privileged": True}}]},
    }  # fmt: skip
    with pytest.raises(KubectlError, match="violates PodSecurity"):
        control_plane.apply(bad)


def test_job_completes(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    cp.apply(job("precompile"), "-n", ns)
    wait_until(
        lambda: is_true(get(cp, ns, "job", "precompile"), "Complete"), TIMEOUT, "Job Complete"
    )
    pod = pods_of(cp, ns, "precompile")[0]
    assert pod["status"]["phase"] == "Succeeded"
    assert terminated(pod)["exitCode"] == 0
    assert terminated(pod)["reason"] == "Completed"
    assert get(cp, ns, "job", "precompile")["status"]["succeeded"] == 1


def test_deleting_owner_garbage_collects_dependents(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp, ns = control_plane, namespace
    cp.apply(deployment("gc-owner", replicas=2), "-n", ns)
    wait_until(
        lambda: len([p for p in pods_of(cp, ns, "gc-owner") if is_true(p, "Ready")]) == 2,
        TIMEOUT,
        "two Ready pods",
    )
    rs = get(cp, ns, "replicasets", "-l", "app=gc-owner")["items"]
    assert len(rs) == 1 and rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    # A plain object owned by a ConfigMap goes too.
    owner = cp.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, "-n", ns
    )
    assert owner
    uid = get(cp, ns, "configmap", "owner")["metadata"]["uid"]
    cp.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "dependent",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
                ],
            },
        },
        "-n",
        ns,
    )

    cp.kubectl("delete", "deployment", "gc-owner", "-n", ns, "--wait=false")
    cp.kubectl("delete", "configmap", "owner", "-n", ns, "--wait=false")
    wait_until(
        lambda: (
            not get(cp, ns, "replicasets", "-l", "app=gc-owner")["items"]
            and not pods_of(cp, ns, "gc-owner")
        ),
        TIMEOUT,
        "ReplicaSet and pods garbage-collected",
    )
    wait_until(
        lambda: cp.kubectl("get", "configmap", "dependent", "-n", ns, check=False).returncode != 0,
        TIMEOUT,
        "dependent ConfigMap garbage-collected",
    )


def test_too_many_spyre_cards_stays_pending(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    res = {"ibm.com/spyre_vf": "16"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "too-big", "labels": {"app": "too-big"}},
        "spec": pod_spec(
            schedulerName="spyre-scheduler",
            containers=[restricted_container(resources={"requests": res, "limits": res})],
        ),
    }
    cp.apply(pod, "-n", ns)

    def unschedulable() -> bool:
        c = condition(get(cp, ns, "pod", "too-big"), "PodScheduled")
        return bool(c and c["status"] == "False" and c.get("reason") == "Unschedulable")

    wait_until(unschedulable, TIMEOUT, "PodScheduled=False reason Unschedulable")
    msg = condition(get(cp, ns, "pod", "too-big"), "PodScheduled")["message"]
    assert "ibm.com/spyre_vf" in msg, msg
    holds_for(
        lambda: (
            get(cp, ns, "pod", "too-big")["status"]["phase"] == "Pending"
            and not get(cp, ns, "pod", "too-big")["spec"].get("nodeName")
        ),
        3,
        "pod stays Pending",
    )


def test_pvc_binds_to_static_pv(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    for name, extra in (("explicit", {"storageClassName": "local"}), ("defaulted", {})):
        cp.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "20Gi"}},
                    **extra,
                },
            },
            "-n",
            ns,
        )
    for name in ("explicit", "defaulted"):
        pvc = wait_until(
            lambda n=name: (lambda o: o if o["status"].get("phase") == "Bound" else None)(
                get(cp, ns, "pvc", n)
            ),
            TIMEOUT,
            f"PVC {name} Bound",
        )
        assert pvc["spec"]["storageClassName"] == "local"
        pv = cp.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
        assert pv["spec"]["claimRef"]["namespace"] == ns
        assert pv["status"]["phase"] == "Bound"


def test_pod_with_pvc_runs(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    cp.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "cache"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        "-n",
        ns,
    )
    dep = deployment("with-pvc")
    spec = dep["spec"]["template"]["spec"]
    spec["volumes"] = [{"name": "cache", "persistentVolumeClaim": {"claimName": "cache"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "cache", "mountPath": "/cache"}]
    cp.apply(dep, "-n", ns)
    wait_until(
        lambda: is_true(get(cp, ns, "deployment", "with-pvc"), "Available"),
        TIMEOUT,
        "Deployment with a PVC Available",
    )


# --------------------------------------------------------------------------- kwok stages
def test_stage_fail_with_termination_message(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    msg = '{"error": "compile failed", "detail": "out of Spyre memory"}'
    cp.apply(
        job("fails", {"kwok.spyre.dev/fail": "true", "kwok.spyre.dev/termination-message": msg}),
        "-n",
        ns,
    )
    pod = wait_until(
        one_pod(cp, ns, "fails", lambda p: p["status"].get("phase") == "Failed"),
        TIMEOUT,
        "pod Failed",
    )
    t = terminated(pod)
    assert t["exitCode"] == 1
    assert t["reason"] == "Error"
    assert t["message"] == msg
    wait_until(lambda: is_true(get(cp, ns, "job", "fails"), "Failed"), TIMEOUT, "Job Failed")


def test_stage_succeed_with_termination_message(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp, ns = control_plane, namespace
    msg = json.dumps({"compiled": True, "cache_key": "abc123", "seconds": 42})
    cp.apply(job("summary", {"kwok.spyre.dev/termination-message": msg}), "-n", ns)
    wait_until(lambda: is_true(get(cp, ns, "job", "summary"), "Complete"), TIMEOUT, "Complete")
    pod = pods_of(cp, ns, "summary")[0]
    assert pod["status"]["phase"] == "Succeeded"
    t = terminated(pod)
    assert t["exitCode"] == 0
    assert json.loads(t["message"]) == json.loads(msg)


def test_stage_hold_then_release(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    cp.apply(job("held", {"kwok.spyre.dev/hold": "true"}), "-n", ns)
    pod = wait_until(
        one_pod(cp, ns, "held", lambda p: is_true(p, "Ready")), TIMEOUT, "held pod Running"
    )
    name = pod["metadata"]["name"]
    holds_for(
        lambda: get(cp, ns, "pod", name)["status"]["phase"] == "Running",
        3,
        "held pod stays Running",
    )
    assert not is_true(get(cp, ns, "job", "held"), "Complete")
    cp.kubectl("annotate", "pod", name, "-n", ns, "kwok.spyre.dev/hold-")
    wait_until(lambda: is_true(get(cp, ns, "job", "held"), "Complete"), TIMEOUT, "Complete")
    assert get(cp, ns, "pod", name)["status"]["phase"] == "Succeeded"


def test_stage_complete_after_delay(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    cp.apply(job("slow", {"kwok.spyre.dev/complete-after": "4s"}), "-n", ns)
    pod = wait_until(
        one_pod(cp, ns, "slow", lambda p: p["status"].get("phase") == "Succeeded"),
        TIMEOUT,
        "delayed pod Succeeded",
    )
    t = terminated(pod)
    from datetime import datetime

    def ts(s: str) -> datetime:
        return datetime.fromisoformat(s.replace("Z", "+00:00"))

    ran = ts(t["finishedAt"]) - ts(pod["status"]["startTime"])
    assert ran.total_seconds() >= 3, ran


def test_stage_not_ready_then_ready(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    cp.apply(deployment("warming", {"kwok.spyre.dev/not-ready": "true"}), "-n", ns)
    pod = wait_until(
        one_pod(cp, ns, "warming", lambda p: p["status"].get("phase") == "Running"),
        TIMEOUT,
        "pod Running",
    )
    name = pod["metadata"]["name"]
    c = condition(pod, "Ready")
    assert c and c["status"] == "False"
    assert pod["status"]["containerStatuses"][0]["ready"] is False
    assert not is_true(get(cp, ns, "deployment", "warming"), "Available")
    cp.kubectl("annotate", "pod", name, "-n", ns, "kwok.spyre.dev/not-ready-")
    wait_until(lambda: is_true(get(cp, ns, "pod", name), "Ready"), TIMEOUT, "pod Ready")
    wait_until(
        lambda: is_true(get(cp, ns, "deployment", "warming"), "Available"), TIMEOUT, "Available"
    )
    cp.kubectl("annotate", "pod", name, "-n", ns, "kwok.spyre.dev/not-ready=true")
    wait_until(lambda: not is_true(get(cp, ns, "pod", name), "Ready"), TIMEOUT, "pod not Ready")


def test_stage_crashloop(control_plane: ControlPlane, namespace: str) -> None:
    cp, ns = control_plane, namespace
    msg = "RuntimeError: Spyre device not found"
    ann = {"kwok.spyre.dev/crashloop": "true", "kwok.spyre.dev/termination-message": msg}
    cp.apply(deployment("crashy", ann), "-n", ns)

    def crashing(p: dict[str, Any]) -> bool:
        st = (p["status"].get("containerStatuses") or [{}])[0]
        return st.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"

    pod = wait_until(one_pod(cp, ns, "crashy", crashing), TIMEOUT, "pod in CrashLoopBackOff")
    assert pod["status"]["phase"] == "Running"
    assert not is_true(pod, "Ready")
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 1 and last["reason"] == "Error" and last["message"] == msg
    assert not is_true(get(cp, ns, "deployment", "crashy"), "Available")


# --------------------------------------------------------------------------- contract extras
def test_token_kubeconfig_for_serviceaccount(
    control_plane: ControlPlane, namespace: str, tmp_path: Any
) -> None:
    cp, ns = control_plane, namespace
    cp.kubectl("create", "serviceaccount", "reader", "-n", ns)
    cp.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", ns)
    cp.kubectl(
        "create", "rolebinding", "reader", "--role=pod-reader",
        f"--serviceaccount={ns}:reader", "-n", ns,
    )  # fmt: skip
    kc = cp.token_kubeconfig(ns, "reader", tmp_path / "reader.kubeconfig")
    who = cp.kubectl_json("auth", "whoami", kubeconfig=kc)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:reader"
    wait_until(
        lambda: cp.kubectl("get", "pods", "-n", ns, kubeconfig=kc, check=False).returncode == 0,
        30,
        "RBAC for the ServiceAccount",
    )
    denied = cp.kubectl("get", "secrets", "-n", ns, kubeconfig=kc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()


def test_restart_apiserver_and_etcd_keeps_state(
    control_plane: ControlPlane, namespace: str
) -> None:
    cp, ns = control_plane, namespace
    cp.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "survivor"}}, "-n", ns)
    before = {c: cp.pid(c) for c in ("etcd", "kube-apiserver", "kube-scheduler")}
    cp.restart(("kube-apiserver", "etcd"))
    after = {c: cp.pid(c) for c in ("etcd", "kube-apiserver", "kube-scheduler")}
    assert after["etcd"] and after["etcd"] != before["etcd"]
    assert after["kube-apiserver"] and after["kube-apiserver"] != before["kube-apiserver"]
    assert after["kube-scheduler"] == before["kube-scheduler"]
    assert get(cp, ns, "configmap", "survivor")["metadata"]["name"] == "survivor"
    # Controllers, scheduler and kwok reconnect: a new Job still completes.
    cp.apply(job("after-restart"), "-n", ns)
    wait_until(
        lambda: is_true(get(cp, ns, "job", "after-restart"), "Complete"),
        TIMEOUT * 2,
        "Job Complete after the restart",
    )
