"""The operator's garbage-collection decision and the GC Job (pure)."""

from __future__ import annotations

import json

from spyre_operator.api.v1alpha1 import CacheRetention, SpyreModelSpec
from spyre_operator.decide.gc import ClaimUse, keys_to_remove, known_keys, parse_gc_result
from spyre_operator.desired.gcjob import (
    GC_KEYS_ANNOTATION,
    GC_SERVICE_ACCOUNT,
    Sweep,
    build_gc_job,
    gc_job_name,
)
from spyre_operator.desired.plan import plan_model

NOW = "2026-11-22T12:00:00Z"
OLD = "2026-11-20T12:00:00Z"  # two days ago
RECENT = "2026-11-22T11:00:00Z"  # an hour ago


def art(key, last, in_use=False, claim="c", uid="u1"):
    return {"key": key, "claim": claim, "claimUID": uid, "inUse": in_use, "lastUsed": last}


NO_KEEP = CacheRetention(keep_last=0, unused_for_seconds=0)


def test_two_models_sharing_a_claim_an_edit_leaves_the_old_key_unused():
    a = ClaimUse("a", "k2", [art("k2", NOW, True), art("k1", OLD)])
    b = ClaimUse("b", "k3", [art("k3", NOW, True)])
    assert keys_to_remove("c", "u1", [a, b], [], NO_KEEP, NOW) == ["k1"]


def test_a_key_another_model_uses_or_needs_is_never_removed():
    a = ClaimUse("a", "k2", [art("k2", NOW, True), art("k1", OLD)])
    b_lists = ClaimUse("b", "k3", [art("k1", NOW, True)])
    assert keys_to_remove("c", "u1", [a, b_lists], [], NO_KEEP, NOW) == []
    b_needs = ClaimUse("b", "k1", [])  # b's spec needs k1 before it lists it
    assert keys_to_remove("c", "u1", [a, b_needs], [], NO_KEEP, NOW) == []


def test_served_or_compiling_keys_are_protected():
    a = ClaimUse("a", "k3", [art("k1", OLD), art("k2", OLD)])
    assert keys_to_remove("c", "u1", [a], ["k1"], NO_KEEP, NOW) == ["k2"]
    assert keys_to_remove("c", "u1", [a], ["k1", "k2"], NO_KEEP, NOW) == []


def test_retention_period_uses_the_latest_use_over_models():
    r = CacheRetention(keep_last=0, unused_for_seconds=24 * 3600)
    a = ClaimUse("a", "k9", [art("k1", OLD), art("k2", OLD)])
    b = ClaimUse("b", "k8", [art("k2", RECENT)])  # b stopped using k2 an hour ago
    assert keys_to_remove("c", "u1", [a, b], [], r, NOW) == ["k1"]


def test_keep_last_per_model_keeps_the_most_recently_used():
    r = CacheRetention(keep_last=1, unused_for_seconds=0)
    a = ClaimUse(
        "a",
        "k9",
        [art("k9", NOW, True), art("k1", "2026-11-20T00:00:00Z"), art("k2", OLD)],
    )
    assert keys_to_remove("c", "u1", [a], [], r, NOW) == ["k1"]
    assert keys_to_remove("c", "u1", [a], [], CacheRetention(unused_for_seconds=0), NOW) == []


def test_defaults_keep_a_day_and_two_per_model():
    k3 = art("k3", "2026-11-21T00:00:00Z")
    a = ClaimUse("a", "k9", [art("k1", OLD), art("k2", OLD), k3, art("k4", RECENT)])
    # k4 is young; of the old ones k4 and k3 are the last two used: k1 and k2 go
    assert keys_to_remove("c", "u1", [a], [], CacheRetention(), NOW) == ["k1", "k2"]


def test_disabled_removes_nothing():
    a = ClaimUse("a", "k9", [art("k1", OLD)])
    off = CacheRetention(enabled=False, keep_last=0, unused_for_seconds=0)
    assert keys_to_remove("c", "u1", [a], [], off, NOW) == []


def test_other_claims_other_incarnations_and_unknown_times_are_left():
    a = ClaimUse(
        "a",
        "k9",
        [
            art("k1", OLD, claim="other"),
            art("k2", OLD, uid="u0"),  # an older claim of the same name: not on this volume
            {"key": "k3", "claim": "c", "inUse": False},  # no lastUsed: age unknown
            art("k4", OLD),
        ],
    )
    assert keys_to_remove("c", "u1", [a], [], NO_KEEP, NOW) == ["k4"]


def test_a_deleted_model_lists_nothing_so_its_artifacts_stay():
    # a was deleted: only b remains, and b never listed a's key
    b = ClaimUse("b", "k3", [art("k3", NOW, True)])
    assert keys_to_remove("c", "u1", [b], [], NO_KEEP, NOW) == []


def test_parse_gc_result():
    msg = json.dumps(
        {
            "removed": [{"key": "k1", "sizeBytes": 100}],
            "skipped": [{"key": "k2", "reason": "a precompile is writing it"}],
            "freedBytes": 150,
            "remainingBytes": 7,
        }
    )
    r = parse_gc_result("log line\n" + msg)
    assert r is not None
    assert r.removed == {"k1": 100} and r.freed_bytes == 150 and "k2" in r.skipped
    assert r.remaining_bytes == 7
    assert parse_gc_result(json.dumps({"reason": "CatalogError", "message": "x"})) is None
    assert parse_gc_result(None) is None


def _plan(name="a", image="engine:1", access=None):
    spec = {"model": {"uri": "pvc://weights/m"}, "engine": {"image": image}}
    if access:
        spec["cache"] = {"volume": {"accessModes": access}}
    return plan_model(name, "ns", "uid-" + name, SpyreModelSpec.model_validate(spec))


def test_gc_job_is_deterministic_restricted_and_owned_by_the_users():
    plan, other = _plan("a"), _plan("b")
    job = build_gc_job(plan, ["k2", "k1", "k1"], [other.owner, plan.owner])
    assert job.metadata.name == gc_job_name(plan.claim, ["k1", "k2"])
    assert job.metadata.name != gc_job_name(plan.claim, ["k1"])
    assert job.metadata.name != gc_job_name("another-claim", ["k1", "k2"])
    assert job.metadata.annotations[GC_KEYS_ANNOTATION] == "k1,k2"
    assert [r.name for r in job.metadata.ownerReferences] == ["a", "b"]
    assert not any(r.controller for r in job.metadata.ownerReferences)
    assert job.spec.ttlSecondsAfterFinished
    pod = job.spec.template.spec
    c = pod.containers[0]
    assert c.image == "engine:1"
    assert c.args[:1] == ["gc"] and c.args[c.args.index("--remove") + 1] == "k1,k2"
    assert pod.volumes[0].persistentVolumeClaim.claimName == plan.claim
    assert not pod.volumes[0].persistentVolumeClaim.readOnly
    assert pod.securityContext.runAsNonRoot and c.securityContext.allowPrivilegeEscalation is False
    # Its token is for the in-use check only: a ServiceAccount that may list, nothing else.
    assert pod.serviceAccountName == GC_SERVICE_ACCOUNT and pod.automountServiceAccountToken
    assert pod.affinity is None
    rwo = _plan("a", access=["ReadWriteOnce"])
    assert build_gc_job(rwo, ["k1"], [rwo.owner]).spec.template.spec.affinity is not None


def test_known_keys_are_every_status_spec_and_protected_key_of_the_claim():
    statuses = [
        {"cache": {"artifacts": [art("k1", NOW, True), art("k2", OLD, False),
                                 {**art("x", NOW, True), "claim": "other"}]}},
        {},  # a model with no status yet
    ]
    assert known_keys("c", statuses, ["k3", None], ["k4"]) == {"k1", "k2", "k3", "k4"}


def test_parse_gc_result_with_orphans():
    msg = json.dumps({
        "removed": [{"key": "k1", "sizeBytes": 10, "orphan": True}, {"key": "k2",
                                                                     "sizeBytes": 5}],
        "skipped": [], "freedBytes": 15, "orphanCount": 12, "orphanBytes": 99,
        "orphans": [{"key": "o1", "since": 100, "sizeBytes": 9}],
    })
    r = parse_gc_result(msg)
    assert r is not None and r.orphans_removed == {"k1"} and set(r.removed) == {"k1", "k2"}
    assert r.orphans == (("o1", 100),) and r.orphan_count == 12 and r.orphan_bytes == 99


def test_a_sweep_gc_job_keeps_the_known_keys_and_is_named_by_its_time():
    plan = _plan("a")
    sweep = Sweep(frozenset({"k1", "k2"}), 86400, "2026-11-22T00:00:00Z")
    job = build_gc_job(plan, ["k1"], [plan.owner], sweep)
    args = job.spec.template.spec.containers[0].args
    assert args[args.index("--keep") + 1] == "k2"  # k1 is removed, not kept
    assert args[args.index("--orphans-unused-for") + 1] == "86400"
    later = build_gc_job(plan, ["k1"], [plan.owner],
                         Sweep(sweep.keep, 86400, "2026-11-22T01:00:00Z"))
    assert later.metadata.name != job.metadata.name != build_gc_job(
        plan, ["k1"], [plan.owner]).metadata.name
    assert "--keep" not in build_gc_job(plan, ["k1"], [plan.owner]).spec.template.spec.containers[
        0].args


def test_the_gc_pod_reads_the_annotation_and_labels_the_operator_writes():
    """The engine's in-use check (inuse.py) looks for the operator's own names."""
    from spyre_engine import inuse
    from spyre_operator.desired import names

    assert inuse.ARTIFACT_KEY_ANNOTATION == names.ARTIFACT_KEY_ANNOTATION
    assert inuse.MANAGED_SELECTOR == f"{names.MANAGED_BY}={names.MANAGED_BY_VALUE}"
