"""The NetworkPolicy of a model's serving pods (serving.allowFrom, metricsFrom): who may call
the model, and who may scrape its metrics."""

from __future__ import annotations

from lightkube.models.meta_v1 import LabelSelector
from lightkube.models.networking_v1 import (
    IPBlock,
    NetworkPolicyIngressRule,
    NetworkPolicyPeer,
    NetworkPolicyPort,
    NetworkPolicySpec,
)
from lightkube.resources.networking_v1 import NetworkPolicy

from ..api.v1alpha1 import AllowedClients
from . import names
from .deployment import METRICS_PORT_NAME, PORT_NAME
from .plan import ModelPlan
from .service import server_meta

#: The label every namespace carries with its name (Kubernetes >= 1.21).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def wants_network_policy(plan: ModelPlan) -> bool:
    serving = plan.spec.serving
    return serving.allow_from is not None or serving.metrics_from is not None


def peer(client: AllowedClients) -> NetworkPolicyPeer:
    if client.cidr is not None:
        return NetworkPolicyPeer(ipBlock=IPBlock(cidr=client.cidr))
    return NetworkPolicyPeer(
        namespaceSelector=(None if client.namespace_selector is None
                           else LabelSelector(matchLabels=client.namespace_selector)),
        podSelector=(None if client.pod_selector is None
                     else LabelSelector(matchLabels=client.pod_selector)),
    )


def _namespace(name: str) -> NetworkPolicyPeer:
    """Every pod of namespace ``name``."""
    return NetworkPolicyPeer(
        namespaceSelector=LabelSelector(matchLabels={NAMESPACE_NAME_LABEL: name})
    )


def _rule(port: str, peers: list[NetworkPolicyPeer] | None) -> list[NetworkPolicyIngressRule]:
    """Ingress to ``port`` from ``peers`` (None: from everywhere; []: no rule, nobody)."""
    if peers == []:
        return []
    return [NetworkPolicyIngressRule(
        ports=[NetworkPolicyPort(port=port, protocol="TCP")], from_=peers)]


def build_network_policy(
    plan: ModelPlan, interceptor_namespace: str | None, operator_namespace: str | None = None
) -> NetworkPolicy:
    """Ingress to the model's serving pods (every artifact's).

    The serving port: from serving.allowFrom only (everywhere when it is unset), plus the
    scale-to-zero interceptor's namespace when the model scales to zero through it. The
    metrics port (serving.metricsPort): from serving.metricsFrom, else as allowFrom. No other
    port exists (probes come from the kubelet, which NetworkPolicies do not restrict). A
    model with a canary admits the operator's namespace too: the operator reads each canary
    pod's count of judged requests, and every serving pod's figures for the comparison with
    the baseline, from the serving port (decide/canary_report.py).
    """
    serving = plan.spec.serving
    allowed = None if serving.allow_from is None else [peer(c) for c in serving.allow_from]
    # A new list: ``allowed`` is the metrics port's too.
    serving_peers = None if allowed is None else [*allowed, *(_namespace(ns) for ns in (
        interceptor_namespace, operator_namespace if serving.canary is not None else None,
    ) if ns)]  # fmt: skip
    rules = _rule(PORT_NAME, serving_peers)
    if serving.metrics_port is not None:
        scrapers = allowed if serving.metrics_from is None else [
            peer(c) for c in serving.metrics_from]
        rules += _rule(METRICS_PORT_NAME, scrapers)
    return NetworkPolicy(
        metadata=server_meta(plan),
        spec=NetworkPolicySpec(
            podSelector=LabelSelector(matchLabels=names.server_selector(plan.name)),
            policyTypes=["Ingress"],
            ingress=rules,
        ),
    )
