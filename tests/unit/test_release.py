"""Releasing the managed cache PVCs a SpyreModel no longer names (release.py, and the
controller's use of it with a recording applier)."""

from __future__ import annotations

import asyncio
from typing import Any

from spyre_operator.control.controller import Caches, Controller
from spyre_operator.decide.release import claims_to_release, mounted_claims, rollout_complete
from spyre_operator.desired import names
from spyre_operator.desired.plan import OwnerRef
from spyre_operator.handlers import ClaimUser

from .test_controller_failures import RecordingApplier
from .test_reconcile_correctness import bound


def pvc(name: str, *owners: str) -> dict[str, Any]:
    p = bound(uid=f"pvc-{name}")
    p["metadata"].update(name=name, namespace="ns", resourceVersion="3", ownerReferences=[
        {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel", "name": o,
         "uid": f"uid-{o}"} for o in owners])
    return p


def deployment(*claims: str, replicas: int = 1, updated: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "m", "generation": 2,
                         "labels": {names.MANAGED_BY: names.MANAGED_BY_VALUE}},
            "spec": {"template": {"spec": {"volumes": [
                {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
                for i, c in enumerate(claims)]}}},
            "status": {"observedGeneration": 2, "replicas": replicas,
                       "updatedReplicas": updated}}


def test_a_claim_nobody_names_is_deleted_and_a_shared_one_only_dropped_from() -> None:
    old, shared, named = pvc("old", "m"), pvc("shared", "m", "b"), pvc("named", "m")
    out = {r.name: r.keep for r in claims_to_release(
        "uid-m", "new", [old, shared, named, pvc("new", "m")], set(), set(), {"named"})}
    assert out == {"old": None, "shared": [shared["metadata"]["ownerReferences"][1]],
                   "named": []}


def test_never_while_a_pod_may_read_from_it_or_not_ours() -> None:
    old = pvc("old", "m")
    assert claims_to_release("uid-m", "new", [old], {"old"}, {"old"}, set()) == []
    # another model's pods use it: not deleted; but another owner or user keeps it anyway
    assert claims_to_release("uid-m", "new", [old], set(), {"old"}, set()) == []
    assert [r.keep for r in claims_to_release(
        "uid-m", "new", [old], set(), {"old"}, {"old"})] == [[]]
    foreign = pvc("old", "m")
    foreign["metadata"]["labels"] = {}
    assert claims_to_release("uid-m", "new", [foreign], set(), set(), set()) == []
    going = pvc("old", "m")
    going["metadata"]["deletionTimestamp"] = "2026-11-21T10:00:00Z"
    assert claims_to_release("uid-m", "new", [going], set(), set(), set()) == []
    assert claims_to_release("uid-m", "new", [pvc("old", "b")], set(), set(), set()) == []


def test_mounts_and_rollouts() -> None:
    assert mounted_claims(deployment("a", "weights")) == {"a", "weights"}
    assert rollout_complete(deployment("a"))
    assert not rollout_complete(deployment("a", replicas=2, updated=1))  # old pods left
    stale = deployment("a")
    stale["status"]["observedGeneration"] = 1
    assert not rollout_complete(stale)
    assert rollout_complete(None)


def controller(pvcs: list[dict[str, Any]], deployments: dict[str, Any],
               users: dict[str, list[str]], jobs: dict[str, list[Any]] | None = None,
               models: dict[str, dict[str, Any]] | None = None,
               ) -> tuple[Controller, RecordingApplier]:
    indices = {
        "models": {("ns", n): [{"metadata": {"name": n, "namespace": "ns", "uid": f"uid-{n}"},
                                "spec": spec}] for n, spec in (models or {}).items()},
        "pvcs": {("ns", p["metadata"]["name"]): [p] for p in pvcs},
        "deployments": {("ns", n): [d] for n, d in deployments.items()},
        "claim_users": {("ns", c): [ClaimUser(OwnerRef(n, f"uid-{n}"), None) for n in ns_]
                        for c, ns_ in users.items()},
        "claim_jobs": {("ns", c): js for c, js in (jobs or {}).items()},
    }
    c = Controller(client=None, caches=Caches(indices))  # type: ignore[arg-type]
    applier = RecordingApplier()
    c.applier = applier  # type: ignore[assignment]
    return c, applier


class Plan:
    namespace, uid, name, claim = "ns", "uid-m", "m", "new"


def test_moving_off_a_delete_claim_releases_it_once_the_old_pods_are_gone() -> None:
    """Reproduced: the old PVC stayed owned by the model although nothing named it."""
    old = pvc("old", "m")
    # the Deployment still serves from the old claim (the new artifact compiles)
    c, applier = controller([old, pvc("new", "m")], {"m": deployment("old")}, {"new": ["m"]})
    asyncio.run(c.claims.release(Plan(), deployment("old")))
    assert applier.writes == []
    # moved, but a pod of the old ReplicaSet is still there
    c, applier = controller([old], {"m": deployment("new", replicas=2)}, {"new": ["m"]})
    asyncio.run(c.claims.release(Plan(), deployment("new", replicas=2)))
    assert applier.writes == []
    # a precompile or GC Job still writes to it
    running = {"metadata": {"name": "j"}, "status": {"active": 1}}
    c, applier = controller([old], {"m": deployment("new")}, {"new": ["m"]}, {"old": [running]})
    asyncio.run(c.claims.release(Plan(), deployment("new")))
    assert applier.writes == []
    # rolled out: nobody names it, so retainPolicy Delete deletes it
    c, applier = controller([old], {"m": deployment("new")}, {"new": ["m"]})
    asyncio.run(c.claims.release(Plan(), deployment("new")))
    assert applier.writes == [("delete", "PersistentVolumeClaim")]
    # another model names it (cache.claimName) and serves from it: only the reference goes
    c, applier = controller([old], {"m": deployment("new"), "b": deployment("old")},
                            {"new": ["m"], "old": ["b"]})
    asyncio.run(c.claims.release(Plan(), deployment("new")))
    assert applier.writes == [("release", "old", [])]


def test_a_claim_a_model_with_an_invalid_spec_names_is_never_deleted() -> None:
    """Issue 31, 8: a model whose spec fails validation now (stricter rules after an
    operator upgrade) is no claim user, so only the Delete users counted: the claim it names
    (retainPolicy Retain) was deleted when they moved off it."""
    from spyre_operator.decide.release import claim_named_by

    old = pvc("old", "m")
    invalid = {"model": {"uri": "not a uri"},
               "cache": {"volume": {"name": "old", "retainPolicy": "Retain"}}}
    c, applier = controller([old], {"m": deployment("new")}, {"new": ["m"]},
                            models={"legacy": invalid})
    asyncio.run(c.claims.release(Plan(), deployment("new")))
    assert applier.writes == [("release", "old", [])], applier.writes  # dropped from only
    assert claim_named_by({}) == "spyre-compile-cache"
    assert claim_named_by({"cache": {"claimName": "mine"}}) == "mine"
    assert claim_named_by({"cache": "garbage"}) is None


def test_a_claim_another_model_names_has_no_owners() -> None:
    """Model a makes claim x (retainPolicy Delete), model b names it by cache.claimName:
    deleting a garbage-collected x under b (ownerReferences named only a)."""
    from spyre_operator.decide import Observed, decide

    from .samples import model
    from .test_reconcile import NOW

    spec = {"model": {"uri": "hf://ibm-granite/granite-3.3-8b-instruct@main"},
            "cache": {"volume": {"name": "x", "retainPolicy": "Delete"}}}
    a = model("a", spec)
    pvc_of = next(o for o in decide(a, Observed(), NOW).apply if o.kind == "PersistentVolumeClaim")
    assert [r.name for r in pvc_of.metadata.ownerReferences] == ["a"]
    obs = Observed(claim_name_users=[OwnerRef("b", "uid-b")])
    pvc_of = next(o for o in decide(a, obs, NOW).apply if o.kind == "PersistentVolumeClaim")
    assert not pvc_of.metadata.ownerReferences


def test_a_new_claim_name_user_wakes_the_models_that_made_the_claim() -> None:
    from spyre_operator.api import SpyreModelSpec
    from spyre_operator.desired.plan import plan_model

    from .samples import GENERATE

    c, _ = controller([], {}, {"x": ["a", "b"]})
    b = plan_model("b", "ns", "uid-b", SpyreModelSpec.model_validate(
        {**GENERATE, "cache": {"claimName": "x"}}))
    assert c.router.claim_peers_if_changed(("ns", "b"), b) == [("ns", "a")]
    assert c.router.claim_peers_if_changed(("ns", "b"), b) == []  # a status write: nothing new
