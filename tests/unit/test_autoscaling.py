"""spec.autoscaling: the HPA the operator owns, its condition, and replicas short of cards."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api import SpyreModelSpec
from spyre_operator.control.controller import compact_pod
from spyre_operator.decide import Observed, decide
from spyre_operator.decide import conditions as C
from spyre_operator.desired.autoscaling import (
    KV_CACHE_METRIC,
    QUEUE_METRIC,
    build_hpa,
    quantity,
)

from .samples import GENERATE, model
from .test_reconcile import BOUND, NOW, cond, deployment_obj, job_obj, plan_for

AUTO = {"minReplicas": 1, "maxReplicas": 3, "targetQueueLength": 2,
        "targetKvCacheUsage": 0.8, "scaleDownStabilizationSeconds": 60}


def autoscaled(**over: Any) -> dict[str, Any]:
    m = model("m", GENERATE)
    m["spec"] = copy.deepcopy(m["spec"])
    m["spec"]["autoscaling"] = {**AUTO, **over}
    return m


def test_hpa_scales_the_models_scale_subresource_on_per_pod_engine_metrics() -> None:
    hpa = build_hpa(plan_for(autoscaled())).to_dict()
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel", "name": "m"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 3)
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in spec["metrics"]}
    assert targets == {
        QUEUE_METRIC: {"type": "AverageValue", "averageValue": "2"},
        KV_CACHE_METRIC: {"type": "AverageValue", "averageValue": "800m"},
    }
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 60
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "uid-m"
    assert hpa["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "spyre-model-operator"


@pytest.mark.parametrize(("value", "expected"), [(0.8, "800m"), (2, "2"), (2.5, "2500m"),
                                                 (0.001, "1m"), (10000, "10000")])
def test_quantity_is_exact_to_the_milli(value: float, expected: str) -> None:
    assert quantity(value) == expected


@pytest.mark.parametrize("bad", [
    {"minReplicas": 4, "maxReplicas": 3, "targetQueueLength": 1},
    {"maxReplicas": 3},  # no target
    {"minReplicas": 0, "maxReplicas": 2},  # no target: nothing would scale 1..2
    {"minReplicas": 1, "maxReplicas": 1},  # no target and not to zero
    {"maxReplicas": 3, "targetKvCacheUsage": 1.5},
    {"minReplicas": 1, "maxReplicas": 3, "targetQueueLength": 1, "scaleToZero": {}},
    {"minReplicas": 0, "maxReplicas": 3, "targetQueueLength": 1,
     "scaleToZero": {"idleSeconds": 10}},
    {"minReplicas": 0, "maxReplicas": 3, "targetQueueLength": 1,
     "scaleToZero": {"maxWaitSeconds": 0}},
])
def test_invalid_autoscaling_is_rejected(bad: dict[str, Any]) -> None:
    spec = copy.deepcopy(model("m", GENERATE)["spec"])
    spec["autoscaling"] = bad
    with pytest.raises(ValidationError):
        SpyreModelSpec.model_validate(spec)


def test_zero_to_one_on_requests_alone_needs_no_target() -> None:
    spec = copy.deepcopy(model("m", GENERATE)["spec"])
    spec["autoscaling"] = {"minReplicas": 0, "maxReplicas": 1}
    assert SpyreModelSpec.model_validate(spec).autoscaling.max_replicas == 1  # type: ignore


def test_autoscaling_adds_an_hpa_and_a_pdb_and_turning_it_off_deletes_the_hpa() -> None:
    m = autoscaled()
    d = decide(m, Observed(cache_pvc=BOUND, job=job_obj(m, "Complete")), NOW)
    kinds = [o.kind for o in d.apply]
    assert "HorizontalPodAutoscaler" in kinds
    assert "PodDisruptionBudget" in kinds  # replicas may grow past 1
    assert cond(d, C.AUTOSCALING)["status"] == C.UNKNOWN

    hpa = build_hpa(plan_for(m)).to_dict()
    off = model("m", GENERATE)
    d = decide(off, Observed(cache_pvc=BOUND, job=job_obj(off, "Complete"), hpa=hpa), NOW)
    assert "HorizontalPodAutoscaler" not in [o.kind for o in d.apply]
    assert [(r.__name__, n) for r, n in d.delete] == [("HorizontalPodAutoscaler", "m")]
    assert C.find(d.status["conditions"], C.AUTOSCALING) is None


def _with_hpa_status(m: dict[str, Any], conditions: list[dict[str, str]],
                     current: int = 1, desired: int = 1) -> Observed:
    hpa = build_hpa(plan_for(m)).to_dict()
    hpa["status"] = {"currentReplicas": current, "desiredReplicas": desired,
                     "conditions": conditions}
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"), hpa=hpa)
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1)
    return obs


def test_autoscaling_condition_carries_the_hpas_own_failure() -> None:
    m = autoscaled()
    obs = _with_hpa_status(m, [
        {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric",
         "message": "unable to get metric vllm_num_requests_waiting: no custom metrics API"},
    ])
    d = decide(m, obs, NOW)
    c = cond(d, C.AUTOSCALING)
    assert (c["status"], c["reason"]) == ("False", "FailedGetPodsMetric")
    assert "no custom metrics API" in c["message"]
    # the model serves regardless
    assert cond(d, C.READY)["status"] == "True"
    assert cond(d, C.DEGRADED)["status"] == "False"


def test_autoscaling_condition_when_active_and_when_limited() -> None:
    m = autoscaled()
    active = [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"},
              {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}]
    d = decide(m, _with_hpa_status(m, active), NOW)
    c = cond(d, C.AUTOSCALING)
    assert (c["status"], c["reason"]) == ("True", C.AUTOSCALER_ACTIVE)
    assert c["message"] == "1 replicas, desired 1 (min 1, max 3)"
    limited = [*active, {"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas",
                         "message": "the desired replica count is more than the maximum"}]
    d = decide(m, _with_hpa_status(m, limited, current=3, desired=3), NOW)
    c = cond(d, C.AUTOSCALING)
    assert (c["status"], c["reason"]) == ("True", "TooManyReplicas")


def test_a_replica_without_a_card_leaves_the_model_ready_and_says_why() -> None:
    m = model("m", GENERATE)
    m["spec"] = {**m["spec"], "replicas": 2}
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1, replicas=2)
    msg = "0/3 nodes are available: 3 Insufficient ibm.com/spyre_vf."
    obs.server_pods = [compact_pod({
        "metadata": {"name": "m-abc"},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": msg}]},
    })]
    d = decide(m, obs, NOW)
    assert cond(d, C.READY)["status"] == "True"
    p = cond(d, C.PROGRESSING)
    assert (p["status"], p["reason"]) == ("True", C.INSUFFICIENT_CAPACITY)
    assert msg in p["message"] and "1/2 replicas available" in p["message"]
    assert cond(d, C.RECONCILING)["reason"] == C.INSUFFICIENT_CAPACITY


def test_a_pod_the_node_evicted_is_not_an_engine_failure() -> None:
    """Seen on the real node under DiskPressure: the kubelet killed the engine (exit 137, log
    tail as message) and the model stayed Degraded=EngineFailed while its replacement ran."""
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=BOUND, job=job_obj(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1)
    plan = plan_for(m)
    evicted = {
        "metadata": {"name": "m-old", "labels": {"serving.spyre.dev/artifact": plan.short_key}},
        "status": {"phase": "Failed", "reason": "Evicted",
                   "message": "The node was low on resource: ephemeral-storage.",
                   "containerStatuses": [{"ready": False, "state": {"terminated": {
                       "exitCode": 137, "reason": "Error", "message": "Drained"}}}]},
    }
    obs.server_pods = [compact_pod(evicted)]
    d = decide(m, obs, NOW)
    assert cond(d, C.DEGRADED)["status"] == "False", cond(d, C.DEGRADED)
    # the same pod, failed by itself, is one
    evicted["status"].pop("reason")
    obs.server_pods = [compact_pod(evicted)]
    assert cond(decide(m, obs, NOW), C.DEGRADED)["reason"] == C.ENGINE_FAILED
