"""Issue 11: every edit converges and every failure shows in status (pure decide() cases).

Each test is a case the issue reproduced on a cluster or found by reading the code; the
integration tests (tests/integration/test_reconcile_correctness.py) repeat the user-visible
ones on the real control plane.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api import SpyreModelSpec
from spyre_operator.api.v1alpha1 import OPERATOR_ENV, PRECOMPILE_ENV, CacheVolumeSpec
from spyre_operator.control.controller import compact_pod, foreign_owner
from spyre_operator.decide import RETRY_ANNOTATION, Observed, Policy, WriteError, decide
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names
from spyre_operator.desired.deployment import PROGRESS_DEADLINE_SECONDS, STARTUP_BUDGET_SECONDS
from spyre_operator.desired.plan import OwnerRef
from spyre_operator.kube.apply import APPLIED_HASH_ANNOTATION, is_subset, with_applied_hash

from .samples import GENERATE, model
from .test_reconcile import NOW, cond, deployment_obj, job_obj, kinds, plan_for

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def bound(uid: str = "pvc-1", created: str = "2026-11-21T09:00:00Z",
          modes: list[str] | None = None, size: str = "50Gi",
          storage_class: str = "local") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "creationTimestamp": created,
                         "labels": {names.MANAGED_BY: names.MANAGED_BY_VALUE}},
            "spec": {"volumeName": "pv-1", "accessModes": modes or ["ReadWriteMany"],
                     "storageClassName": storage_class,
                     "resources": {"requests": {"storage": size}}},
            "status": {"phase": "Bound"}}


def serving_model(spec: dict[str, Any] | None = None) -> tuple[dict[str, Any], Observed]:
    """A model Ready on its artifact, with the status the operator wrote."""
    m = model("m", spec or GENERATE)
    obs = Observed(cache_pvc=bound(), job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1)
    m["status"] = decide(m, obs, NOW).status
    assert C.find(m["status"]["conditions"], C.READY)["reason"] == C.SERVING
    return m, obs


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["granite-3.3-8b", "3b-model", "a" * 63 + ".example",
                                  "x" * 253, "plain"])
def test_every_valid_model_name_gives_valid_child_names(name: str) -> None:
    svc = names.server_name(name)
    assert DNS1035.match(svc) and len(svc) <= 63, svc
    label = names.model_label_value(name)
    assert len(label) <= 63
    d = decide(model(name, GENERATE), Observed(), NOW)
    assert d.status["endpoint"].startswith(f"http://{svc}.ns.svc:")


def test_valid_service_names_are_kept_and_lookalikes_do_not_collide() -> None:
    assert names.server_name("granite") == "granite"
    assert names.server_name("a.b") != names.server_name("a-b")


# ---------------------------------------------------------------- admission-level rules


def test_rollout_zero_zero_is_invalid() -> None:
    with pytest.raises(ValidationError, match="cannot both be 0"):
        SpyreModelSpec.model_validate({**GENERATE, "serving": {"rollout": {"maxSurge": 0,
                                                                           "maxUnavailable": 0}}})


@pytest.mark.parametrize("mode", ["ReadOnlyMany", "ReadWriteOncePod"])
def test_cache_access_modes_that_cannot_share_are_invalid(mode: str) -> None:
    with pytest.raises(ValidationError):
        CacheVolumeSpec.model_validate({"accessModes": [mode]})


@pytest.mark.parametrize("res", ["ibm.com/spyre_pf_tier0", "ibm.com/aiu_pf", "ibm.com/spyre_vf"])
def test_accelerator_resource_names_beyond_two(res: str) -> None:
    spec = SpyreModelSpec.model_validate({**GENERATE, "accelerator": {"resourceName": res}})
    d = decide(model("m", {**GENERATE, "accelerator": {"resourceName": res}}), Observed(), NOW)
    assert spec.accelerator.resource_name == res and d.job is not None


# ---------------------------------------------------------------- artifact per (claim, key)


def test_switched_claim_compiles_there_and_keeps_serving_the_old_claim() -> None:
    m, obs = serving_model()
    old_claim = plan_for(m).claim
    m2 = copy.deepcopy(m)
    m2["spec"] = {**GENERATE, "cache": {"volume": {"name": "new-cache"}}}
    m2["metadata"]["generation"] = 2
    # the new claim has no Job and no artifact
    d = decide(m2, Observed(cache_pvc=None, deployment=obs.deployment), NOW)
    assert d.job is not None and d.job.metadata.name == plan_for(m2).job_name
    assert d.status["artifact"]["phase"] == "Pending"
    assert d.status["artifact"]["claim"] == "new-cache"
    dep = next(o for o in d.apply if o.kind == "Deployment")
    claims = [v.persistentVolumeClaim.claimName for v in dep.spec.template.spec.volumes
              if v.persistentVolumeClaim]
    assert claims == [old_claim], "the pods stay on the claim that holds their artifact"
    assert cond(d, C.READY)["reason"] == C.SERVING_PREVIOUS_ARTIFACT
    assert cond(d, C.PROGRESSING)["reason"] == C.COMPILING


def test_claim_recreated_after_the_compile_holds_no_artifact() -> None:
    m, obs = serving_model()
    recreated = bound(uid="pvc-2", created="2026-11-21T11:00:00Z")  # after completionTime
    d = decide(m, Observed(cache_pvc=recreated, job=obs.job, deployment=obs.deployment), NOW)
    assert [r.__name__ for r, _ in d.delete] == ["Job"]
    assert d.status["artifact"]["phase"] == "Pending"
    assert cond(d, C.ARTIFACT_READY)["status"] == "False"


def test_remembered_ready_needs_the_same_claim_uid() -> None:
    m, obs = serving_model()
    assert m["status"]["artifact"]["claimUID"] == "pvc-1"
    same = decide(m, Observed(cache_pvc=bound(), deployment=obs.deployment), NOW)
    assert same.status["artifact"]["phase"] == "Ready", "Job removed, artifact still there"
    other = decide(m, Observed(cache_pvc=bound(uid="pvc-9"), deployment=obs.deployment), NOW)
    assert other.status["artifact"]["phase"] == "Pending" and other.job is not None


# ---------------------------------------------------------------- Ready means serving


def test_under_replicated_model_stays_ready() -> None:
    spec = {**GENERATE, "replicas": 3}
    m, obs = serving_model(spec)
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=3, replicas=3)
    m["status"] = decide(m, obs, NOW).status
    obs.deployment["status"].update(replicas=3, readyReplicas=2, availableReplicas=2,
                                    updatedReplicas=3)
    d = decide(m, obs, NOW)
    assert cond(d, C.READY)["status"] == "True" and cond(d, C.READY)["reason"] == C.SERVING
    assert cond(d, C.PROGRESSING)["status"] == "True"
    assert "2/3" in cond(d, C.PROGRESSING)["message"]
    assert not [e for e in d.events if e[1] != C.SERVING], d.events


def test_progress_deadline_covers_the_startup_budget() -> None:
    d = decide(*serving_model()[:1], Observed(cache_pvc=bound(), job=None), NOW)
    m, obs = serving_model()
    dep = next(o for o in decide(m, obs, NOW).apply if o.kind == "Deployment")
    assert dep.spec.progressDeadlineSeconds == PROGRESS_DEADLINE_SECONDS
    assert PROGRESS_DEADLINE_SECONDS > STARTUP_BUDGET_SECONDS
    assert d is not None


# ---------------------------------------------------------------- compile retries


FAILED_AT = "2026-11-21T10:00:00Z"


def failed_job(m: dict[str, Any]) -> dict[str, Any]:
    job = job_obj(m, "Failed")
    job["status"]["conditions"][0]["lastTransitionTime"] = FAILED_AT
    return job


def test_failed_compile_retries_with_bounded_backoff() -> None:
    policy = Policy(retry_base_seconds=60, retry_cap_seconds=240)
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=bound(), job=failed_job(m))
    d = decide(m, obs, "2026-11-21T10:00:30Z", policy)
    assert not d.delete and d.status["artifact"]["nextRetryAt"] == "2026-11-21T10:01:00Z"
    assert d.status["artifact"]["attempts"] == 1 and d.requeue_after == 30
    assert "next retry at 2026-11-21T10:01:00Z" in cond(d, C.ARTIFACT_READY)["message"]
    m["status"] = d.status
    d = decide(m, obs, "2026-11-21T10:01:00Z", policy)
    assert [r.__name__ for r, _ in d.delete] == ["Job"]
    assert d.status["artifact"]["attempts"] == 2
    # attempts 2..5 wait 120, 240, 240, 240 s: doubling, capped
    assert [policy.retry_delay(n) for n in (1, 2, 3, 4, 5)] == [60, 120, 240, 240, 240]


def test_retry_annotation_retries_at_once_and_only_once() -> None:
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=bound(), job=failed_job(m))
    m["status"] = decide(m, obs, "2026-11-21T10:00:01Z").status
    m["metadata"]["annotations"] = {RETRY_ANNOTATION: "1"}
    d = decide(m, obs, "2026-11-21T10:00:02Z")
    assert [r.__name__ for r, _ in d.delete] == ["Job"]
    assert d.status["artifact"]["retryToken"] == "1"
    m["status"] = d.status
    # the new Job fails too: the same token does not retry again
    d = decide(m, obs, "2026-11-21T10:00:03Z")
    assert not d.delete and d.status["artifact"]["phase"] == "Failed"


def test_edit_back_to_a_failed_key_retries() -> None:
    """K1 fails, an edit moves to K2, an edit back to K1: K1 is retried (after backoff)."""
    m = model("m", GENERATE)
    k1_job = failed_job(m)
    m["status"] = decide(m, Observed(cache_pvc=bound(), job=k1_job), NOW).status
    m2 = copy.deepcopy(m)
    m2["spec"] = {**GENERATE, "compile": {"maxModelLen": 8192}}
    m["status"] = decide(m2, Observed(cache_pvc=bound()), NOW).status
    d = decide(m, Observed(cache_pvc=bound(), job=k1_job), "2026-11-21T10:30:00Z")
    assert [r.__name__ for r, _ in d.delete] == ["Job"]


# ---------------------------------------------------------------- failures in status


def test_rejected_write_reaches_status() -> None:
    m = model("m", GENERATE)
    err = WriteError("Service", "m", 403, 'services "m" is forbidden: exceeded quota')
    d = decide(m, Observed(cache_pvc=bound(), write_errors=[err]), NOW)
    deg = cond(d, C.DEGRADED)
    assert deg["status"] == "True" and deg["reason"] == C.RECONCILE_ERROR
    assert "exceeded quota" in deg["message"]
    assert cond(d, C.READY)["reason"] == C.RECONCILE_ERROR
    assert any(e[1] == C.RECONCILE_ERROR and e[0] == "Warning" for e in d.events)


def test_foreign_service_is_not_written_and_reported() -> None:
    m = model("m", GENERATE)
    why = foreign_owner("Service", {"metadata": {"name": "m"}}, "m")
    assert why and "not managed by the operator" in why
    d = decide(m, Observed(cache_pvc=bound(), foreign={"Service": why}), NOW)
    assert "Service" not in kinds(d)
    assert cond(d, C.READY)["reason"] == C.NAME_CONFLICT
    assert cond(d, C.DEGRADED)["reason"] == C.NAME_CONFLICT
    ours = {"metadata": {"name": "m", "ownerReferences": [
        {"kind": "SpyreModel", "name": "m", "uid": "old", "controller": True}]}}
    assert foreign_owner("Service", ours, "m") is None


def test_pods_serving_behind_a_foreign_service_are_not_ready() -> None:
    """Ready said True (Serving) once the Deployment was available, beside Degraded
    NameConflict: but status.endpoint names a Service that is not the operator's, and clients
    that use it never reach the model (CI of 023c858 found it). Ready is False, NameConflict,
    until that Service goes; a foreign PDB (not on the clients' path) leaves Ready alone."""
    from .test_reconcile import deployment_obj, job_obj

    m = model("m", GENERATE)
    obs = Observed(cache_pvc=bound(), job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1)
    assert cond(decide(m, obs, NOW), C.READY)["status"] == "True"
    obs.foreign = {"Service": foreign_owner("Service", {"metadata": {"name": "m"}}, "m")}
    ready = cond(decide(m, obs, NOW), C.READY)
    assert (ready["status"], ready["reason"]) == ("False", C.NAME_CONFLICT), ready
    assert "Service m" in ready["message"] and "endpoint" in ready["message"], ready
    obs.foreign = {"PodDisruptionBudget": "PodDisruptionBudget m is not managed by the operator"}
    assert cond(decide(m, obs, NOW), C.READY)["status"] == "True"


def test_later_model_with_other_volume_settings_gets_a_condition() -> None:
    first = (OwnerRef("a", "uid-a"), CacheVolumeSpec(size="50Gi"))
    mine = CacheVolumeSpec(size="100Gi")
    m = model("b", {**GENERATE, "cache": {"volume": {"size": "100Gi"}}}, uid="uid-b")
    d = decide(m, Observed(cache_pvc=bound(), cache_users=[first, (OwnerRef("b", "uid-b"),
                                                                     mine)]), NOW)
    pvc = next(o for o in d.apply if o.kind == "PersistentVolumeClaim")
    assert pvc.spec.resources.requests["storage"] == "50Gi", "the first model's settings win"
    assert cond(d, C.DEGRADED)["reason"] == C.CLAIM_CONFLICT
    # the first model is not degraded by the later one
    m_a = model("a", GENERATE, uid="uid-a")
    d_a = decide(m_a, Observed(cache_pvc=bound(), cache_users=[first, (OwnerRef("b", "uid-b"),
                                                                         mine)]), NOW)
    assert cond(d_a, C.DEGRADED)["status"] == "False"


def test_a_sharer_whose_retention_or_retain_policy_differs_is_told_it_is_ignored() -> None:
    """Issue 31, 7: GC applies the first user's retention, the PVC its retainPolicy; a later
    model's own were ignored silently."""
    first = (OwnerRef("a", "uid-a"), CacheVolumeSpec())
    for volume, said in (({"retention": {"keepLast": 5}}, "retention.keepLast 5 vs 2"),
                         ({"retention": {"enabled": False}}, "retention.enabled False vs True"),
                         ({"retainPolicy": "Delete"}, "retainPolicy Delete vs Retain")):
        mine = CacheVolumeSpec.model_validate(volume)
        m = model("b", {**GENERATE, "cache": {"volume": volume}}, uid="uid-b")
        d = decide(m, Observed(cache_pvc=bound(), cache_users=[
            first, (OwnerRef("b", "uid-b"), mine)]), NOW)
        deg = cond(d, C.DEGRADED)
        assert deg["reason"] == C.CLAIM_CONFLICT and said in deg["message"], deg["message"]


def test_immutable_pvc_edits_get_a_condition_not_a_write() -> None:
    spec = {**GENERATE, "cache": {"volume": {"storageClassName": "fast", "size": "10Gi"}}}
    d = decide(model("m", spec), Observed(cache_pvc=bound(size="50Gi")), NOW)
    pvc = next(o for o in d.apply if o.kind == "PersistentVolumeClaim")
    assert pvc.spec.storageClassName == "local" and pvc.spec.resources.requests["storage"] == "50Gi"
    deg = cond(d, C.DEGRADED)
    assert deg["reason"] == C.CLAIM_IMMUTABLE and "can only grow" in deg["message"]


def test_recovered_pod_is_not_an_engine_failure() -> None:
    pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{
        "ready": True, "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    assert "terminated" not in compact_pod(pod)
    crashing = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{
        "ready": False, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    assert compact_pod(crashing)["terminated"]["exitCode"] == 137


# ---------------------------------------------------------------- apply: removed fields leave


def test_a_field_the_operator_stops_setting_forces_an_apply() -> None:
    delete = {**GENERATE, "cache": {"volume": {"retainPolicy": "Delete"}}}
    m = model("m", delete)
    users = [(OwnerRef("m", "uid-m"), CacheVolumeSpec(retain_policy="Delete"))]
    pvc = next(o for o in decide(m, Observed(cache_users=users), NOW).apply
               if o.kind == "PersistentVolumeClaim")
    live = with_applied_hash(pvc.to_dict())
    assert live["metadata"]["ownerReferences"]
    retain = [(OwnerRef("m", "uid-m"), CacheVolumeSpec(retain_policy="Retain"))]
    pvc2 = next(o for o in decide(model("m", GENERATE), Observed(cache_users=retain), NOW).apply
                if o.kind == "PersistentVolumeClaim")
    desired = with_applied_hash(pvc2.to_dict())
    assert "ownerReferences" not in desired["metadata"]
    # without the hash the smaller object is a subset of the live one and nothing is sent
    plain = pvc2.to_dict()
    assert is_subset(plain, live)
    assert not is_subset(desired, live)
    assert desired["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]


# ---------------------------------------------------------------- pods


def test_engine_pods_mount_no_token_and_do_not_rechown_the_cache() -> None:
    m, obs = serving_model()
    d = decide(m, obs, NOW)
    dep = next(o for o in d.apply if o.kind == "Deployment")
    job = decide(model("m", GENERATE), Observed(cache_pvc=bound()), NOW).job
    for pod in (dep.spec.template.spec, job.spec.template.spec):
        assert pod.automountServiceAccountToken is False
        assert pod.securityContext.fsGroupChangePolicy == "OnRootMismatch"


def test_read_write_once_cache_keeps_pods_on_one_node() -> None:
    spec = {**GENERATE, "cache": {"volume": {"accessModes": ["ReadWriteOnce"]}}}
    m = model("m", spec)
    job = decide(m, Observed(cache_pvc=bound(modes=["ReadWriteOnce"])), NOW).job
    affinity = job.spec.template.spec.affinity.podAffinity
    term = affinity.requiredDuringSchedulingIgnoredDuringExecution[0]
    assert term.topologyKey == "kubernetes.io/hostname"
    assert term.labelSelector.matchLabels == {names.CLAIM_LABEL: "spyre-compile-cache"}
    assert job.spec.template.metadata.labels[names.CLAIM_LABEL] == "spyre-compile-cache"


def test_an_existing_read_write_once_claim_keeps_pods_on_one_node_too() -> None:
    """Issue 31, 9: a cache.claimName whose PVC only one node mounts got no co-location: the
    second pod's Multi-Attach error showed as "Compiling" until the Job's deadline. Its access
    modes come from the live PVC (the spec does not say them)."""
    spec = {**GENERATE, "cache": {"claimName": "team-cache"}}
    m = model("m", spec)
    foreign = bound(modes=["ReadWriteOnce"])
    foreign["metadata"]["labels"] = {}  # the team's own PVC
    job = decide(m, Observed(cache_pvc=foreign), NOW).job
    affinity = job.spec.template.spec.affinity.podAffinity
    term = affinity.requiredDuringSchedulingIgnoredDuringExecution[0]
    assert term.topologyKey == "kubernetes.io/hostname"
    assert term.labelSelector.matchLabels == {names.CLAIM_LABEL: "team-cache"}
    assert job.spec.template.metadata.labels[names.CLAIM_LABEL] == "team-cache"
    m2, obs = serving_model(spec)
    obs.cache_pvc = foreign
    dep = next(o for o in decide(m2, obs, NOW).apply if o.kind == "Deployment")
    assert dep.spec.template.spec.affinity.podAffinity is not None
    assert dep.spec.template.metadata.labels[names.CLAIM_LABEL] == "team-cache"
    # ReadWriteMany (or a PVC not seen yet): no affinity
    for pvc in (bound(modes=["ReadWriteMany"]), None):
        job = decide(m, Observed(cache_pvc=pvc), NOW).job
        assert job is None or job.spec.template.spec.affinity is None or \
            job.spec.template.spec.affinity.podAffinity is None


def test_operator_env_is_one_list() -> None:
    """What the operator sets is OPERATOR_ENV (the CRD refuses it in serving.env), and on the
    precompile container PRECOMPILE_ENV too (from precompile fields; servers may set it)."""
    spec = {**GENERATE, "serving": {"resources": {"limits": {"cpu": "4"}}},
            "precompile": {"maxLoadProcesses": 1}}
    m, obs = serving_model(spec)
    dep = next(o for o in decide(m, obs, NOW).apply if o.kind == "Deployment")
    job = decide(model("m", spec), Observed(cache_pvc=bound()), NOW).job
    dep_env = {e.name for e in dep.spec.template.spec.containers[0].env}
    job_env = {e.name for e in job.spec.template.spec.containers[0].env}
    assert dep_env <= set(OPERATOR_ENV)
    assert job_env <= set(OPERATOR_ENV) | set(PRECOMPILE_ENV)
    assert "SENDNN_INFERENCE_NUM_CPUS" in dep_env & job_env
    assert set(PRECOMPILE_ENV) <= job_env and not set(PRECOMPILE_ENV) & set(OPERATOR_ENV)
