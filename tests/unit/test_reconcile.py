"""reconcile.decide: every transition, without a cluster."""

from __future__ import annotations

import copy
import json
from typing import Any

from spyre_operator.api import SpyreModelSpec
from spyre_operator.decide import Observed, decide
from spyre_operator.decide import conditions as C
from spyre_operator.desired.plan import plan_model

from .samples import EMBED, GENERATE, model

NOW = "2026-11-21T10:00:00Z"
LATER = "2026-11-21T10:05:00Z"


def kinds(d: Any) -> list[str]:
    return [o.kind for o in d.apply]


def cond(d: Any, type_: str) -> dict[str, Any]:
    c = C.find(d.status["conditions"], type_)
    assert c is not None
    return c


def plan_for(m: dict[str, Any]) -> Any:
    meta = m["metadata"]
    return plan_model(meta["name"], meta["namespace"], meta["uid"],
                      SpyreModelSpec.model_validate(m["spec"]))


def job_obj(m: dict[str, Any], state: str | None) -> dict[str, Any]:
    plan = plan_for(m)
    status: dict[str, Any] = {"startTime": "2026-11-21T10:00:00Z"}
    if state == "Complete":
        status.update(conditions=[{"type": "Complete", "status": "True"}],
                      completionTime="2026-11-21T10:02:30Z", succeeded=1)
    elif state == "Failed":
        status.update(conditions=[{"type": "Failed", "status": "True",
                                   "reason": "BackoffLimitExceeded",
                                   "message": "Job has reached the specified backoff limit"}])
    else:
        status["active"] = 1
    return {"metadata": {"name": plan.job_name, "uid": "job-uid", "resourceVersion": "5",
                         "ownerReferences": [{"kind": "SpyreModel", "name": "m", "uid": "uid-m"}]},
            "status": status}


def deployment_obj(d: Any, ready: int, replicas: int = 1) -> dict[str, Any]:
    dep = next(o for o in d.apply if o.kind == "Deployment").to_dict()
    dep["metadata"]["generation"] = 1
    dep["status"] = {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                     "readyReplicas": ready, "availableReplicas": ready}
    return dep


BOUND = {"metadata": {"labels": {"app.kubernetes.io/managed-by": "spyre-model-operator"}},
         "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}}


def test_new_model_creates_cache_job_and_service_but_no_deployment() -> None:
    d = decide(model("m", GENERATE), Observed(), NOW)
    assert "PersistentVolumeClaim" in kinds(d) and "Service" in kinds(d)
    assert "Deployment" not in kinds(d)
    assert d.job is not None
    assert cond(d, C.READY)["status"] == "False" and cond(d, C.READY)["reason"] == C.COMPILING
    assert cond(d, C.ARTIFACT_READY)["reason"] == C.COMPILING
    assert cond(d, C.PROGRESSING)["status"] == "True"
    assert cond(d, C.CACHE_VOLUME_READY)["reason"] == C.CLAIM_CREATING
    assert d.status["artifact"]["phase"] == "Pending"
    assert d.status["endpoint"] == "http://m.ns.svc:8000/v1"


def test_completed_job_fills_artifact_from_termination_summary_and_deploys() -> None:
    m = model("m", GENERATE)
    plan = plan_for(m)
    summary = {"key": plan.key, "path": plan.artifact_dir(), "compileSeconds": 151.25,
               "sizeBytes": 3 * 2**30, "versions": {"vllm": "0.28.0"}}
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"),
                   job_pods=[{"name": "p", "terminated": {"exitCode": 0,
                                                          "message": json.dumps(summary)}}])
    d = decide(m, obs, NOW)
    art = d.status["artifact"]
    assert art["phase"] == "Ready" and art["compileSeconds"] == 151.25
    assert art["sizeBytes"] == 3 * 2**30 and art["completedAt"] == "2026-11-21T10:02:30Z"
    assert cond(d, C.ARTIFACT_READY)["status"] == "True"
    assert cond(d, C.CACHE_VOLUME_READY)["status"] == "True"
    dep = next(o for o in d.apply if o.kind == "Deployment")
    assert dep.metadata.annotations["serving.spyre.dev/artifact-key"] == plan.key
    # not yet available: Ready is False while rolling out
    assert cond(d, C.READY)["status"] == "False"


def test_ready_when_deployment_available() -> None:
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    first = decide(m, obs, NOW)
    obs.deployment = deployment_obj(first, ready=1)
    d = decide(m, obs, NOW)
    assert cond(d, C.READY)["status"] == "True" and cond(d, C.READY)["reason"] == C.SERVING
    assert cond(d, C.PROGRESSING)["status"] == "False"
    assert cond(d, C.DEGRADED)["status"] == "False"
    assert d.status["readyReplicas"] == 1
    assert d.status["servingArtifactKey"] == plan_for(m).key


def test_idle_recompute_is_identical() -> None:
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1)
    d1 = decide(m, obs, NOW)
    m["status"] = d1.status
    d2 = decide(m, obs, LATER)
    assert d2.status == d1.status, "an idle resync must produce identical status"
    assert d2.events == []


def test_failed_job_is_degraded_with_termination_message() -> None:
    m = model("m", GENERATE)
    failure = {"reason": "CompileFailed", "message": "out of device memory for shape 4x4096"}
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Failed"),
                   job_pods=[{"name": "p", "terminated": {"exitCode": 1,
                                                          "message": json.dumps(failure)}}])
    d = decide(m, obs, NOW)
    deg = cond(d, C.DEGRADED)
    assert deg["status"] == "True" and deg["reason"] == C.PRECOMPILE_FAILED
    assert "out of device memory" in deg["message"] and "CompileFailed" in deg["message"]
    assert cond(d, C.ARTIFACT_READY)["reason"] == C.PRECOMPILE_FAILED
    assert cond(d, C.READY)["reason"] == C.PRECOMPILE_FAILED
    assert d.status["artifact"]["phase"] == "Failed"
    assert not d.delete
    assert any(e[0] == "Warning" and e[1] == C.PRECOMPILE_FAILED for e in d.events)


def test_unrelated_spec_change_after_failure_does_not_retry() -> None:
    """A generation bump (a /scale, a replicas edit) is no reason to delete a failed Job."""
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Failed"))
    m["status"] = decide(m, obs, NOW).status
    m["metadata"]["generation"] = 2
    m["spec"] = {**GENERATE, "replicas": 3}
    d = decide(m, obs, NOW)
    assert not d.delete
    assert d.status["artifact"]["phase"] == "Failed" and d.status["artifact"]["nextRetryAt"]


def test_compile_edit_keeps_serving_old_artifact_until_new_one_is_ready() -> None:
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    old_key = plan_for(m).key
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1)
    # edit maxModelLen: new key, new Job running
    m2 = copy.deepcopy(m)
    m2["spec"] = {**GENERATE, "compile": {"maxModelLen": 3072}, "replicas": 2}
    m2["metadata"]["generation"] = 2
    obs2 = Observed(cache_pvc=BOUND, job=job_obj(m2, None), deployment=obs.deployment)
    d = decide(m2, obs2, NOW)
    dep = next(o for o in d.apply if o.kind == "Deployment")
    assert dep.metadata.annotations["serving.spyre.dev/artifact-key"] == old_key
    args = dep.spec.template.spec.containers[0].args
    assert args[args.index("--max-model-len") + 1] == "8192", "old shape while old artifact"
    assert dep.spec.replicas == 2, "replicas edits apply even while compiling"
    assert d.job is not None and d.job.metadata.name == plan_for(m2).job_name
    assert cond(d, C.READY)["reason"] == C.SERVING_PREVIOUS_ARTIFACT
    assert cond(d, C.PROGRESSING)["reason"] == C.COMPILING
    # new artifact completes: the Deployment switches
    obs2.job = job_obj(m2, "Complete")
    d = decide(m2, obs2, NOW)
    dep = next(o for o in d.apply if o.kind == "Deployment")
    assert dep.metadata.annotations["serving.spyre.dev/artifact-key"] == plan_for(m2).key


def test_missing_existing_claim_is_reported() -> None:
    spec = {**GENERATE, "cache": {"claimName": "nope"}}
    d = decide(model("m", spec), Observed(), NOW)
    assert "PersistentVolumeClaim" not in kinds(d)
    assert d.job is None
    assert cond(d, C.CACHE_VOLUME_READY)["reason"] == C.CLAIM_NOT_FOUND
    assert cond(d, C.DEGRADED)["status"] == "True"


def test_pending_claim_is_reported_but_compile_proceeds() -> None:
    pending = {**BOUND, "status": {"phase": "Pending"}}
    d = decide(model("m", GENERATE), Observed(cache_pvc=pending), NOW)
    c = cond(d, C.CACHE_VOLUME_READY)
    assert c["status"] == "False" and c["reason"] == C.CLAIM_PENDING
    assert d.job is not None  # WaitForFirstConsumer classes bind only once a pod uses them


def test_foreign_pvc_with_same_name_is_not_touched() -> None:
    foreign = {"metadata": {"labels": {}}, "status": {"phase": "Bound"}}
    d = decide(model("m", GENERATE), Observed(cache_pvc=foreign), NOW)
    assert "PersistentVolumeClaim" not in kinds(d)


def test_pdb_only_with_more_than_one_replica() -> None:
    assert "PodDisruptionBudget" not in kinds(decide(model("m", GENERATE), Observed(), NOW))
    spec = {**GENERATE, "replicas": 2}
    assert "PodDisruptionBudget" in kinds(decide(model("m", spec), Observed(), NOW))
    d = decide(model("m", GENERATE), Observed(pdb={"metadata": {}}), NOW)
    assert [r.__name__ for r, _ in d.delete] == ["PodDisruptionBudget"]


def test_engine_refusing_to_start_is_surfaced() -> None:
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=0)
    key = plan_for(m).short_key
    msg = json.dumps({"reason": "ArtifactMismatch", "message": "no catalog entry for tp=1"})
    obs.server_pods = [{"name": "m-abc", "artifact": key,
                        "terminated": {"exitCode": 2, "message": msg}}]
    d = decide(m, obs, NOW)
    assert cond(d, C.DEGRADED)["reason"] == C.ARTIFACT_MISMATCH
    assert "no catalog entry for tp=1" in cond(d, C.DEGRADED)["message"]
    assert cond(d, C.READY)["reason"] == C.ARTIFACT_MISMATCH


def test_corrupt_artifact_is_the_condition_reason() -> None:
    """A serving pod refusing a truncated artifact shows as ArtifactCorrupt, not EngineFailed."""
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=0)
    key = plan_for(m).short_key
    msg = json.dumps(
        {"reason": "ArtifactCorrupt", "message": "/c/art does not match the manifest: missing: g"}
    )
    obs.server_pods = [{"name": "m-abc", "artifact": key,
                        "terminated": {"exitCode": 1, "message": msg}}]
    d = decide(m, obs, NOW)
    for type_ in (C.DEGRADED, C.READY):
        assert cond(d, type_)["reason"] == C.ARTIFACT_CORRUPT
        assert "missing: g" in cond(d, type_)["message"]
    assert d.events and d.events[0][0] == "Warning" and d.events[0][1] == C.ARTIFACT_CORRUPT
    # An engine reason that says nothing about the artifact stays EngineFailed.
    other = json.dumps({"reason": "Terminated", "message": "stopped"})
    obs.server_pods[0]["terminated"]["message"] = other
    assert cond(decide(m, obs, NOW), C.READY)["reason"] == C.ENGINE_FAILED


def test_shared_job_lists_every_owner() -> None:
    from spyre_operator.desired.plan import OwnerRef

    owners = [OwnerRef("a", "uid-a"), OwnerRef("b", "uid-b")]
    d = decide(model("b", GENERATE, uid="uid-b"), Observed(job_owners=owners), NOW)
    assert [r.name for r in d.job.metadata.ownerReferences] == ["a", "b"]


def test_pooling_model_args() -> None:
    d = decide(model("e", EMBED), Observed(), NOW)
    args = d.job.spec.template.spec.containers[0].args
    assert args[args.index("--warmup-shapes") + 1] == "64x4,512x1"
    assert args[args.index("--backend") + 1] == "eager"
    # CPU backend: the precompile pod needs no cards and no Spyre scheduler
    res = d.job.spec.template.spec.containers[0].resources
    assert not (res.limits or {})


def test_an_output_mismatch_is_the_condition_reason_and_compiles_nothing_again() -> None:
    """Issue 30: a serving pod whose answers left the artifact's reference answers stops with
    OutputMismatch; the model says so (the first diverging prompt and position are in the
    message) and does not recompile: the same inputs give the same graphs."""
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=0)
    key = plan_for(m).short_key
    msg = json.dumps({"reason": "OutputMismatch", "message": "prompt 0 (p0) position 3: "
                      "expected token 12 (p 0.90), got 7 (p 0.20)",
                      "outputCheck": {"checked": 6, "firstMismatch": {"position": 3}}})
    obs.server_pods = [{"name": "m-abc", "artifact": key,
                        "terminated": {"exitCode": 1, "message": msg}}]
    d = decide(m, obs, NOW)
    for type_ in (C.DEGRADED, C.READY):
        assert cond(d, type_)["reason"] == C.OUTPUT_MISMATCH
        assert "position 3" in cond(d, type_)["message"]
    assert d.events and d.events[0][:2] == ("Warning", C.OUTPUT_MISMATCH)
