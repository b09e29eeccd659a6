"""Rollback without recompiling: status.cache remembers the artifacts on the claim (issue 14)."""

from __future__ import annotations

import copy
import json
from typing import Any

from spyre_operator.decide import MAX_REMEMBERED, Observed, decide, served_key
from spyre_operator.decide import conditions as C
from spyre_operator.decide.observed import RETRY_ANNOTATION
from spyre_operator.desired import names

from .samples import GENERATE, model
from .test_reconcile import BOUND, cond, deployment_obj, job_obj, plan_for

T0, T1, T2, T3 = (f"2026-11-21T10:0{i}:00Z" for i in range(4))
CLAIM = {**BOUND, "metadata": {**BOUND["metadata"], "uid": "pvc-uid-1",
                               "creationTimestamp": "2026-11-21T09:00:00Z"}}
SUMMARY = json.dumps({"key": None, "path": "/cache/x", "compileSeconds": 150.0,
                      "sizeBytes": 3 * 2**30, "versions": {}})


def _with_status(m: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    m = copy.deepcopy(m)
    m["status"] = status
    return m


def _complete(m: dict[str, Any]) -> Observed:
    obs = Observed(cache_pvc=CLAIM, job=job_obj(m, "Complete"))
    obs.job_pods = [{"name": "j", "terminated": {"exitCode": 0, "message": SUMMARY,
                                                  "finishedAt": T0}}]
    return obs


def _deployment_key(d: Any) -> str | None:
    dep = next((o for o in d.apply if o.kind == "Deployment"), None)
    return served_key(dep.to_dict()) if dep is not None else None


def _history() -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Model compiled and served at shape A, then edited to B, compiled and served: the state
    just before a revert to A."""
    a = model("m", GENERATE)
    d = decide(a, _complete(a), T0)
    assert d.status["artifact"]["phase"] == "Ready"
    [rec] = d.status["cache"]["artifacts"]
    assert rec["key"] == plan_for(a).key and rec["inUse"] and rec["claimUID"] == "pvc-uid-1"
    assert rec["sizeBytes"] == 3 * 2**30 and "maxModelLen=" in rec["shape"]
    dep_a = deployment_obj(d, ready=1)

    b = _with_status(model("m", {**GENERATE, "compile": {"maxModelLen": 3072}}), d.status)
    assert plan_for(b).key != plan_for(a).key
    obs = Observed(cache_pvc=CLAIM, job=job_obj(b, None), deployment=dep_a)
    d = decide(b, obs, T1)
    assert d.status["artifact"]["phase"] == "Compiling"
    [rec] = d.status["cache"]["artifacts"]
    assert rec["inUse"] and rec["lastUsed"] == T0  # still served: in use, unchanged
    obs = _complete(b)
    obs.deployment = dep_a
    d = decide(b, obs, T2)
    keys = [(r["key"], r["inUse"], r["lastUsed"]) for r in d.status["cache"]["artifacts"]]
    assert keys == [(plan_for(b).key, True, T2), (plan_for(a).key, True, T0)]  # A still served
    dep_b = deployment_obj(d, ready=1)
    obs.deployment = dep_b
    b = _with_status(b, d.status)
    d = decide(b, obs, T2)
    keys = [(r["key"], r["inUse"], r["lastUsed"]) for r in d.status["cache"]["artifacts"]]
    assert keys == [(plan_for(b).key, True, T2), (plan_for(a).key, False, T2)]
    return a, _with_status(b, d.status), dep_b


def test_revert_to_a_shape_still_on_the_claim_serves_it_without_a_job() -> None:
    a, b, dep_b = _history()
    # Revert the edit; A's Job is gone (deleted by hand, or by a cleanup policy).
    reverted = _with_status(a, b["status"])
    reverted["metadata"]["generation"] = 3
    d = decide(reverted, Observed(cache_pvc=CLAIM, deployment=dep_b), T3)
    assert d.job is None, "a revert must not compile"
    assert d.status["artifact"]["phase"] == "Ready"
    assert d.status["artifact"]["key"] == plan_for(a).key
    assert d.status["artifact"]["sizeBytes"] == 3 * 2**30
    assert _deployment_key(d) == plan_for(a).key
    art = cond(d, C.ARTIFACT_READY)
    assert art["status"] == "True" and "compiled earlier" in art["message"]
    st = d.status["cache"]
    assert [(r["key"], r["inUse"]) for r in st["artifacts"]] == [
        (plan_for(a).key, True), (plan_for(b).key, True)]  # B is still served until rolled out
    assert st["usedBytes"] == 6 * 2**30 and st["usage"] == "6.0 GiB in 2"


def test_an_idle_resync_writes_the_same_status() -> None:
    _, b, dep_b = _history()
    obs = _complete(b)
    obs.deployment = dep_b
    first = decide(b, obs, T3)
    again = decide(_with_status(b, first.status), obs, "2026-11-21T11:00:00Z")
    assert again.status == first.status


def test_a_recreated_claim_forgets_what_the_old_one_held() -> None:
    a, b, dep_b = _history()
    new_claim = copy.deepcopy(CLAIM)
    new_claim["metadata"]["uid"] = "pvc-uid-2"
    reverted = _with_status(a, b["status"])
    d = decide(reverted, Observed(cache_pvc=new_claim, deployment=dep_b), T3)
    assert d.job is not None, "the new claim holds no artifact: compile"
    assert d.status["artifact"]["phase"] == "Pending"
    assert "cache" not in d.status or not d.status["cache"]["artifacts"]


def test_a_remembered_artifact_the_servers_refuse_is_compiled_again() -> None:
    a, b, dep_b = _history()
    reverted = _with_status(a, b["status"])
    msg = json.dumps({"reason": "ArtifactCorrupt", "message": "manifest is missing"})
    obs = Observed(cache_pvc=CLAIM, deployment=dep_b)
    obs.server_pods = [{"name": "m-x", "artifact": plan_for(a).short_key,
                        "terminated": {"exitCode": 1, "message": msg}}]
    d = decide(reverted, obs, T3)
    assert d.job is not None
    assert "refused the artifact (ArtifactCorrupt)" in d.status["artifact"]["message"]
    # A pod of another key refusing its artifact changes nothing for this one.
    obs.server_pods[0]["artifact"] = names.short_key("other")
    assert decide(reverted, obs, T3).job is None


def test_a_remembered_artifact_whose_servers_answer_wrongly_is_not_compiled_again() -> None:
    """Issue 30: OutputMismatch says the artifact runs but answers unlike its reference; a
    compile of the same inputs gives the same graphs, so none is started for it."""
    a, b, dep_b = _history()
    reverted = _with_status(a, b["status"])
    msg = json.dumps({"reason": "OutputMismatch", "message": "prompt 0 (p0) position 3: ..."})
    obs = Observed(cache_pvc=CLAIM, deployment=dep_b)
    obs.server_pods = [{"name": "m-x", "artifact": plan_for(a).short_key,
                        "terminated": {"exitCode": 1, "message": msg}}]
    assert decide(reverted, obs, T3).job is None


def test_the_list_is_bounded_and_keeps_the_most_recently_used() -> None:
    a = model("m", GENERATE)
    status: dict[str, Any] = {"cache": {"artifacts": [
        {"key": f"k{i:02d}", "claim": plan_for(a).claim, "claimUID": "pvc-uid-1",
         "sizeBytes": 1, "inUse": False, "lastUsed": f"2026-11-20T10:{i:02d}:00Z"}
        for i in range(MAX_REMEMBERED + 4)]}}
    d = decide(_with_status(a, status), _complete(a), T0)
    arts = d.status["cache"]["artifacts"]
    assert len(arts) == MAX_REMEMBERED
    assert arts[0]["key"] == plan_for(a).key and arts[0]["inUse"]
    assert [r["key"] for r in arts[1:4]] == ["k19", "k18", "k17"]
    assert "k00" not in {r["key"] for r in arts}


def test_keys_a_gc_job_removed_leave_the_status_unless_in_use_again() -> None:
    a, b, dep_b = _history()
    key_a, key_b = plan_for(a).key, plan_for(b).key
    obs = _complete(b)
    obs.deployment = dep_b
    # key_b's removal is older than its compile (a stale report): it stays, Ready.
    obs.collected = {key_a: "2026-11-21T10:05:00Z", key_b: "2026-11-21T10:01:00Z"}
    d = decide(b, obs, T3)
    assert [r["key"] for r in d.status["cache"]["artifacts"]] == [key_b]
    assert d.status["cache"]["usage"].endswith("in 1")
    assert cond(d, C.ARTIFACT_READY)["status"] == "True"


def _claim_of(capacity: str) -> dict[str, Any]:
    return {**CLAIM, "status": {**CLAIM["status"], "capacity": {"storage": capacity}}}


def test_claim_nearly_full_is_a_warning_on_cache_volume_ready_past_the_threshold() -> None:
    m = model("m", GENERATE)
    obs = _complete(m)
    obs.cache_pvc = _claim_of("10Gi")
    obs.claim_artifact_bytes = 9 * 2**30  # 90% >= the default 85%
    c = cond(decide(m, obs, T1), C.CACHE_VOLUME_READY)
    assert (c["status"], c["reason"]) == ("True", C.CLAIM_NEARLY_FULL)
    assert "9.0 GiB" in c["message"] and "90%" in c["message"] and "85%" in c["message"]
    assert C.event_type(C.CLAIM_NEARLY_FULL) == "Warning"

    obs.claim_artifact_bytes = 8 * 2**30  # 80%: below
    c = cond(decide(m, obs, T1), C.CACHE_VOLUME_READY)
    assert c["reason"] == C.CLAIM_BOUND

    tighter = copy.deepcopy(m)
    tighter["spec"]["cache"] = {"usageWarningPercent": 75}
    obs2 = _complete(tighter)
    obs2.cache_pvc, obs2.claim_artifact_bytes = _claim_of("10Gi"), 8 * 2**30
    assert cond(decide(tighter, obs2, T1), C.CACHE_VOLUME_READY)["reason"] == C.CLAIM_NEARLY_FULL
    # an unknown capacity (a claim still binding, a driver that does not report it) says nothing
    obs.cache_pvc, obs.claim_artifact_bytes = CLAIM, 9 * 2**30
    assert cond(decide(m, obs, T1), C.CACHE_VOLUME_READY)["reason"] == C.CLAIM_BOUND


# A finished GC Job removed the key from the claim after it was compiled (10:02:30 in every
# Job here): what status remembers is gone from the volume.
GC_AT = "2026-11-21T10:05:00Z"
BEFORE_COMPILE = "2026-11-21T10:01:00Z"


def test_a_revert_to_a_key_a_gc_job_removed_since_compiles_it_again() -> None:
    a, b, dep_b = _history()
    reverted = _with_status(a, b["status"])
    reverted["metadata"]["generation"] = 3
    obs = Observed(cache_pvc=CLAIM, deployment=dep_b)
    obs.collected = {plan_for(a).key: GC_AT}
    d = decide(reverted, obs, T3)
    assert d.job is not None and d.job.metadata.name == plan_for(a).job_name
    art = cond(d, C.ARTIFACT_READY)
    assert art["status"] == "False" and "garbage collection" in art["message"], art
    assert _deployment_key(d) == plan_for(b).key  # B serves until A is compiled again


def test_a_served_key_a_gc_job_removed_anyway_is_not_trusted_from_memory() -> None:
    """Status says Ready ("compiled earlier, not again") for the key its Deployment serves,
    but a finished GC Job reports it removed after that compile: compile it again."""
    _, b, dep_b = _history()
    obs = Observed(cache_pvc=CLAIM, deployment=dep_b)  # b's Job is gone (its TTL)
    obs.collected = {plan_for(b).key: GC_AT}
    d = decide(b, obs, T3)
    art = cond(d, C.ARTIFACT_READY)
    assert art["status"] == "False" and "garbage collection" in art["message"], art
    assert d.job is not None and d.job.metadata.name == plan_for(b).job_name
    # A removal before this compile is a stale report: the artifact compiled since is there.
    obs.collected = {plan_for(b).key: BEFORE_COMPILE}
    d = decide(b, obs, T3)
    assert cond(d, C.ARTIFACT_READY)["status"] == "True" and d.job is None


def test_a_complete_job_whose_artifact_a_gc_job_removed_since_runs_again() -> None:
    _, b, dep_b = _history()
    obs = _complete(b)
    obs.deployment = dep_b
    obs.collected = {plan_for(b).key: GC_AT}
    d = decide(b, obs, T3)
    art = cond(d, C.ARTIFACT_READY)
    assert art["status"] == "False" and "garbage collection" in art["message"], art
    assert [(r.__name__, n) for r, n in d.delete] == [("Job", plan_for(b).job_name)]
    obs.collected = {plan_for(b).key: BEFORE_COMPILE}
    assert cond(decide(b, obs, T3), C.ARTIFACT_READY)["status"] == "True"


def _a_rolled_out(spec: dict[str, Any] = GENERATE) -> tuple[dict[str, Any], Any]:
    """Model ``m`` compiled, its Deployment rolled out with its replica available, and the
    reconcile that saw it: (that Deployment, that reconcile's decision)."""
    a = model("m", spec)
    d = decide(a, _complete(a), T0)
    dep_a = deployment_obj(d, ready=1)
    obs = _complete(a)
    obs.deployment = dep_a
    return dep_a, decide(_with_status(a, d.status), obs, T0)


def _switched_to_b() -> tuple[dict[str, Any], dict[str, Any], Observed]:
    """A served and rolled out; the spec edited to B, compiled; the Deployment switched to B
    with A's pod still serving (maxUnavailable 0) and B's first pod not Ready yet."""
    a = model("m", GENERATE)
    dep_a, d = _a_rolled_out()
    assert d.status["lastGoodArtifactKey"] == plan_for(a).key
    assert json.loads(d.status["lastGoodServedSpec"])["compile"] == json.loads(
        d.status["servedSpec"])["compile"]
    b = _with_status(model("m", {**GENERATE, "compile": {"maxModelLen": 3072}}), d.status)
    obs = _complete(b)
    obs.deployment = dep_a
    d = decide(b, obs, T1)
    assert _deployment_key(d) == plan_for(b).key
    dep_b = deployment_obj(d, ready=1, replicas=2)
    dep_b["status"]["updatedReplicas"] = 1  # B's pod is not Ready: A's serves
    obs.deployment = dep_b
    d = decide(_with_status(b, d.status), obs, T1)
    assert d.status["lastGoodArtifactKey"] == plan_for(a).key, "B has not rolled out"
    return a, _with_status(b, d.status), obs


MISMATCH = json.dumps({"reason": "OutputMismatch",
                       "message": "prompt 0 (p0) position 3: expected token 17, got 42"})


def test_an_artifact_whose_answers_differ_is_refused_and_the_previous_one_serves_again() -> None:
    """Issue 30: B's first pod stopped on OutputMismatch: B is Failed (no compile: the same
    inputs give the same graphs), the Deployment goes back to A (status remembers it as the
    last one rolled out), Ready says A serves and why B does not."""
    a, b, obs = _switched_to_b()
    obs.server_pods = [{"name": "m-b", "artifact": plan_for(b).short_key,
                        "terminated": {"exitCode": 1, "message": MISMATCH}}]
    d = decide(b, obs, T2)
    art = d.status["artifact"]
    assert (art["key"], art["phase"], art["reason"]) == (plan_for(b).key, "Failed",
                                                         "OutputMismatch")
    assert "position 3: expected token 17, got 42" in art["message"]
    assert plan_for(b).job_name not in [n for _, n in d.delete], "no compile again"
    assert _deployment_key(d) == plan_for(a).key, "the Deployment serves A again"
    ready = cond(d, C.READY)
    assert (ready["status"], ready["reason"]) == ("True", C.SERVING_PREVIOUS_ARTIFACT)
    assert "output check" in ready["message"] and "expected token 17" in ready["message"]
    assert cond(d, C.ARTIFACT_READY)["reason"] == "OutputMismatch"
    assert any(e[0] == "Warning" and "OutputMismatch" in e[2] for e in d.events)

    # Rolled back: B's pods are gone, status remembers the refusal; A keeps serving.
    back = deployment_obj(d, ready=1)
    obs2 = _complete(b)
    obs2.deployment = back
    b2 = _with_status(b, d.status)
    d2 = decide(b2, obs2, T3)
    assert d2.status["artifact"]["phase"] == "Failed"
    assert _deployment_key(d2) == plan_for(a).key
    assert d2.status["lastGoodArtifactKey"] == plan_for(a).key

    # The retry annotation asks for the check again: B is Ready and served again.
    b3 = _with_status(b2, d2.status)
    b3["metadata"].setdefault("annotations", {})[RETRY_ANNOTATION] = "1"
    d3 = decide(b3, obs2, T3)
    assert d3.status["artifact"]["phase"] == "Ready"
    assert _deployment_key(d3) == plan_for(b).key
    # ... and the same value once consumed does not undo the next refusal.
    obs2.server_pods = obs.server_pods
    d4 = decide(_with_status(b3, d3.status), obs2, T3)
    assert d4.status["artifact"]["phase"] == "Failed"
    assert _deployment_key(d4) == plan_for(a).key
    d5 = decide(_with_status(b3, d4.status), Observed(cache_pvc=CLAIM, job=obs2.job,
                                                     job_pods=obs2.job_pods,
                                                     deployment=deployment_obj(d4, 1)), T3)
    assert d5.status["artifact"]["phase"] == "Failed"
