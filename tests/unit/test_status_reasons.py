"""What status says about serving pods that cannot start, a cache claim being deleted and
same-named objects the model does not want (pure decide() cases)."""

from __future__ import annotations

from typing import Any

import pytest
from spyre_operator.control.controller import compact_pod, foreign_owner
from spyre_operator.decide import Observed, WriteError, decide
from spyre_operator.decide import conditions as C
from spyre_operator.handlers import policy_from_env

from .samples import GENERATE, model
from .test_reconcile import NOW, cond, deployment_obj, job_obj, plan_for
from .test_reconcile_correctness import bound


def rolling_out(spec: dict[str, Any] | None = None) -> tuple[dict[str, Any], Observed]:
    """A model whose artifact is ready and whose Deployment has no available replica yet."""
    m = model("m", spec or GENERATE)
    obs = Observed(cache_pvc=bound(), job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=0)
    return m, obs


def waiting_pod(m: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """A serving pod as the API server returns it, its container waiting for ``reason``."""
    return {
        "metadata": {"name": "m-abc", "labels": {
            "serving.spyre.dev/artifact": plan_for(m).short_key}},
        "status": {"phase": "Pending", "containerStatuses": [{
            "name": "engine", "ready": False,
            "state": {"waiting": {"reason": reason, "message": message}}}]},
    }


@pytest.mark.parametrize(
    "waiting,message,reason",
    [
        ("ErrImagePull", 'failed to pull image "registry.local/engine:nope": not found',
         C.IMAGE_PULL_FAILED),
        ("ImagePullBackOff", 'Back-off pulling image "registry.local/engine:nope"',
         C.IMAGE_PULL_FAILED),
        ("CreateContainerConfigError", 'secret "hf-token" not found', C.CONTAINER_CONFIG_ERROR),
        ("CreateContainerConfigError", 'configmap "ca-bundle" not found',
         C.CONTAINER_CONFIG_ERROR),
    ],
)
def test_serving_pod_that_cannot_start_is_reported_with_the_kubelets_words(
    waiting: str, message: str, reason: str
) -> None:
    """These showed RollingOut until the 40-minute progress deadline."""
    m, obs = rolling_out()
    obs.server_pods = [compact_pod(waiting_pod(m, waiting, message))]
    d = decide(m, obs, NOW)
    for type_ in (C.READY, C.DEGRADED):
        c = cond(d, type_)
        assert c["reason"] == reason, c
        assert waiting in c["message"] and message in c["message"] and "m-abc" in c["message"]
    assert cond(d, C.STALLED)["status"] == C.TRUE
    assert d.events and d.events[0][0] == "Warning" and d.events[0][1] == reason


def test_pod_that_cannot_start_while_old_pods_serve_keeps_ready() -> None:
    m, obs = rolling_out()
    obs.deployment["status"]["availableReplicas"] = 1  # type: ignore[index]
    obs.deployment["status"]["replicas"] = 2  # type: ignore[index]
    obs.server_pods = [compact_pod(waiting_pod(m, "ImagePullBackOff", "Back-off"))]
    d = decide(m, obs, NOW)
    assert cond(d, C.READY)["status"] == C.TRUE
    assert cond(d, C.DEGRADED)["reason"] == C.IMAGE_PULL_FAILED


def test_a_rejected_write_is_still_reported_first() -> None:
    """A ResourceQuota refusal (a rejected write) keeps its ReconcileError."""
    m, obs = rolling_out()
    obs.server_pods = [compact_pod(waiting_pod(m, "ImagePullBackOff", "Back-off"))]
    obs.write_errors = [WriteError("Service", "m", 403, "exceeded quota: no-services")]
    d = decide(m, obs, NOW)
    assert cond(d, C.DEGRADED)["reason"] == C.RECONCILE_ERROR
    assert "exceeded quota" in cond(d, C.DEGRADED)["message"]


def test_container_creating_is_still_rolling_out() -> None:
    m, obs = rolling_out()
    obs.server_pods = [compact_pod(waiting_pod(m, "ContainerCreating", ""))]
    d = decide(m, obs, NOW)
    assert cond(d, C.READY)["reason"] == C.ROLLING_OUT
    assert cond(d, C.DEGRADED)["status"] == C.FALSE


def test_terminating_cache_claim_is_not_bound() -> None:
    """A PVC with a deletionTimestamp reported CacheVolumeReady=True ClaimBound."""
    m = model("m", GENERATE)
    pvc = bound()
    pvc["metadata"].update(deletionTimestamp="2026-11-21T09:59:00Z",
                           finalizers=["kubernetes.io/pvc-protection"])
    d = decide(m, Observed(cache_pvc=pvc), NOW)
    c = cond(d, C.CACHE_VOLUME_READY)
    assert (c["status"], c["reason"]) == (C.FALSE, C.CLAIM_TERMINATING)
    assert "kubernetes.io/pvc-protection" in c["message"] and "being deleted" in c["message"]
    assert cond(d, C.DEGRADED)["reason"] == C.CLAIM_TERMINATING
    claim_name = model("n", {**GENERATE, "cache": {"claimName": "mine"}})
    c = cond(decide(claim_name, Observed(cache_pvc=pvc), NOW), C.CACHE_VOLUME_READY)
    assert c["reason"] == C.CLAIM_TERMINATING and "cache.claimName" in c["message"]


@pytest.mark.parametrize("kind", ["PodDisruptionBudget", "HorizontalPodAutoscaler"])
def test_same_named_object_the_model_does_not_want_is_no_conflict(kind: str) -> None:
    """Reproduced: a foreign PDB or HPA next to a 1-replica model without autoscaling set
    Degraded=True NameConflict and Stalled=True."""
    m = model("m", GENERATE)
    why = foreign_owner(kind, {"metadata": {"name": "m"}}, "m")
    assert why
    d = decide(m, Observed(cache_pvc=bound(), foreign={kind: why}), NOW)
    for type_ in (C.DEGRADED, C.STALLED):
        assert cond(d, type_)["status"] == C.FALSE, cond(d, type_)
    assert cond(d, C.READY)["reason"] != C.NAME_CONFLICT
    assert kind not in [o.kind for o in d.apply]  # still never written over
    wanting = (
        {**GENERATE, "replicas": 2}
        if kind == "PodDisruptionBudget"
        else {**GENERATE, "autoscaling": {"minReplicas": 1, "maxReplicas": 3,
                                          "targetQueueLength": 2}}
    )
    m = model("m", wanting)
    d = decide(m, Observed(cache_pvc=bound(), foreign={kind: why}), NOW)
    assert cond(d, C.DEGRADED)["reason"] == C.NAME_CONFLICT
    assert kind not in [o.kind for o in d.apply]


def _unscheduled_pod(created: str, scheduler: str = "spyre-scheduler") -> dict[str, Any]:
    """A serving pod no scheduler has looked at: no nodeName, no PodScheduled condition."""
    return {"metadata": {"name": "m-abc", "creationTimestamp": created},
            "spec": {"schedulerName": scheduler},
            "status": {"phase": "Pending"}}


def test_a_pod_no_scheduler_looks_at_is_reported_after_a_minute() -> None:
    """Issue 28: spyre-scheduler not installed (or not running) left serving pods without a
    PodScheduled condition and the model RollingOut for good with no reason."""
    m, obs = rolling_out()
    obs.server_pods = [compact_pod(_unscheduled_pod("2026-11-21T09:59:30Z"))]
    young = decide(m, obs, NOW)  # 30 s old: a running scheduler may not have got to it yet
    assert cond(young, C.PROGRESSING)["reason"] == C.ROLLING_OUT
    # ... and the model is looked at again when the pod reaches a minute (no event will come).
    assert young.requeue_after is not None and 30 <= young.requeue_after <= 32

    obs.server_pods = [compact_pod(_unscheduled_pod("2026-11-21T09:58:55Z"))]
    d = decide(m, obs, NOW)
    p = cond(d, C.PROGRESSING)
    assert (p["status"], p["reason"]) == ("True", C.SCHEDULER_NOT_RUNNING)
    assert "'spyre-scheduler'" in p["message"] and "m-abc: 65s" in p["message"], p["message"]
    assert cond(d, C.RECONCILING)["reason"] == C.SCHEDULER_NOT_RUNNING


def test_the_silence_before_scheduler_not_running_is_the_operators_setting() -> None:
    """SPYRE_SCHEDULER_SILENCE_SECONDS (the kwok tests' operator: 20 s) reaches decide()."""
    m, obs = rolling_out()
    obs.server_pods = [compact_pod(_unscheduled_pod("2026-11-21T09:59:30Z"))]  # 30 s old
    policy = policy_from_env({"SPYRE_SCHEDULER_SILENCE_SECONDS": "20"})
    assert cond(decide(m, obs, NOW, policy), C.PROGRESSING)["reason"] == C.SCHEDULER_NOT_RUNNING
    assert cond(decide(m, obs, NOW, policy_from_env({})), C.PROGRESSING)["reason"] == (
        C.ROLLING_OUT)


@pytest.mark.parametrize("pod", [
    # A scheduler looked at it and no node fits: InsufficientCapacity says so instead.
    {"spec": {"schedulerName": "spyre-scheduler"},
     "status": {"phase": "Pending", "conditions": [
         {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}},
    # Scheduled (the kubelet has not reported yet).
    {"spec": {"schedulerName": "spyre-scheduler", "nodeName": "n1"},
     "status": {"phase": "Pending"}},
])
def test_a_pod_a_scheduler_has_seen_is_not_reported(pod: dict[str, Any]) -> None:
    m, obs = rolling_out()
    pod = {"metadata": {"name": "m-abc", "creationTimestamp": "2026-11-21T09:00:00Z"}, **pod}
    obs.server_pods = [compact_pod(pod)]
    assert cond(decide(m, obs, NOW), C.PROGRESSING)["reason"] != C.SCHEDULER_NOT_RUNNING
