"""Spyre cards through DRA on the real node (issue 46, 5): the kubelet's side, which the kwok
module (tests/integration/test_dra.py) cannot show.

``spyre-dra-driver`` (tests/cluster/dradriver.py), a real kubelet plugin standing in for IBM's
``spyre.ibm.com``, registers with the node's kubelet through its plugin registry and publishes
the node's devices: the PF with VFs enabled (``pciFunctionIndex`` 0), the privileged VF (1) and
two standard VFs. A ``sendnn`` model (the backend whose serving pods use cards) names a
DeviceClass with IBM's ``spyre-standard-vf`` selector: kube-scheduler allocates each serving
pod a standard VF, the kubelet has the driver prepare the pod's claim before its container
starts, the model's ``status.devices`` names the devices, and once the model is deleted the
kubelet has the driver unprepare the claims.

No card and no ``torch_sendnn`` exist here, so nothing could serve on the claimed device: the
precompile Job runs on a kwok node (kwok completes it) and the serving container is the node's
busybox image, which starts and exits (the claim's way to the container is what is tested; the
CPU backends that do serve here claim no cards).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import dradriver
from tests.cluster.controlplane import ControlPlane
from tests.cluster.ociimage import busybox_image
from tests.contract.realpods import HF_MODEL, SMALL
from tests.integration.conftest import Kube
from tests.realpods import support

pytestmark = [pytest.mark.realpods, pytest.mark.integration, pytest.mark.timeout(600)]

#: A DeviceClass of this module's own with IBM's spyre-standard-vf selector.
CLASS = f"spyre-standard-vf-{secrets.token_hex(3)}"


@pytest.fixture(scope="module")
def dra(kube: Kube, control_plane: ControlPlane) -> Iterator[dradriver.DraDriver]:
    """The node's DRA driver, serving, and CLASS."""
    driver = dradriver.DraDriver(control_plane)
    driver.start()
    control_plane.apply(dradriver.device_class(CLASS))
    yield driver
    driver.stop()
    control_plane.kubectl("delete", "deviceclass", CLASS, "--ignore-not-found", check=False)


def spec() -> dict[str, Any]:
    """Two sendnn replicas on the real node, each claiming one card of CLASS; the precompile
    Job (sendnn_compile_only, off the cards) on a kwok node."""
    s = support.tiny_model_spec(busybox_image(), HF_MODEL, backend="sendnn", replicas=2,
                                override={
        "compile": {"requireKnownConfiguration": False},
        "accelerator": {"deviceClassName": CLASS},
        "serving": {"resources": SMALL},
    })  # fmt: skip
    s["precompile"] = {"backoffLimit": 0, "nodeSelector": {"type": "kwok"}}
    return s


def _claims(kube: Kube, pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod name -> its ResourceClaim, once every pod's claim is allocated (else {})."""
    out = {}
    for pod in pods:
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if len(statuses) != 1:
            return {}
        claim = kube.get("resourceclaim", statuses[0]["resourceClaimName"])
        if not ((claim or {}).get("status") or {}).get("allocation"):
            return {}
        out[pod["metadata"]["name"]] = claim
    return out


def _started(pod: dict[str, Any]) -> bool:
    """Whether the pod's container was started (running now, or ran and exited)."""
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("restartCount") or "running" in (c.get("state") or {}) or (
            "terminated" in (c.get("state") or {})
        ):
            return True
    return False


def test_serving_pods_on_a_device_class_get_their_cards_prepared_by_the_nodes_driver(
    kube: Kube, dra: dradriver.DraDriver
) -> None:
    t0 = time.monotonic()
    kube.apply_model("cards", spec())
    kube.wait_condition("cards", "ArtifactReady", "True", timeout=60)

    def pods() -> list[dict[str, Any]]:
        return [p for p in support.server_pods(kube.cp, kube.ns, "cards")
                if not p["metadata"].get("deletionTimestamp")]  # fmt: skip

    def allocated() -> dict[str, dict[str, Any]] | None:
        ps = pods()
        return (_claims(kube, ps) or None) if len(ps) == 2 else None

    try:
        claims = kube.wait(allocated, 120, "two serving pods with allocated claims")
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{support.describe(kube.cp, kube.ns, 'cards')}") from None
    print(f"cards: apply -> two claims allocated in {time.monotonic() - t0:.0f}s")
    devices = {pod: [(r["driver"], r["pool"], r["device"])
                     for r in c["status"]["allocation"]["devices"]["results"]]
               for pod, c in claims.items()}  # fmt: skip
    # kube-scheduler chose two standard VFs on the real node: never the PF with VFs enabled
    # (index 0), never the privileged VF (index 1).
    assert sorted(d for ds in devices.values() for d in ds) == [
        (dradriver.DRIVER, kube.cp.node.name, d) for d in dradriver.STANDARD], devices
    for pod in pods():
        assert pod["spec"]["nodeName"] == kube.cp.node.name, pod["spec"]
        (container,) = pod["spec"]["containers"]
        limits = (container.get("resources") or {}).get("limits") or {}
        assert not [r for r in limits if r.startswith("ibm.com/")], limits
        assert container["resources"]["claims"] == [{"name": "spyre"}], container["resources"]

    # The kubelet had the driver prepare each claim, and only then started the container.
    uids = {pod: c["metadata"]["uid"] for pod, c in claims.items()}

    def prepared_and_started() -> bool:
        asked = {r["uid"]: r["devices"] for r in dra.records() if r["op"] == "prepare"}
        return all(asked.get(uids[p]) == [devices[p][0][2]] for p in uids) and all(
            _started(p) for p in pods())

    try:
        kube.wait(prepared_and_started, 120, "the claims prepared and the containers started")
    except TimeoutError as e:
        raise AssertionError(f"{e}\nrecords {dra.records()}\n"
                             f"{support.describe(kube.cp, kube.ns, 'cards')}") from None
    held = dra.prepared()  # the driver's CDI specs, one per prepared claim
    assert {held.get(uids[p]) and held[uids[p]][0] for p in uids} == set(dradriver.STANDARD), held
    print(f"cards: prepared by the node's driver, containers started in "
          f"{time.monotonic() - t0:.0f}s")

    # What the operator reads back: the devices of its serving pods.
    shown = kube.wait(lambda: (len(d := kube.model("cards").get("status", {}).get("devices")
                                   or []) == 2) and d, 60, "status.devices")  # fmt: skip
    assert sorted((d["pod"], d["driver"], d["pool"], d["device"]) for d in shown) == sorted(
        (pod, *ds[0]) for pod, ds in devices.items()), shown

    # Deleted: the pods go, and the kubelet has the driver unprepare their claims.
    kube.kubectl("delete", "spyremodel", "cards", "--wait=false")

    def unprepared() -> bool:
        done = {r["uid"] for r in dra.records() if r["op"] == "unprepare"}
        return set(uids.values()) <= done and not set(uids.values()) & set(dra.prepared())

    kube.wait(unprepared, 120, "the kubelet's unprepare of the model's claims")
    print(f"cards: deleted -> claims unprepared; {time.monotonic() - t0:.0f}s in all")
