"""serving.allowFrom and metricsFrom on the real API server (kwok plays the pods): the
operator writes the model's NetworkPolicy, keeps it in step with edits, deletes it when both
go, and reports a same-named policy it does not own instead of taking it over. Whether a
network plugin enforces it is the plugin's part (this cluster's bridge CNI does not)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Kube, OperatorProcess
from .test_precompile_lifecycle import spec

pytestmark = pytest.mark.integration


def policy(kube: Kube, name: str) -> dict[str, Any] | None:
    return kube.get("networkpolicy", name)  # type: ignore[no-any-return]


def test_the_policy_follows_allow_from(kube: Kube, operator: OperatorProcess) -> None:
    gateway = {"namespaceSelector": {"kubernetes.io/metadata.name": "gateway"}}
    kube.apply_model("m", {**spec(), "serving": {"allowFrom": [gateway]}})
    np = kube.wait(lambda: policy(kube, "m"), 60, "the model's NetworkPolicy")
    assert np["metadata"]["ownerReferences"][0]["name"] == "m"
    (rule,) = np["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "gateway"}}}]
    assert np["spec"]["podSelector"]["matchLabels"]["serving.spyre.dev/model"] == "m"
    kube.wait_condition("m", "Ready", timeout=120)

    # an edit: the policy follows (no recompile: allowFrom is not part of the artifact key)
    key = kube.model("m")["status"]["artifact"]["key"]
    kube.apply_model("m", {**spec(), "serving": {"allowFrom": [{"cidr": "10.9.0.0/16"}]}})
    kube.wait(lambda: (policy(kube, "m") or {}).get("spec", {}).get("ingress", [{}])[0]
              .get("from") == [{"ipBlock": {"cidr": "10.9.0.0/16"}}], 60, "the edited policy")
    assert kube.model("m")["status"]["artifact"]["key"] == key

    # the metrics on a port of their own, scraped from the monitoring namespace only: a second
    # rule; the Service gains the port
    monitoring = {"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"}}
    kube.apply_model("m", {**spec(), "serving": {"allowFrom": [{"cidr": "10.9.0.0/16"}],
                                                 "metricsPort": 9400,
                                                 "metricsFrom": [monitoring]}})

    def rules() -> dict[str, Any]:
        ingress = (policy(kube, "m") or {}).get("spec", {}).get("ingress") or []
        return {r["ports"][0]["port"]: r.get("from") for r in ingress}

    kube.wait(lambda: rules() == {
        "http": [{"ipBlock": {"cidr": "10.9.0.0/16"}}],
        "metrics": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}]}, 60, "the metrics rule")
    service = kube.get("service", "m")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 8000, "metrics": 9400}

    # metricsFrom alone: the serving port open to every source, the metrics port restricted
    kube.apply_model("m", {**spec(), "serving": {"metricsPort": 9400,
                                                 "metricsFrom": [monitoring]}})
    kube.wait(lambda: set(rules()) == {"http", "metrics"} and rules()["http"] is None, 60,
              "the serving port open, the metrics restricted")

    # allowFrom and metricsFrom removed: the policy goes
    kube.apply_model("m", spec())
    kube.wait(lambda: policy(kube, "m") is None, 60, "the policy deleted")


def test_a_policy_that_is_not_the_operators_is_reported(kube: Kube,
                                                        operator: OperatorProcess) -> None:
    kube.kubectl("apply", "-f", "-", input="""
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: theirs}
spec: {podSelector: {}, policyTypes: [Ingress]}
""")
    kube.apply_model("theirs", {**spec(), "serving": {"allowFrom": []}})
    kube.wait_condition("theirs", "Degraded", "True", timeout=60)
    cond = kube.condition("theirs", "Degraded")
    assert cond is not None and "NetworkPolicy theirs" in cond["message"], cond
    np = policy(kube, "theirs")
    assert np is not None and not np["metadata"].get("ownerReferences"), "taken over"
