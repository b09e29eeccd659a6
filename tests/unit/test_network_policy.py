"""serving.allowFrom and metricsFrom: the NetworkPolicy of a model's serving pods (who may call
the model, who may scrape it).

What the operator writes, applies and deletes; the API server's checks of the field are in
tests/integration/test_admission_dryrun.py and the policy on a live cluster in
tests/integration/test_network_policy.py."""

from __future__ import annotations

from typing import Any

from lightkube.resources.networking_v1 import NetworkPolicy
from spyre_operator.api import SpyreModelSpec
from spyre_operator.decide import Observed, decide
from spyre_operator.desired import names
from spyre_operator.desired.networkpolicy import build_network_policy
from spyre_operator.desired.plan import plan_model

from .samples import GENERATE, model
from .test_reconcile import NOW, job_obj
from .test_reconcile_correctness import bound

GATEWAY = {"namespaceSelector": {"kubernetes.io/metadata.name": "gateway"},
           "podSelector": {"app": "envoy"}}
ALLOWED = {**GENERATE, "serving": {"allowFrom": [GATEWAY, {"podSelector": {"role": "client"}},
                                                 {"cidr": "10.1.0.0/16"}]}}


def plan(spec: dict[str, Any]) -> Any:
    return plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(spec))


def test_only_the_listed_clients_reach_the_serving_port() -> None:
    np = build_network_policy(plan(ALLOWED), None).to_dict()
    assert np["metadata"]["name"] == names.server_name("m")
    assert np["metadata"]["ownerReferences"][0]["kind"] == "SpyreModel"
    spec = np["spec"]
    assert spec["podSelector"]["matchLabels"] == names.server_selector("m")
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}},
         "podSelector": {"matchLabels": {"app": "envoy"}}},
        {"podSelector": {"matchLabels": {"role": "client"}}},  # the model's own namespace
        {"ipBlock": {"cidr": "10.1.0.0/16"}},
    ]


def test_empty_admits_nobody_but_the_interceptor_of_a_model_at_zero() -> None:
    p = plan({**GENERATE, "serving": {"allowFrom": []}})
    assert build_network_policy(p, None).to_dict()["spec"].get("ingress") in (None, [])
    (rule,) = build_network_policy(p, "keda").to_dict()["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "keda"}}}]


def serving_obs(m: dict[str, Any]) -> Observed:
    return Observed(cache_pvc=bound(), job=job_obj(m, "Complete"))


def test_applied_with_allow_from_and_deleted_without() -> None:
    m = model("m", ALLOWED)
    d = decide(m, serving_obs(m), NOW)
    (np,) = [o for o in d.apply if o.kind == "NetworkPolicy"]
    assert np.metadata.name == names.server_name("m")
    # allowFrom removed: the operator's policy goes
    m = model("m", GENERATE)
    obs = serving_obs(m)
    obs.network_policy = np.to_dict()
    d = decide(m, obs, NOW)
    assert not [o for o in d.apply if o.kind == "NetworkPolicy"]
    assert (NetworkPolicy, names.server_name("m")) in d.delete
    # never had one: nothing to delete
    d = decide(m, serving_obs(m), NOW)
    assert not [k for k, _ in d.delete if k is NetworkPolicy]


def test_a_foreign_policy_of_that_name_is_reported_only_when_wanted() -> None:
    why = "NetworkPolicy m exists and is not managed by the operator"
    m = model("m", ALLOWED)
    obs = serving_obs(m)
    obs.foreign["NetworkPolicy"] = why
    d = decide(m, obs, NOW)
    degraded = next(c for c in d.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and why in degraded["message"], degraded
    m = model("m", GENERATE)
    obs = serving_obs(m)
    obs.foreign["NetworkPolicy"] = why
    d = decide(m, obs, NOW)
    degraded = next(c for c in d.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False", degraded


PROMETHEUS = {"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"}}
PROMETHEUS_PEER = {"namespaceSelector": {
    "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
GATEWAY_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}},
                "podSelector": {"matchLabels": {"app": "envoy"}}}


def rules(serving: dict[str, Any], interceptor: str | None = None) -> dict[str, Any]:
    """Port name -> the peers the policy admits there (None: every source)."""
    np = build_network_policy(plan({**GENERATE, "serving": serving}), interceptor).to_dict()
    out: dict[str, Any] = {}
    for rule in np["spec"].get("ingress") or []:
        (port,) = rule["ports"]
        out[port["port"]] = rule.get("from")
    return out


def test_metrics_from_admits_the_scrapers_to_the_metrics_port_only() -> None:
    got = rules({"allowFrom": [GATEWAY], "metricsPort": 8001, "metricsFrom": [PROMETHEUS]}, "keda")
    assert got == {"http": [GATEWAY_PEER, {"namespaceSelector": {
                       "matchLabels": {"kubernetes.io/metadata.name": "keda"}}}],
                   "metrics": [PROMETHEUS_PEER]}


def test_metrics_port_without_metrics_from_admits_the_serving_ports_clients() -> None:
    # not the interceptor: it forwards requests, it does not scrape
    assert rules({"allowFrom": [GATEWAY], "metricsPort": 8001}, "keda")["metrics"] == [
        GATEWAY_PEER]
    # allowFrom: [] and no metricsFrom: nobody on either port (but the interceptor on http)
    assert rules({"allowFrom": [], "metricsPort": 8001}) == {}


def test_metrics_from_alone_leaves_the_serving_port_open() -> None:
    p = plan({**GENERATE, "serving": {"metricsPort": 8001, "metricsFrom": [PROMETHEUS]}})
    m = model("m", {**GENERATE, "serving": {"metricsPort": 8001, "metricsFrom": [PROMETHEUS]}})
    assert [o for o in decide(m, serving_obs(m), NOW).apply if o.kind == "NetworkPolicy"]
    got = rules({"metricsPort": 8001, "metricsFrom": [PROMETHEUS]})
    assert got == {"http": None, "metrics": [PROMETHEUS_PEER]}  # http: from every source
    assert build_network_policy(p, None).to_dict()["spec"]["policyTypes"] == ["Ingress"]
    # metricsFrom: [] closes the metrics port only
    assert rules({"metricsPort": 8001, "metricsFrom": []}) == {"http": None}


def test_a_canary_model_admits_the_operators_namespace_to_read_its_count() -> None:
    """Issue 44: the operator reads each canary pod's judged requests from the serving port;
    a model whose allowFrom admits only its clients would make every canary wait for its
    deadline. Only a model with a canary, only the operator's namespace."""
    allowed = {"allowFrom": [{"podSelector": {"role": "client"}}]}
    with_canary = plan({**GENERATE, "serving": {**allowed, "canary": {"replicas": 1}}})
    (rule,) = build_network_policy(with_canary, None, "spyre-system").to_dict()["spec"]["ingress"]
    assert rule["from"][-1] == {"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "spyre-system"}}}
    (rule,) = build_network_policy(plan({**GENERATE, "serving": allowed}), None,
                                   "spyre-system").to_dict()["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"role": "client"}}}]
