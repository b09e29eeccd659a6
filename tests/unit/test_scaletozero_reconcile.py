"""Scale to zero in decide(): KEDA's objects, the Service switch, the HPA, conditions, status."""

from __future__ import annotations

import copy
from typing import Any

from spyre_operator.decide import (
    API_FORBIDDEN,
    API_NOT_SERVED,
    API_SERVED,
    API_UNKNOWN,
    Observed,
    ScaleToZeroConfig,
    decide,
)
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names
from spyre_operator.desired.scaletozero import SLICE_SERVICE_NAME

from .samples import GENERATE, model
from .test_reconcile import NOW, cond, deployment_obj, job_obj, kinds

CONFIG = ScaleToZeroConfig(
    prometheus_address="http://prometheus.monitoring:9090",
    coldstart_namespace="spyre-system",
    coldstart_service="spyre-model-operator-coldstart",
    coldstart_port=8082,
)
INTERCEPTOR_SLICE = {
    "metadata": {"name": "keda-add-ons-http-interceptor-proxy-abcde", "namespace": "keda"},
    "addressType": "IPv4",
    "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}},
                  {"addresses": ["10.0.0.5"], "conditions": {"ready": True}}],
    "ports": [{"name": "proxy", "port": 18080, "protocol": "TCP"}],
}


def s2z(min_replicas: int = 0, replicas: int = 1, **auto: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GENERATE)
    spec["replicas"] = replicas
    spec["autoscaling"] = {"minReplicas": min_replicas, "maxReplicas": 3,
                           "targetQueueLength": 2, **auto}
    return spec


def obs_for(m: dict[str, Any], first: Any = None, *, api: str = API_SERVED,
            http_api: str | None = None, ready: int = 1, **kw: Any) -> Observed:
    base: dict[str, Any] = {
        "keda": CONFIG, "scaled_object_api": api,
        "http_scaled_object_api": http_api or api, "interceptor_slices": [INTERCEPTOR_SLICE],
    }
    base.update(kw)
    dep = None if first is None else deployment_obj(first, ready=ready, replicas=ready)
    return Observed(job=job_obj(m, "Complete"), deployment=dep, **base)


def served(m: dict[str, Any], **kw: Any) -> Any:
    """decide() for a model whose artifact is compiled and whose Deployment exists."""
    ready = kw.pop("ready", 1)
    first = decide(m, obs_for(m, **kw), NOW)
    return decide(m, obs_for(m, first, ready=ready, **kw), NOW)


def by_kind(d: Any, kind: str, name: str) -> dict[str, Any]:
    return next(o for o in d.apply if o.kind == kind and o.metadata.name == name).to_dict()


def so_status(ready: str, last: str | None = None) -> dict[str, Any]:
    st: dict[str, Any] = {"conditions": [{"type": "Ready", "status": ready,
                                          "reason": "ScaledObjectReady", "message": "ok"}]}
    if last:
        st["lastActiveTime"] = last
    return st


def live(d: Any, kind: str, name: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    body = by_kind(d, kind, name)
    if status is not None:
        body["status"] = status
    return body


def test_served_apis_write_keda_objects_and_point_the_service_at_the_interceptor() -> None:
    d = served(model("granite", s2z()))
    assert "HorizontalPodAutoscaler" not in kinds(d)
    for kind in ("HTTPScaledObject", "ScaledObject", "EndpointSlice"):
        assert kind in kinds(d)
    svc = by_kind(d, "Service", "granite")
    assert "selector" not in svc["spec"] or not svc["spec"].get("selector")
    assert svc["spec"]["ports"][0]["name"] == "http"
    engine = by_kind(d, "Service", "granite-engine")
    assert engine["spec"]["selector"] == names.server_selector("granite")
    mirror = by_kind(d, "EndpointSlice", "granite-interceptor")
    assert mirror["metadata"]["labels"][SLICE_SERVICE_NAME] == "granite"
    assert [e["addresses"] for e in mirror["endpoints"]] == [["10.0.0.5"], ["10.0.0.7"]]
    assert mirror["ports"] == [{"name": "http", "port": 18080, "protocol": "TCP",
                                "appProtocol": "http"}]
    cold = by_kind(d, "Service", "granite-coldstart")
    assert cold["spec"] == {"type": "ExternalName", "externalName":
                            "spyre-model-operator-coldstart.spyre-system.svc.cluster.local",
                            "ports": [{"name": "http", "port": 8082, "protocol": "TCP"}]}
    httpso = by_kind(d, "HTTPScaledObject", "granite")
    assert httpso["spec"]["coldStartTimeoutFailoverRef"]["service"] == "granite-coldstart"
    so = by_kind(d, "ScaledObject", "granite")
    push, starting, *prom = so["spec"]["triggers"]
    assert push["type"] == "external-push"
    # KEDA asks the responder, through its Service, whether the woken model is still starting
    assert starting["type"] == "metrics-api"
    assert starting["metadata"]["url"] == (
        "http://spyre-model-operator-coldstart.spyre-system.svc.cluster.local:8082"
        "/scaletozero/v1/starting/ns/granite")
    assert prom[0]["metadata"]["serverAddress"] == CONFIG.prometheus_address
    c = cond(d, C.AUTOSCALING)
    assert (c["status"], c["reason"]) == ("Unknown", C.AUTOSCALER_PENDING)


def test_the_operators_hpa_is_deleted_before_the_scaled_object_is_written() -> None:
    m = model("granite", s2z())
    before = served(model("granite", s2z(min_replicas=1)))
    hpa = live(before, "HorizontalPodAutoscaler", "granite")
    d = served(m, hpa=hpa)
    assert ("HorizontalPodAutoscaler", "granite") in [(r.__name__, n) for r, n in d.delete]
    assert "ScaledObject" in kinds(d)  # controller.execute runs deletes before applies


def test_missing_crds_are_a_condition_and_nothing_is_written() -> None:
    d = served(model("granite", s2z()), http_api=API_NOT_SERVED)
    assert not {"HTTPScaledObject", "ScaledObject", "EndpointSlice"} & set(kinds(d))
    assert "HorizontalPodAutoscaler" not in kinds(d)  # two writers of /scale: never
    c = cond(d, C.AUTOSCALING)
    assert (c["status"], c["reason"]) == ("False", C.SCALE_TO_ZERO_UNAVAILABLE)
    assert "httpscaledobjects.http.keda.sh" in c["message"]
    assert by_kind(d, "Service", "granite")["spec"]["selector"]  # still serves its pods
    assert cond(d, C.READY)["status"] == "True"
    assert d.requeue_after is None  # the optional-API watch notices the CRDs


def test_forbidden_and_no_prometheus_are_reported() -> None:
    d = served(model("granite", s2z()), api=API_FORBIDDEN)
    assert "may not watch or write ScaledObjects" in cond(d, C.AUTOSCALING)["message"]
    d = served(model("granite", s2z()), keda=ScaleToZeroConfig())
    assert cond(d, C.AUTOSCALING)["reason"] == C.SCALE_TO_ZERO_UNAVAILABLE
    assert "--prometheus-address" in cond(d, C.AUTOSCALING)["message"]


def test_no_interceptor_endpoints_keeps_the_selector_service() -> None:
    d = served(model("granite", s2z()), interceptor_slices=[])
    assert by_kind(d, "Service", "granite")["spec"]["selector"]
    assert "has no endpoints" in cond(d, C.AUTOSCALING)["message"]


def test_unknown_apis_keep_the_previous_condition() -> None:
    m = model("granite", s2z())
    before = served(m, api=API_NOT_SERVED)
    d = served(model("granite", s2z(), status=before.status), api=API_UNKNOWN)
    assert cond(d, C.AUTOSCALING)["reason"] == C.SCALE_TO_ZERO_UNAVAILABLE
    assert "ScaledObject" not in kinds(d)


def test_at_zero_with_a_ready_scaled_object_the_model_is_ready_and_shows_last_use() -> None:
    first = served(model("granite", s2z()))
    so = live(first, "ScaledObject", "granite", so_status("True", "2026-11-25T07:00:00Z"))
    mirror = live(first, "EndpointSlice", "granite-interceptor")
    m = model("granite", s2z(replicas=0))
    d = served(m, scaled_object=so, mirror_slice=mirror, ready=0)
    c = cond(d, C.READY)
    assert (c["status"], c["reason"]) == ("True", C.SCALED_TO_ZERO)
    assert cond(d, C.AUTOSCALING)["reason"] == C.SCALE_TO_ZERO_ACTIVE
    assert d.status["scaleToZero"] == {"lastActiveTime": "2026-11-25T07:00:00Z",
                                       "scaledToZeroSince": NOW}
    # the operator never writes spec.replicas: no SpyreModel in the writes
    assert "SpyreModel" not in kinds(d)


def test_at_zero_without_keda_the_model_is_not_ready() -> None:
    m = model("granite", s2z(replicas=0))
    d = served(m, api=API_NOT_SERVED, ready=0)
    c = cond(d, C.READY)
    assert (c["status"], c["reason"]) == ("False", C.SCALE_TO_ZERO_UNAVAILABLE)
    so = {"status": so_status("False")}
    first = served(model("granite", s2z()))
    so = live(first, "ScaledObject", "granite", so_status("False"))
    d = served(m, scaled_object=so, ready=0)
    assert cond(d, C.READY)["status"] == "False"
    assert cond(d, C.AUTOSCALING)["reason"] == C.SCALED_OBJECT_NOT_READY


def test_switching_zero_off_deletes_keda_objects_and_restores_service_and_hpa() -> None:
    first = served(model("granite", s2z()))
    kw = {"scaled_object": live(first, "ScaledObject", "granite"),
          "http_scaled_object": live(first, "HTTPScaledObject", "granite"),
          "mirror_slice": live(first, "EndpointSlice", "granite-interceptor"),
          "engine_service": live(first, "Service", "granite-engine"),
          "coldstart_service": live(first, "Service", "granite-coldstart")}
    d = served(model("granite", s2z(min_replicas=1)), **kw)
    deleted = {(r.__name__, n) for r, n in d.delete}
    assert deleted == {("HTTPScaledObject", "granite"), ("ScaledObject", "granite"),
                       ("EndpointSlice", "granite-interceptor"),
                       ("Service", "granite-engine"), ("Service", "granite-coldstart")}
    assert by_kind(d, "Service", "granite")["spec"]["selector"]
    assert "HorizontalPodAutoscaler" in kinds(d)
    assert "scaleToZero" not in d.status


def test_switching_zero_off_at_zero_says_so_and_writes_no_replicas() -> None:
    d = served(model("granite", s2z(min_replicas=1, replicas=0)), ready=0)
    c = cond(d, C.AUTOSCALING)
    assert (c["status"], c["reason"]) == ("False", C.REPLICAS_AT_ZERO)
    assert "SpyreModel" not in kinds(d)


def test_idle_recompute_writes_identical_status() -> None:
    m = model("granite", s2z())
    d1 = served(m)
    d2 = served(model("granite", s2z(), status=d1.status))
    assert d1.status == d2.status


def test_foreign_objects_are_reported_and_nothing_is_written() -> None:
    why = "Service granite-engine exists and is not managed by the operator"
    d = served(model("granite", s2z()), foreign_scale_to_zero=why)
    assert not {"HTTPScaledObject", "ScaledObject", "EndpointSlice"} & set(kinds(d))
    assert [o.metadata.name for o in d.apply if o.kind == "Service"] == ["granite"]
    assert why in cond(d, C.AUTOSCALING)["message"]


def test_while_a_replica_cannot_be_scheduled_held_requests_get_their_503_at_once() -> None:
    """No card: waiting out maxWaitSeconds helps no one. While the model's replica is known
    unschedulable, the route's failover timeout is 1 s (the add-on's minimum) and the
    responder says no card is available; it is restored once the pod can be scheduled."""
    m = model("m", s2z())
    pending = {"name": "m-abc", "phase": "Pending", "ready": False,
               "unschedulable": "0/1 nodes are available: 1 Insufficient ibm.com/spyre_vf."}
    d = served(m, ready=0, server_pods=[pending])
    route = by_kind(d, "HTTPScaledObject", names.server_name("m"))["spec"]
    assert route["coldStartTimeoutFailoverRef"]["timeoutSeconds"] == 1, route
    assert route["timeouts"]["conditionWait"] == "1s"
    assert cond(d, C.PROGRESSING)["reason"] == C.INSUFFICIENT_CAPACITY
    d = served(m, ready=0, server_pods=[{**pending, "unschedulable": None}])
    route = by_kind(d, "HTTPScaledObject", names.server_name("m"))["spec"]
    assert route["coldStartTimeoutFailoverRef"]["timeoutSeconds"] == 300
    assert route["timeouts"]["conditionWait"] == "300s"


def test_with_scale_to_zero_off_in_the_operator_a_model_asking_for_it_is_told() -> None:
    """The chart's default (scaleToZero.enabled=false: no KEDA RBAC) runs the operator with
    --no-scale-to-zero: it watches none of KEDA's APIs and says why nothing scales to zero."""
    import dataclasses

    m = model("m", s2z())
    off = dataclasses.replace(CONFIG, enabled=False)
    d = served(m, keda=off, api=API_UNKNOWN)
    auto = cond(d, C.AUTOSCALING)
    assert (auto["status"], auto["reason"]) == ("False", C.SCALE_TO_ZERO_UNAVAILABLE), auto
    assert "--no-scale-to-zero" in auto["message"] and "scaleToZero.enabled" in auto["message"]
    assert not [o for o in d.apply if o.kind in ("ScaledObject", "HTTPScaledObject")]
