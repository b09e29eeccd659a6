"""A model's whole life on the real control plane (kwok plays the pods): no cache claim lost
to an edit or a delete, no failure hidden from status, and a status that converges.

Each test is one sequence a user or another controller can produce.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Kube, OperatorProcess, holds, holds_over_reconciles, reconcile_now
from .test_reconcile_correctness import claims_of

pytestmark = pytest.mark.integration

GROUP = "serving.spyre.dev"


def spec(**overrides: Any) -> dict[str, Any]:
    """A model in a shape the plugin supports (tp=1, 3072 tokens, 16 sequences)."""
    base: dict[str, Any] = {
        "model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
        "compile": {"maxModelLen": 3072, "maxNumSeqs": 16},
        "precompile": {"backoffLimit": 0},
    }
    base.update(overrides)
    return base


def owners(pvc: dict[str, Any] | None) -> list[str]:
    return [r["name"] for r in ((pvc or {}).get("metadata") or {}).get("ownerReferences") or []]


def test_deleting_the_volume_model_keeps_a_claim_another_model_names(
    kube: Kube, operator: OperatorProcess
) -> None:
    """Model A makes claim X (retainPolicy Delete), model B uses it by cache.claimName:
    deleting A must not delete X (B names it)."""
    kube.apply_model("a", spec(cache={"volume": {"name": "x", "retainPolicy": "Delete"}}))
    kube.wait_condition("a", "Ready", reason="Serving", timeout=90)
    kube.apply_model("b", spec(cache={"claimName": "x"}, serving={"port": 8081}))
    kube.wait_condition("b", "Ready", reason="Serving", timeout=90)
    uid = kube.get("pvc", "x")["metadata"]["uid"]
    kube.kubectl("delete", "spyremodel/a", "--wait=true", "--timeout=60s")
    kube.wait(lambda: kube.get("deployment", "a") is None, 60, "A's children collected")

    def kept() -> bool:
        pvc = kube.get("pvc", "x")
        assert pvc is not None, "claim x was deleted although model b names it"
        assert pvc["metadata"]["uid"] == uid, "claim x was recreated (its artifacts lost)"
        assert not pvc["metadata"].get("deletionTimestamp"), "claim x is being deleted"
        return True

    holds(kept, 10, "claim x kept")  # the garbage collector acted within seconds
    reconcile_now(kube, operator, "b")
    assert kept()
    assert kube.condition("b", "CacheVolumeReady")["reason"] == "ClaimBound"


def test_moving_off_a_delete_claim_releases_it(kube: Kube, operator: OperatorProcess) -> None:
    """Reproduced: the old PVC stayed owned by the model although nothing named it; it is
    released once the model's pods left it, and not before."""
    kube.apply_model("m", spec(cache={"volume": {"name": "old", "retainPolicy": "Delete"}}))
    kube.wait_condition("m", "Ready", reason="Serving", timeout=90)
    assert owners(kube.get("pvc", "old")) == ["m"]
    kube.apply_model("m", spec(cache={"volume": {"name": "new", "retainPolicy": "Delete"}},
                               precompile={"backoffLimit": 0,
                                           "podAnnotations": {"kwok.spyre.dev/hold": "true"}}))
    kube.wait_condition("m", "Ready", reason="ServingPreviousArtifact", timeout=60)
    # while the pods serve from it, the old claim stays, owned
    holds_over_reconciles(
        kube, operator,
        lambda: owners(kube.get("pvc", "old")) == ["m"]
        and claims_of(kube.get("deployment", "m")) == ["old"],
        "the served claim kept while the new artifact compiles", reconciles=2, seconds=4)
    kube.kubectl("annotate", "pods", "-l", "app.kubernetes.io/component=precompile",
                 "kwok.spyre.dev/hold-")
    kube.wait_condition("m", "Ready", reason="Serving", timeout=90)
    assert claims_of(kube.get("deployment", "m")) == ["new"]

    def gone() -> bool:
        pvc = kube.get("pvc", "old")
        return pvc is None or bool(pvc["metadata"].get("deletionTimestamp"))

    kube.wait(gone, 60, "the old claim (retainPolicy Delete, named by nobody) deleted")
    assert owners(kube.get("pvc", "new")) == ["m"]


def test_moving_off_a_claim_another_model_names_only_drops_the_owner(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply_model("m", spec(cache={"volume": {"name": "old", "retainPolicy": "Delete"}}))
    kube.wait_condition("m", "Ready", reason="Serving", timeout=90)
    kube.apply_model("b", spec(cache={"claimName": "old"}, serving={"port": 8081}))
    kube.wait_condition("b", "Ready", reason="Serving", timeout=90)
    kube.apply_model("m", spec(cache={"volume": {"name": "new", "retainPolicy": "Delete"}}))
    kube.wait(lambda: claims_of(kube.get("deployment", "m")) == ["new"], 90, "m moved")
    kube.wait(lambda: owners(kube.get("pvc", "old")) == [], 60, "m dropped from old's owners")
    pvc = kube.get("pvc", "old")
    assert pvc is not None and not pvc["metadata"].get("deletionTimestamp")


def test_status_field_another_manager_changes_is_corrected(
    kube: Kube, operator: OperatorProcess
) -> None:
    """Reproduced: once another field manager had changed a status field, the operator
    compared with its own last write and never corrected it until the next transition."""
    kube.apply_model("m", spec())
    kube.wait_condition("m", "Ready", reason="Serving", timeout=90)
    key = kube.model("m")["status"]["servingArtifactKey"]
    # another controller applies (SSA) its view of a condition and a field
    doc = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "SpyreModel",
           "metadata": {"name": "m"},
           "status": {"servingArtifactKey": "tampered",
                      "conditions": [{"type": "Ready", "status": "False", "reason": "Tampered",
                                      "message": "someone else", "lastTransitionTime":
                                      "2026-01-01T00:00:00Z"}]}}
    kube.kubectl("apply", "--server-side", "--subresource=status", "--field-manager=intruder",
                 "--force-conflicts", "-f", "-", input=json.dumps(doc))
    kube.wait(lambda: kube.model("m")["status"]["servingArtifactKey"] == key, 30,
              "servingArtifactKey written back")
    kube.wait_condition("m", "Ready", reason="Serving", timeout=30)
    # a merge patch (an Update) of another manager, on a field only
    kube.kubectl("patch", "spyremodel/m", "--subresource=status", "--type=merge",
                 "--field-manager=patcher", "-p", json.dumps(
                     {"status": {"servingArtifactKey": "patched"}}))
    kube.wait(lambda: kube.model("m")["status"]["servingArtifactKey"] == key, 30,
              "servingArtifactKey written back after a merge patch")


def test_a_foreign_pdb_the_model_does_not_want_is_no_conflict(
    kube: Kube, operator: OperatorProcess
) -> None:
    """Reproduced: a same-named PDB next to a 1-replica model set Degraded=True NameConflict
    and Stalled=True."""
    kube.kubectl("create", "poddisruptionbudget", "m", "--selector=app=other",
                 "--min-available=1")
    before = kube.get("pdb", "m")["metadata"]["resourceVersion"]
    kube.apply_model("m", spec())
    kube.wait_condition("m", "Ready", reason="Serving", timeout=90)
    for t in ("Degraded", "Stalled"):
        assert kube.condition("m", t)["status"] == "False", kube.condition("m", t)
    assert kube.get("pdb", "m")["metadata"]["resourceVersion"] == before  # left alone
    kube.apply_model("m", spec(replicas=2))  # now it wants one: a conflict
    c = kube.wait_condition("m", "Degraded", "True", reason="NameConflict", timeout=60)
    assert "PodDisruptionBudget m" in c["message"]
    assert kube.get("pdb", "m")["metadata"]["resourceVersion"] == before


def test_a_terminating_cache_claim_is_reported(kube: Kube, operator: OperatorProcess) -> None:
    """A PVC being deleted (held by pvc-protection while the pods mount it) reported
    CacheVolumeReady=True ClaimBound."""
    kube.apply_model("m", spec(cache={"volume": {"name": "doomed"}}))
    kube.wait_condition("m", "Ready", reason="Serving", timeout=90)
    kube.kubectl("delete", "pvc", "doomed", "--wait=false")
    c = kube.wait_condition("m", "CacheVolumeReady", "False", reason="ClaimTerminating",
                            timeout=30)
    assert "kubernetes.io/pvc-protection" in c["message"], c
    assert kube.condition("m", "Degraded")["reason"] == "ClaimTerminating"
