"""Spyre cards through DRA (issue 46, 5) on the kwok control plane: the operator side.

The cluster's own kube-scheduler allocates the claims (its DynamicResources plugin, on by
default in 1.36) and kube-controller-manager makes each pod's claim from the operator's
ResourceClaimTemplate; the devices are a ResourceSlice this module publishes for one kwok node
as IBM's driver (``spyre.ibm.com``) would, with the attributes IBM's DeviceClasses select on,
and the class is IBM's ``spyre-standard-vf`` with its selector. Nothing prepares the devices
(no kubelet plugin, no CDI: kwok plays the pods); the real node is where that is tested.

The operator runs with the chart's own RBAC (its ClusterRole, rendered), alone: a verb the
chart lacks fails here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names

from tests.cluster.controlplane import ControlPlane
from tests.cluster.dradriver import DRIVER, STANDARD_VF
from tests.unit.test_chart_lint import needs_helm, render

from .conftest import Kube, OperatorProcess, reconcile_now, settle_writes
from .test_operator import spec

pytestmark = [pytest.mark.integration, needs_helm, pytest.mark.usefixtures("no_host_operator")]

#: A class of this module's own (the cluster is shared with other modules).
CLASS = f"spyre-standard-vf-{uuid.uuid4().hex[:5]}"
NODE = "spyre-node-0"
#: Two standard VFs and the privileged VF (pciFunctionIndex 1), which the class never selects.
MATCHING = ("0000-1a-00-2", "0000-1a-00-3")
PRIVILEGED = "0000-1a-00-1"


def _device(name: str, index: int) -> dict[str, Any]:
    return {"name": name, "attributes": {
        "pciFunctionIndex": {"int": index}, "vfEnabled": {"bool": True},
        "productId": {"string": "0x06a7"}}}  # fmt: skip


@pytest.fixture(scope="module")
def devices(control_plane: ControlPlane) -> Iterator[None]:
    """The DeviceClass and NODE's ResourceSlice (3 devices, 2 of the class)."""
    cp = control_plane
    slice_name = f"{NODE}-{CLASS}"
    cp.apply([
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
         "spec": {"selectors": [{"cel": {"expression": STANDARD_VF}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": slice_name},
         "spec": {"driver": DRIVER, "nodeName": NODE,
                  "pool": {"name": f"{NODE}-{CLASS}", "generation": 1, "resourceSliceCount": 1},
                  "devices": [_device(PRIVILEGED, 1),
                              *(_device(n, i) for i, n in enumerate(MATCHING, start=2))]}},
    ])  # fmt: skip
    yield
    cp.kubectl("delete", "resourceslice", slice_name, "--wait=false", check=False)
    cp.kubectl("delete", "deviceclass", CLASS, "--wait=false", check=False)


@pytest.fixture(scope="module")
def dra_ns(control_plane: ControlPlane) -> Iterator[str]:
    ns = f"t-dra-{uuid.uuid4().hex[:6]}"
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    yield ns
    control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def dra_operator(control_plane: ControlPlane, dra_ns: str, devices: None, crd: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator with the chart's cluster-scope RBAC (rendered for a release in dra_ns),
    watching dra_ns only."""
    cp = control_plane
    docs = [d for d in render(namespace=dra_ns) if d["kind"] in (
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    cp.apply(docs)
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"
                  and not d["metadata"]["name"].endswith("-metrics-auth")]
    sa = binding["subjects"][0]["name"]
    kc = cp.token_kubeconfig(dra_ns, sa, tmp_path_factory.mktemp("dra") / "operator.kubeconfig")
    # The chart's defaults that matter here (plain Kubernetes, no KEDA, its Lease), one
    # namespace watched.
    args = ["--namespace", dra_ns, "--pod-user=fixed", "--required-scc=", "--no-scale-to-zero",
            "--leader-elect", f"--leader-election-namespace={dra_ns}",
            "--leader-election-lease=spyre-spyre-model-operator"]
    op = OperatorProcess(kc, cp.root / ".cluster" / "logs", args=args,
                         env={"SPYRE_COMPILE_RETRY_BASE_SECONDS": "300",
                              "POD_NAMESPACE": dra_ns, "POD_NAME": "local-operator"})
    op.start()
    yield op
    op.stop()
    for d in docs:
        if d["kind"].startswith("Cluster"):  # the rest goes with the namespace
            cp.kubectl("delete", d["kind"].lower(), d["metadata"]["name"], "--wait=false",
                       check=False)


@pytest.fixture
def kube(control_plane: ControlPlane, dra_ns: str) -> Iterator[Kube]:
    """dra_ns; after each test its models are gone and their pods with them (they hold the
    node's two matching devices: a failed test must not fail the next ones)."""
    k = Kube(control_plane, dra_ns)
    yield k
    k.kubectl("delete", "spyremodels", "--all", "--wait=true", "--timeout=60s", check=False)
    k.wait(lambda: not k.items("pods", f"{names.COMPONENT}=server"), 60, "the pods gone")


def _pods(kube: Kube, model: str) -> list[dict[str, Any]]:
    return kube.items("pods", f"{names.MODEL_LABEL}={model},{names.COMPONENT}=server")


def _allocated(kube: Kube, pod: dict[str, Any]) -> list[str]:
    """The devices of the pod's claim (empty: none allocated yet)."""
    out = []
    for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        claim = kube.get("resourceclaim", st["resourceClaimName"])
        results = (((claim or {}).get("status") or {}).get("allocation") or {}).get(
            "devices", {}).get("results") or []
        out += [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]
    return out


def _templates(kube: Kube, model: str) -> list[str]:
    return sorted(t["metadata"]["name"] for t in kube.items(
        "resourceclaimtemplates", f"{names.MODEL_LABEL}={model}"))


def test_a_model_on_a_class_is_served_through_claims_of_its_devices(
    kube: Kube, dra_operator: OperatorProcess
) -> None:
    """Two replicas of one card each: both standard VFs, never the privileged one; placed by
    kube-scheduler (no schedulerName), no extended resource, status.devices lists both."""
    kube.apply_model("vf", spec(replicas=2, accelerator={"deviceClassName": CLASS}))
    kube.wait_condition("vf", "Ready", timeout=120)
    dep = kube.get("deployment", "vf")
    pod_spec = dep["spec"]["template"]["spec"]
    assert "schedulerName" not in pod_spec or pod_spec["schedulerName"] == "default-scheduler"
    (engine,) = pod_spec["containers"]
    assert not any(k.startswith("ibm.com/") for k in (engine["resources"].get("limits") or {}))
    assert engine["resources"]["claims"] == [{"name": "spyre"}]
    (template,) = _templates(kube, "vf")
    assert pod_spec["resourceClaims"] == [{"name": "spyre",
                                           "resourceClaimTemplateName": template}]
    owner = kube.get("resourceclaimtemplate", template)["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("SpyreModel", "vf")

    def two_allocated() -> list[str] | None:
        pods = [p for p in _pods(kube, "vf") if not p["metadata"].get("deletionTimestamp")]
        got = sorted(d for p in pods for d in _allocated(kube, p))
        return got if len(got) == 2 else None

    got = kube.wait(two_allocated, 60, "two allocated claims")
    pool = f"{NODE}-{CLASS}"
    assert got == sorted(f"{DRIVER}/{pool}/{d}" for d in MATCHING), got
    assert all(p["spec"]["nodeName"] == NODE for p in _pods(kube, "vf"))

    def devices_in_status() -> list[dict[str, Any]] | None:
        shown = kube.model("vf").get("status", {}).get("devices") or []
        return shown if len(shown) == 2 else None

    shown = kube.wait(devices_in_status, 30, "status.devices")
    assert sorted(d["device"] for d in shown) == sorted(MATCHING)
    assert {(d["driver"], d["pool"]) for d in shown} == {(DRIVER, pool)}
    assert {d["pod"] for d in shown} == {p["metadata"]["name"] for p in _pods(kube, "vf")}
    # Idle, a reconcile writes nothing: the template as listed is what the operator applies.
    settle_writes(dra_operator, kube.ns)
    writes = dra_operator.namespace_writes(kube.ns)
    reconcile_now(kube, dra_operator, "vf")
    assert dra_operator.namespace_writes(kube.ns) == writes, dra_operator.log_tail(10)


def test_more_cards_than_the_class_offers_is_devices_unavailable_with_the_schedulers_message(
    kube: Kube, dra_operator: OperatorProcess
) -> None:
    """Four cards of a class with two devices: the pod's claim cannot be allocated; within
    30 s of the scheduler saying so, the model's condition carries its message."""
    kube.apply_model("big", spec(compile={"maxModelLen": 2048, "tensorParallelSize": 4},
                                 accelerator={"deviceClassName": CLASS}))

    def refused() -> tuple[float, str] | None:
        for p in _pods(kube, "big"):
            for c in (p.get("status") or {}).get("conditions") or []:
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return time.monotonic(), str(c.get("message"))
        return None

    seen, message = kube.wait(refused, 120, "the scheduler's refusal")
    cond = kube.wait_condition("big", C.PROGRESSING, reason=C.DEVICES_UNAVAILABLE, timeout=30)
    assert time.monotonic() - seen <= 30
    assert message in cond["message"], (message, cond)
    assert kube.condition("big", C.READY)["status"] == "False"
    assert not [d for p in _pods(kube, "big") for d in _allocated(kube, p)]


def test_a_class_that_does_not_exist_is_named(
    kube: Kube, dra_operator: OperatorProcess
) -> None:
    kube.apply_model("nope", spec(accelerator={"deviceClassName": "spyre-nope"}))
    cond = kube.wait_condition("nope", C.DEGRADED, reason=C.DEVICE_CLASS_NOT_FOUND, timeout=60)
    assert "DeviceClass spyre-nope (spec.accelerator.deviceClassName) does not exist" in (
        cond["message"])
    kube.wait(lambda: [e for e in kube.items("events") if e["involvedObject"]["name"] == "nope"
                       and e["reason"] == C.DEVICE_CLASS_NOT_FOUND and e["type"] == "Warning"],
              30, "the Warning Event")


def test_a_new_card_count_makes_a_new_template_and_the_old_one_goes_when_unused(
    kube: Kube, dra_operator: OperatorProcess
) -> None:
    """A template's spec is immutable: another count is another template; the serving pods
    keep their claims until replaced, then the old template is deleted."""
    kube.apply_model("grow", spec(accelerator={"deviceClassName": CLASS}))
    kube.wait_condition("grow", "Ready", timeout=120)
    (old,) = _templates(kube, "grow")
    kube.apply_model("grow", spec(compile={"maxModelLen": 2048, "tensorParallelSize": 2},
                                  accelerator={"deviceClassName": CLASS}))
    new = names.cards_template_name("grow", CLASS, 2)
    assert new != old
    kube.wait(lambda: new in _templates(kube, "grow"), 60, "the new template")
    kube.wait(lambda: (kube.get("deployment", "grow")["spec"]["template"]["spec"]
                       ["resourceClaims"][0]["resourceClaimTemplateName"] == new), 120,
              "the Deployment on the new template")
    kube.wait(lambda: _templates(kube, "grow") == [new], 90, "the old template deleted")

    def two_on_the_new_pod() -> bool:
        pods = [p for p in _pods(kube, "grow") if not p["metadata"].get("deletionTimestamp")]
        return bool(pods) and all(len(_allocated(kube, p)) == 2 for p in pods)

    kube.wait(two_on_the_new_pod, 60, "two devices on the new pod")
