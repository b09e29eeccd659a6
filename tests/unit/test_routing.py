"""spec.routing.inferencePool: the InferencePool builder and RoutingReady, without a cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError
from spyre_operator.api import SpyreModelSpec
from spyre_operator.decide import (
    API_FORBIDDEN,
    API_NOT_SERVED,
    API_SERVED,
    API_UNKNOWN,
    Observed,
    decide,
)
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names
from spyre_operator.desired.inference_pool import build_inference_pool

from .samples import GENERATE, model
from .test_reconcile import NOW, cond, deployment_obj, job_obj, kinds, plan_for

ROUTED: dict[str, Any] = {
    **copy.deepcopy(GENERATE),
    "serving": {"port": 8080},
    "routing": {"inferencePool": {"endpointPicker": {"name": "granite-epp"}}},
}


def served(m: dict[str, Any], api: str = API_SERVED, pool: dict[str, Any] | None = None,
           **kw: Any) -> Any:
    """decide() for a model whose artifact is compiled and whose one replica serves."""
    first = decide(m, Observed(job=job_obj(m, "Complete"), inference_pool_api=api,
                               inference_pool=pool, **kw), NOW)
    obs = Observed(job=job_obj(m, "Complete"), deployment=deployment_obj(first, ready=1),
                   inference_pool_api=api, inference_pool=pool, **kw)
    return decide(m, obs, NOW)


def pool_with_parents(*parents: dict[str, Any]) -> dict[str, Any]:
    m = model("granite", ROUTED)
    body = build_inference_pool(plan_for(m)).to_dict()
    body["status"] = {"parents": list(parents)}
    return body


def parent(accepted: str, reason: str = "Accepted", message: str = "",
           resolved: str | None = None) -> dict[str, Any]:
    conds = [{"type": "Accepted", "status": accepted, "reason": reason, "message": message}]
    if resolved is not None:
        conds.append({"type": "ResolvedRefs", "status": resolved, "reason": "InvalidExtensionRef",
                      "message": "Service granite-epp not found"})
    return {"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                          "name": "inference-gw", "namespace": "ns"},
            "controllerName": "example.net/gateway", "conditions": conds}


def test_pool_selects_the_serving_pods_on_the_serving_port() -> None:
    pool = build_inference_pool(plan_for(model("granite", ROUTED))).to_dict()
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["kind"] == "InferencePool"
    assert pool["metadata"]["name"] == "granite"
    assert pool["spec"]["selector"] == {"matchLabels": names.server_selector("granite")}
    assert pool["spec"]["targetPorts"] == [{"number": 8080}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "", "kind": "Service", "name": "granite-epp", "port": {"number": 9002},
        "failureMode": "FailClose"}
    [ref] = pool["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("SpyreModel", "granite", True)


def test_pool_selector_is_the_service_selector() -> None:
    d = served(model("granite", ROUTED))
    objs = {o.kind: o.to_dict() for o in d.apply}
    assert objs["InferencePool"]["spec"]["selector"]["matchLabels"] == (
        objs["Service"]["spec"]["selector"])
    # the pods the Deployment makes carry those labels
    labels = objs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert objs["Service"]["spec"]["selector"].items() <= labels.items()


def test_endpoint_picker_name_is_required() -> None:
    with pytest.raises(ValidationError):
        SpyreModelSpec.model_validate({**GENERATE, "routing": {"inferencePool": {}}})


def test_no_routing_no_pool_no_condition() -> None:
    d = served(model("granite", GENERATE))
    assert "InferencePool" not in kinds(d)
    assert C.find(d.status["conditions"], C.ROUTING_READY) is None


def test_crd_missing_is_a_condition_and_the_model_still_serves() -> None:
    d = served(model("granite", ROUTED), api=API_NOT_SERVED)
    assert "InferencePool" not in kinds(d)
    c = cond(d, C.ROUTING_READY)
    assert (c["status"], c["reason"]) == ("False", C.INFERENCE_POOL_CRD_MISSING)
    assert "inference.networking.k8s.io/v1" in c["message"] and "Service" in c["message"]
    assert cond(d, C.READY)["status"] == "True"
    assert cond(d, C.DEGRADED)["status"] == "False"
    assert d.requeue_after is None  # the watch notices the CRD; no retry loop
    assert d.events and "RoutingReady=False InferencePoolCRDMissing" in d.events[0][2]


def test_forbidden_is_a_condition() -> None:
    d = served(model("granite", ROUTED), api=API_FORBIDDEN)
    c = cond(d, C.ROUTING_READY)
    assert (c["status"], c["reason"]) == ("False", C.INFERENCE_POOL_FORBIDDEN)
    assert "InferencePool" not in kinds(d)


def test_unknown_api_keeps_the_previous_condition_and_writes_nothing() -> None:
    m = model("granite", ROUTED)
    before = served(m, api=API_NOT_SERVED)
    m2 = model("granite", ROUTED, status=before.status)
    d = served(m2, api=API_UNKNOWN)
    assert "InferencePool" not in kinds(d)
    assert cond(d, C.ROUTING_READY)["reason"] == C.INFERENCE_POOL_CRD_MISSING


def test_pool_created_is_pending_without_parents() -> None:
    d = served(model("granite", ROUTED))
    assert "InferencePool" in kinds(d)
    c = cond(d, C.ROUTING_READY)
    assert (c["status"], c["reason"]) == ("False", C.INFERENCE_POOL_PENDING)
    d2 = served(model("granite", ROUTED), pool=pool_with_parents())
    c = cond(d2, C.ROUTING_READY)
    assert (c["status"], c["reason"]) == ("False", C.INFERENCE_POOL_PENDING)
    assert "HTTPRoute" in c["message"]


@pytest.mark.parametrize(
    ("parents", "status", "reason", "words"),
    [
        ([parent("True")], "True", C.INFERENCE_POOL_ACCEPTED, "Gateway ns/inference-gw"),
        ([parent("False", "NotSupportedByParent", "no inference support")], "False",
         C.INFERENCE_POOL_NOT_ACCEPTED, "NotSupportedByParent: no inference support"),
        ([parent("True", resolved="False")], "False", C.INFERENCE_POOL_REFS_NOT_RESOLVED,
         "Service granite-epp not found"),
        ([parent("Unknown", "Pending", "waiting")], "False", C.INFERENCE_POOL_PENDING, "waiting"),
        # one Gateway accepting is enough
        ([parent("False", "NotSupportedByParent"), parent("True")], "True",
         C.INFERENCE_POOL_ACCEPTED, "accepted by"),
    ],
)
def test_condition_follows_the_pools_parents(
    parents: list[dict[str, Any]], status: str, reason: str, words: str
) -> None:
    d = served(model("granite", ROUTED), pool=pool_with_parents(*parents))
    c = cond(d, C.ROUTING_READY)
    assert (c["status"], c["reason"]) == (status, reason)
    assert words in c["message"]
    assert cond(d, C.READY)["status"] == "True"


def test_removing_routing_deletes_the_pool_and_the_condition() -> None:
    pool = pool_with_parents(parent("True"))
    m = model("granite", ROUTED)
    before = served(m, pool=pool)
    spec = {k: v for k, v in ROUTED.items() if k != "routing"}
    d = served(model("granite", spec, status=before.status, generation=2), pool=pool)
    assert [(r.__name__, n) for r, n in d.delete] == [("InferencePool", "granite")]
    assert C.find(d.status["conditions"], C.ROUTING_READY) is None


def test_foreign_pool_is_never_written() -> None:
    d = served(model("granite", ROUTED),
               foreign_inference_pool="InferencePool granite exists and is not managed")
    assert "InferencePool" not in kinds(d)
    c = cond(d, C.ROUTING_READY)
    assert (c["status"], c["reason"]) == ("False", C.NAME_CONFLICT)
    assert cond(d, C.READY)["status"] == "True"
    assert not d.delete


def test_idle_recompute_is_identical() -> None:
    pool = pool_with_parents(parent("True"))
    m = model("granite", ROUTED)
    first = served(m, pool=pool)
    again = served(model("granite", ROUTED, status=first.status), pool=pool)
    assert again.status == first.status
    assert again.events == []
