"""Growing a cache claim the operator created, by its setting (issue 47, 3), on the real API
server (kwok plays the pods; no volume really resizes: that is the storage driver's part).

``cache.volume.size`` raised: the PVC's request grows where its StorageClass allows expansion
(the cluster's ``local`` class does). Where it does not, the API server's refusal is the
model's Degraded condition, with the API server's words, while the model keeps serving, and
a revert to the old size clears it. (A smaller size is ClaimImmutable, decided before any
write: tests/unit/test_reconcile_correctness.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from spyre_operator.decide import conditions as C

from tests.cluster.controlplane import ControlPlane

from .conftest import Kube, OperatorProcess
from .test_operator import spec

pytestmark = pytest.mark.integration


def _volume(name: str, size: str, storage_class: str | None = None) -> dict[str, Any]:
    return {"volume": {"name": name, "size": size,
                       **({"storageClassName": storage_class} if storage_class else {})}}


def _requested(kube: Kube, claim: str) -> str | None:
    pvc = kube.get("pvc", claim) or {}
    return ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")


def _bound(kube: Kube, claim: str) -> bool:
    return ((kube.get("pvc", claim) or {}).get("status") or {}).get("phase") == "Bound"


@pytest.fixture
def fixed_class(control_plane: ControlPlane, kube: Kube) -> Iterator[tuple[str, str]]:
    """A StorageClass without expansion and one static PV of it, bound ahead to the claim
    ``fixed-cache`` of the test's namespace: (class, claim)."""
    tag = uuid.uuid4().hex[:8]
    sc, pv, claim = f"fixed-{tag}", f"pv-fixed-{tag}", "fixed-cache"
    control_plane.kubectl("apply", "-f", "-", input=f"""
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {sc}}}
provisioner: kubernetes.io/no-provisioner
reclaimPolicy: Retain
volumeBindingMode: Immediate
allowVolumeExpansion: false
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {pv}}}
spec:
  capacity: {{storage: 100Gi}}
  accessModes: [ReadWriteOnce, ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: {sc}
  hostPath: {{path: /nonexistent/{pv}, type: ""}}
  claimRef: {{namespace: {kube.ns}, name: {claim}}}
""")  # fmt: skip
    try:
        yield sc, claim
    finally:
        control_plane.kubectl("delete", "pv", pv, "--wait=false", check=False)
        control_plane.kubectl("delete", "storageclass", sc, check=False)


def test_a_larger_cache_size_grows_the_claim_where_its_class_allows(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("grow", spec(cache=_volume("grow-cache", "10Gi")))
    kube.wait_condition("grow", "Ready", "True", reason=C.SERVING, timeout=120)
    kube.wait(lambda: _bound(kube, "grow-cache"), 60, "the claim bound")
    assert _requested(kube, "grow-cache") == "10Gi"

    kube.apply_model("grow", spec(cache=_volume("grow-cache", "20Gi")))
    kube.wait(lambda: _requested(kube, "grow-cache") == "20Gi", 30, "the claim's request grown")
    kube.wait_condition("grow", "Degraded", "False", timeout=30)
    assert kube.condition("grow", "Ready")["status"] == "True"  # type: ignore[index]


def test_a_class_without_expansion_refuses_and_the_model_says_so_while_it_serves(
    kube: Kube, operator: OperatorProcess, fixed_class: tuple[str, str]
) -> None:
    sc, claim = fixed_class
    kube.apply_model("fixed", spec(cache=_volume(claim, "10Gi", sc)))
    kube.wait_condition("fixed", "Ready", "True", reason=C.SERVING, timeout=120)
    kube.wait(lambda: _bound(kube, claim), 60, "the claim bound to the class's PV")

    kube.apply_model("fixed", spec(cache=_volume(claim, "20Gi", sc)))
    degraded = kube.wait_condition("fixed", "Degraded", "True", reason=C.RECONCILE_ERROR,
                                   timeout=30)  # fmt: skip
    # the API server's own words: its admission refuses a resize the class does not allow
    assert f"PersistentVolumeClaim {claim}" in degraded["message"], degraded
    assert "resize" in degraded["message"], degraded
    assert _requested(kube, claim) == "10Gi"
    ready = kube.condition("fixed", "Ready")
    assert ready and ready["status"] == "True" and ready["reason"] == C.SERVING, ready

    kube.apply_model("fixed", spec(cache=_volume(claim, "10Gi", sc)))
    kube.wait_condition("fixed", "Degraded", "False", timeout=30)
