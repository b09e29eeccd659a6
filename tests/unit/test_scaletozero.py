"""autoscaling.minReplicas 0 + scaleToZero: the API and the KEDA / HTTP add-on builders.

The builders' output is checked against the upstream CRDs (KEDA v2.21.0, HTTP add-on v0.12.0,
copied under data/keda/): their openAPIV3Schema with jsonschema, plus what jsonschema does not
see: a field the schema does not know (the API server would silently prune it) and the CEL rules
(each one the CRDs carry is evaluated here by hand; an unknown rule fails the test).
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError
from spyre_operator.api import SpyreModelSpec
from spyre_operator.api.v1alpha1 import ScaleToZeroSpec
from spyre_operator.desired import names
from spyre_operator.desired.plan import ModelPlan, plan_model
from spyre_operator.desired.scaletozero import (
    HTTP_RATE_TARGET,
    IN_FLIGHT_TRIGGER,
    SKIP_SCALED_OBJECT_ANNOTATION,
    build_coldstart_service,
    build_engine_service,
    build_http_scaled_object,
    build_interceptor_service,
    build_mirror_slice,
    build_scaled_object,
    number,
    scale_to_zero_settings,
    wants_scale_to_zero,
)
from spyre_operator.desired.service import build_service
from spyre_operator.gen.crd import build_crd

from .samples import GENERATE

DATA = Path(__file__).parent / "data" / "keda"
HTTPSO_CRD = DATA / "http-add-on-v0.12.0.http.keda.sh_httpscaledobjects.yaml"
SO_CRD = DATA / "keda-v2.21.0.keda.sh_scaledobjects.yaml"
KEDACORE = Path(os.environ.get("GOMODCACHE", Path.home() / "go/pkg/mod")) / "github.com/kedacore"
UPSTREAM = {
    HTTPSO_CRD: KEDACORE / "http-add-on@v0.12.0/config/crd/bases"
    / "http.keda.sh_httpscaledobjects.yaml",
    SO_CRD: KEDACORE / "keda/v2@v2.21.0/config/crd/bases/keda.sh_scaledobjects.yaml",
}

FAILOVER = ("spyre-model-operator-coldstart", 8082)
SCALER = "keda-add-ons-http-external-scaler.keda:9090"
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"

#: A legal SpyreModel name that is no Service name: dots, and longer than a label.
LONG_DOTTED = "granite-3.3-8b-instruct.spyre.tp4.eager.long-name-for-the-team-serving-batch"


def s2z_spec(**auto: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GENERATE)
    spec["serving"] = {"port": 8080}
    spec["autoscaling"] = {"minReplicas": 0, "maxReplicas": 3, "targetQueueLength": 2,
                           "targetKvCacheUsage": 0.8, "scaleDownStabilizationSeconds": 120,
                           **auto}
    return spec


def plan(spec: dict[str, Any] | None = None, name: str = "granite",
         ns: str = "team-a") -> ModelPlan:
    return plan_model(name, ns, f"uid-{name}", SpyreModelSpec.model_validate(spec or s2z_spec()))


def httpso(p: ModelPlan) -> dict[str, Any]:
    obj: dict[str, Any] = build_http_scaled_object(
        p, failover_service=FAILOVER[0], failover_port=FAILOVER[1]).to_dict()
    return obj


def scaled_object(p: ModelPlan) -> dict[str, Any]:
    obj: dict[str, Any] = build_scaled_object(
        p, scaler_address=SCALER, prometheus_address=PROMETHEUS).to_dict()
    return obj


# --------------------------------------------------------------------------------------------
# API
# --------------------------------------------------------------------------------------------


def test_min_replicas_zero_is_allowed_and_scale_to_zero_defaults_apply() -> None:
    spec = SpyreModelSpec.model_validate(s2z_spec())
    auto = spec.autoscaling
    assert auto is not None and auto.min_replicas == 0 and auto.scale_to_zero is None
    s2z = scale_to_zero_settings(auto)
    assert (s2z.idle_seconds, s2z.max_wait_seconds, s2z.response_timeout_seconds) == (
        300, 300, 600)
    assert wants_scale_to_zero(plan())


def test_scale_to_zero_settings_are_read_in_camel_case() -> None:
    spec = SpyreModelSpec.model_validate(s2z_spec(scaleToZero={
        "idleSeconds": 900, "maxWaitSeconds": 120, "responseTimeoutSeconds": 1800}))
    assert spec.autoscaling is not None
    assert spec.autoscaling.scale_to_zero == ScaleToZeroSpec(
        idle_seconds=900, max_wait_seconds=120, response_timeout_seconds=1800)


def test_a_model_with_min_replicas_one_does_not_scale_to_zero() -> None:
    assert not wants_scale_to_zero(plan(s2z_spec(minReplicas=1)))
    assert not wants_scale_to_zero(plan(copy.deepcopy(GENERATE)))


@pytest.mark.parametrize("s2z", [
    {"idleSeconds": 29}, {"idleSeconds": 86401}, {"maxWaitSeconds": 0},
    {"maxWaitSeconds": 3601}, {"responseTimeoutSeconds": 0}, {"responseTimeoutSeconds": 86401},
])
def test_scale_to_zero_bounds(s2z: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        SpyreModelSpec.model_validate(s2z_spec(scaleToZero=s2z))


def test_scale_to_zero_needs_min_replicas_zero() -> None:
    with pytest.raises(ValidationError, match="only allowed with minReplicas: 0"):
        SpyreModelSpec.model_validate(s2z_spec(minReplicas=1, scaleToZero={}))


def _autoscaling_schema() -> dict[str, Any]:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    node: dict[str, Any] = root["properties"]["spec"]["properties"]["autoscaling"]
    return node


def test_the_crd_allows_zero_and_defaults_scale_to_zero_settings() -> None:
    auto = _autoscaling_schema()
    assert auto["properties"]["minReplicas"]["minimum"] == 0
    assert auto["properties"]["minReplicas"]["default"] == 1
    s2z = auto["properties"]["scaleToZero"]
    assert "default" not in s2z  # else the API server would add it to every autoscaled model
    props = s2z["properties"]
    assert {k: (v["default"], v["minimum"], v["maximum"]) for k, v in props.items()} == {
        "idleSeconds": (300, 30, 86400),
        "maxWaitSeconds": (300, 1, 3600),
        "responseTimeoutSeconds": (600, 1, 86400),
    }
    for field in props.values():  # what each becomes upstream
        assert "HTTPScaledObject" in field["description"] or "ScaledObject" in field["description"]


def test_the_crd_keeps_every_autoscaling_rule_and_adds_the_scale_to_zero_one() -> None:
    rules = {r["rule"]: r["message"] for r in _autoscaling_schema()["x-kubernetes-validations"]}
    assert "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas" in rules
    assert ("has(self.targetQueueLength) || has(self.targetKvCacheUsage) || "
            "has(self.targetRunningRequests) || (has(self.minReplicas) && self.minReplicas == 0 "
            "&& self.maxReplicas == 1)") in rules
    rule = "!has(self.scaleToZero) || (has(self.minReplicas) && self.minReplicas == 0)"
    assert rules[rule] == ("autoscaling.scaleToZero is only allowed with "
                           "autoscaling.minReplicas: 0 (minReplicas 0 is what lets the model "
                           "scale to zero)")


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize("model", [
    "granite", LONG_DOTTED, "3b", "a" * 56, "a" * 57, "a" * 63, "x" * 236, "a.b",
])
def test_engine_service_name_is_a_service_name(model: str) -> None:
    name = names.engine_service_name(model)
    assert DNS1035.match(name) and len(name) <= 63, name
    assert name.endswith("-engine")
    assert name != names.server_name(model)


def test_engine_service_names() -> None:
    assert names.engine_service_name("granite") == "granite-engine"
    assert names.engine_service_name("a" * 56) == "a" * 56 + "-engine"  # 63: fits
    long = names.engine_service_name("a" * 57)
    assert len(long) == 63 and long.startswith("a" * 49 + "-")
    # two models whose readable forms coincide keep apart
    assert names.engine_service_name("a.b") != names.engine_service_name("a-b")
    dotted = names.engine_service_name(LONG_DOTTED)
    assert dotted.startswith("granite-3-3-8b-instruct-spyre-tp4-eager-") and len(dotted) == 63


# --------------------------------------------------------------------------------------------
# Upstream schema checks
# --------------------------------------------------------------------------------------------


def _crd_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    [version] = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


#: Every CEL rule of the two CRDs on the paths our objects use, evaluated in Python.
KNOWN_RULES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "has(self.portName) != has(self.port)": lambda s: ("portName" in s) != ("port" in s),
    "!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount) "
    "? self.maxReplicaCount : 100)": lambda s: (
        "minReplicaCount" not in s or s["minReplicaCount"] <= s.get("maxReplicaCount", 100)),
}


def _walk(obj: Any, schema: dict[str, Any], path: str) -> Iterator[str]:
    """Problems jsonschema does not report: pruned fields, failing or unknown CEL rules."""
    for rule in schema.get("x-kubernetes-validations", []):
        check = KNOWN_RULES.get(rule["rule"])
        if check is None:
            yield f"{path}: unknown CEL rule {rule['rule']!r} (add it to KNOWN_RULES)"
        elif not check(obj):
            yield f"{path}: {rule['message']}"
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(obj, dict) and "properties" in schema:
        for key, value in obj.items():
            if key not in schema["properties"]:
                yield f"{path}.{key}: not in the schema (the API server prunes it)"
            else:
                yield from _walk(value, schema["properties"][key], f"{path}.{key}")
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in obj.items():
            yield from _walk(value, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            yield from _walk(value, schema["items"], f"{path}[{i}]")


def assert_valid(obj: dict[str, Any], crd: Path) -> None:
    schema = _crd_schema(crd)
    jsonschema.Draft4Validator(schema).validate(obj)
    problems = list(_walk({k: v for k, v in obj.items() if k != "metadata"}, schema, "$"))
    assert not problems, problems


def test_the_copied_crds_are_the_pinned_upstream_files() -> None:
    present = [(copy_, src) for copy_, src in UPSTREAM.items() if src.exists()]
    if not present:
        pytest.skip("no KEDA modules in the Go module cache")
    for copy_, src in present:
        assert copy_.read_bytes() == src.read_bytes(), f"{copy_.name} differs from {src}"


def test_the_schema_check_catches_what_the_api_server_would_refuse_or_prune() -> None:
    good = httpso(plan())
    assert_valid(good, HTTPSO_CRD)
    for mutate in (
        lambda o: o["spec"]["scaleTargetRef"].update(portName="http"),  # CEL: port xor name
        lambda o: o["spec"]["timeouts"].update(conditionWait=300),  # type
        lambda o: o["spec"]["coldStartTimeoutFailoverRef"].pop("service"),  # required
        lambda o: o["spec"].update(idleSeconds=300),  # pruned
    ):
        bad = copy.deepcopy(good)
        mutate(bad)
        with pytest.raises((AssertionError, jsonschema.ValidationError)):
            assert_valid(bad, HTTPSO_CRD)


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


def test_engine_service_selects_the_serving_pods_on_the_serving_port() -> None:
    p = plan()
    svc = build_engine_service(p).to_dict()
    model_svc = build_service(p).to_dict()
    assert svc["metadata"]["name"] == "granite-engine"
    assert svc["spec"]["selector"] == names.server_selector("granite") == (
        model_svc["spec"]["selector"])
    assert svc["spec"]["ports"] == model_svc["spec"]["ports"]
    assert svc["spec"]["ports"][0]["port"] == 8080
    [ref] = svc["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "SpyreModel", "granite", "uid-granite", True)
    assert svc["metadata"]["labels"][names.MODEL_LABEL] == "granite"


def test_http_scaled_object_routes_the_models_service_names_to_the_engine_service() -> None:
    obj = httpso(plan())
    assert (obj["apiVersion"], obj["kind"]) == ("http.keda.sh/v1alpha1", "HTTPScaledObject")
    meta = obj["metadata"]
    assert (meta["name"], meta["namespace"]) == ("granite", "team-a")
    assert meta["annotations"] == {SKIP_SCALED_OBJECT_ANNOTATION: "true"}
    assert meta["ownerReferences"][0]["uid"] == "uid-granite"
    spec = obj["spec"]
    assert spec["hosts"] == ["granite", "granite.team-a", "granite.team-a.svc",
                             "granite.team-a.svc.cluster.local"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel", "name": "granite",
        "service": "granite-engine", "port": 8080}
    assert spec["replicas"] == {"min": 0, "max": 3}
    assert spec["scaledownPeriod"] == 300
    # the rate over a short window: a request shorter than the scaler's 500 ms sample still
    # counts as use (in-flight concurrency missed a trickle of short requests)
    assert spec["scalingMetric"] == {"requestRate": {
        "targetValue": HTTP_RATE_TARGET, "window": "10s", "granularity": "1s"}}
    assert spec["timeouts"] == {"conditionWait": "300s", "responseHeader": "600s"}
    assert spec["coldStartTimeoutFailoverRef"] == {
        "service": "spyre-model-operator-coldstart", "port": 8082, "timeoutSeconds": 300}
    assert_valid(obj, HTTPSO_CRD)


def test_http_scaled_object_takes_the_models_settings() -> None:
    spec = httpso(plan(s2z_spec(maxReplicas=5, scaleToZero={
        "idleSeconds": 900, "maxWaitSeconds": 45, "responseTimeoutSeconds": 1800})))["spec"]
    assert spec["timeouts"] == {"conditionWait": "45s", "responseHeader": "1800s"}
    assert spec["coldStartTimeoutFailoverRef"]["timeoutSeconds"] == 45
    assert spec["scaledownPeriod"] == 900
    assert spec["replicas"] == {"min": 0, "max": 5}


def test_long_dotted_model_names_everywhere() -> None:
    p = plan(name=LONG_DOTTED)
    svc = names.server_name(LONG_DOTTED)
    obj = httpso(p)
    assert obj["metadata"]["name"] == svc and DNS1035.match(svc)
    assert obj["spec"]["hosts"] == [svc, f"{svc}.team-a", f"{svc}.team-a.svc",
                                    f"{svc}.team-a.svc.cluster.local"]
    assert obj["spec"]["scaleTargetRef"]["name"] == LONG_DOTTED  # the SpyreModel itself
    assert obj["spec"]["scaleTargetRef"]["service"] == names.engine_service_name(LONG_DOTTED)
    assert build_engine_service(p).to_dict()["metadata"]["name"] == (
        names.engine_service_name(LONG_DOTTED))
    so = scaled_object(p)
    assert so["metadata"]["name"] == svc
    assert so["spec"]["scaleTargetRef"]["name"] == LONG_DOTTED
    assert so["spec"]["triggers"][0]["metadata"]["httpScaledObject"] == svc
    label = names.model_label_value(LONG_DOTTED)
    assert f'serving_spyre_dev_model="{label}"' in so["spec"]["triggers"][1]["metadata"]["query"]
    assert_valid(obj, HTTPSO_CRD)
    assert_valid(so, SO_CRD)


def test_scaled_object_scales_the_model_from_zero_with_the_hpas_targets_and_behavior() -> None:
    from spyre_operator.desired.autoscaling import build_hpa

    p = plan()
    so = scaled_object(p)
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert so["metadata"]["name"] == "granite" and "annotations" not in so["metadata"]
    assert so["metadata"]["ownerReferences"][0]["uid"] == "uid-granite"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel", "name": "granite"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (
        0, 3, 300)
    assert spec["initialCooldownPeriod"] == 300  # a new model is not at zero at once
    hpa = build_hpa(p).to_dict()["spec"]
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 120
    push, *prom, in_flight = spec["triggers"]
    assert push == {"type": "external-push", "name": "http-requests",
                    "metadata": {"scalerAddress": SCALER, "httpScaledObject": "granite"}}
    # a long stream makes no new arrival: requests running on the engine keep it up
    assert in_flight["name"] == IN_FLIGHT_TRIGGER
    assert in_flight["metadata"]["activationThreshold"] == "0"
    assert float(in_flight["metadata"]["threshold"]) >= HTTP_RATE_TARGET
    assert "vllm:num_requests_running{" in in_flight["metadata"]["query"]
    assert [(t["type"], t["metricType"], t["metadata"]["threshold"]) for t in prom] == [
        ("prometheus", "AverageValue", "2"), ("prometheus", "AverageValue", "0.8")]
    assert len(prom) == len(hpa["metrics"])
    sel = 'namespace="team-a",serving_spyre_dev_model="granite"'
    assert [t["metadata"]["query"] for t in prom] == [
        f"sum(max by (pod, engine) (vllm:num_requests_waiting{{{sel}}}))",
        f"sum(max by (pod, engine) (vllm:kv_cache_usage_perc{{{sel}}}))",
    ]
    assert {t["metadata"]["serverAddress"] for t in prom} == {PROMETHEUS}
    assert_valid(so, SO_CRD)


@pytest.mark.parametrize(("targets", "expected"), [
    ({"targetQueueLength": 2}, ["vllm:num_requests_waiting"]),
    ({"targetRunningRequests": 4}, ["vllm:num_requests_running"]),
    ({"targetQueueLength": 1, "targetKvCacheUsage": 0.5, "targetRunningRequests": 3},
     ["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:num_requests_running"]),
])
def test_one_prometheus_trigger_per_target(targets: dict[str, float], expected: list[str]) -> None:
    spec = s2z_spec()
    for key in ("targetQueueLength", "targetKvCacheUsage", "targetRunningRequests"):
        spec["autoscaling"].pop(key, None)
    spec["autoscaling"].update(targets)
    so = scaled_object(plan(spec))
    prom = so["spec"]["triggers"][1:-1]
    series = [re.search(r"(vllm:[a-z_]+)\{", t["metadata"]["query"]) for t in prom]
    assert [m.group(1) for m in series if m] == expected
    assert len({t["name"] for t in so["spec"]["triggers"]}) == len(so["spec"]["triggers"])
    assert_valid(so, SO_CRD)


@pytest.mark.parametrize(("value", "text"), [(2, "2"), (2.0, "2"), (0.8, "0.8"), (10000, "10000"),
                                             (0.001, "0.001"), (2.5, "2.5")])
def test_thresholds_are_plain_decimals(value: float, text: str) -> None:
    assert number(value) == text


def test_without_prometheus_the_scaled_object_has_the_http_trigger_alone() -> None:
    spec = s2z_spec(maxReplicas=1)
    for key in ("targetQueueLength", "targetKvCacheUsage", "targetRunningRequests"):
        spec["autoscaling"].pop(key, None)
    so = build_scaled_object(plan(spec), scaler_address=SCALER, prometheus_address="").to_dict()
    assert [t["type"] for t in so["spec"]["triggers"]] == ["external-push"]
    assert_valid(so, SO_CRD)


def test_a_woken_model_stays_active_while_the_operator_says_it_is_starting() -> None:
    """The request rate counts a held request once: without the operator's answer, KEDA's
    cooldown ends a wake-up whose load outlasts the rate window plus idleSeconds."""
    spec = s2z_spec(maxReplicas=1)
    for key in ("targetQueueLength", "targetKvCacheUsage", "targetRunningRequests"):
        spec["autoscaling"].pop(key, None)
    url = "http://op-coldstart.spyre-system.svc.cluster.local:8082" + names.starting_path(
        "team-a", "granite")
    so = build_scaled_object(plan(spec), scaler_address=SCALER, prometheus_address="",
                             starting_url=url).to_dict()
    push, starting = so["spec"]["triggers"]
    assert push["type"] == "external-push"
    assert starting == {"type": "metrics-api", "name": "model-starting",
                        "metricType": "AverageValue", "metadata": {
                            "url": url, "format": "json", "valueLocation": "starting",
                            "targetValue": number(HTTP_RATE_TARGET),
                            "activationTargetValue": "0"}}  # fmt: skip
    # activation only: its value (0 or 1) never asks for a second replica
    assert float(starting["metadata"]["targetValue"]) >= HTTP_RATE_TARGET
    assert_valid(so, SO_CRD)


def test_builders_refuse_a_model_that_does_not_scale_to_zero() -> None:
    p = plan(s2z_spec(minReplicas=1))
    with pytest.raises(AssertionError):
        build_scaled_object(p, scaler_address=SCALER, prometheus_address=PROMETHEUS)
    with pytest.raises(AssertionError):
        build_http_scaled_object(p, failover_service="x", failover_port=1)


#: metadata.labels values and keys as the API server validates them (apimachinery validation).
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^(([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def test_every_object_carries_labels_the_api_server_accepts() -> None:
    """(The mirrored EndpointSlice's managed-by value once had a '/': the API server refused
    it on the real node and the model's Service had no endpoints.)"""
    p = plan(name=LONG_DOTTED)
    slice_ = build_mirror_slice(
        p, [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}}], 18080, "IPv4")
    objs = [build_engine_service(p).to_dict(), build_interceptor_service(p).to_dict(),
            build_coldstart_service(p, "x.keda.svc.cluster.local", 8082).to_dict(),
            slice_.to_dict(), httpso(p), scaled_object(p)]
    for obj in objs:
        for k, v in obj["metadata"]["labels"].items():
            assert LABEL_NAME.match(k) and len(k.rpartition("/")[2]) <= 63, (obj["kind"], k)
            assert LABEL_VALUE.match(v) and len(v) <= 63, (obj["kind"], k, v)
    sl = slice_.to_dict()
    assert sl["metadata"]["labels"]["kubernetes.io/service-name"] == names.server_name(LONG_DOTTED)
    assert sl["ports"] == [{"name": "http", "port": 18080, "protocol": "TCP",
                            "appProtocol": "http"}]
    assert sl["endpoints"][0]["addresses"] == ["10.0.0.7"]
