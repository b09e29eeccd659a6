"""The NetworkPolicy of a model's serving pods (serving.allowFrom): who may call the model."""

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
from .deployment import PORT_NAME
from .plan import ModelPlan
from .service import server_meta

#: The label every namespace carries with its name (Kubernetes >= 1.21).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def wants_network_policy(plan: ModelPlan) -> bool:
    return plan.spec.serving.allow_from is not None


def peer(client: AllowedClients) -> NetworkPolicyPeer:
    if client.cidr is not None:
        return NetworkPolicyPeer(ipBlock=IPBlock(cidr=client.cidr))
    return NetworkPolicyPeer(
        namespaceSelector=(None if client.namespace_selector is None
                           else LabelSelector(matchLabels=client.namespace_selector)),
        podSelector=(None if client.pod_selector is None
                     else LabelSelector(matchLabels=client.pod_selector)),
    )


def build_network_policy(plan: ModelPlan, interceptor_namespace: str | None) -> NetworkPolicy:
    """Ingress to the model's serving pods (every artifact's) on the serving port from
    serving.allowFrom only, plus the scale-to-zero interceptor's namespace when the model
    scales to zero through it. Other ports of the pods: none exist (probes come from the
    kubelet, which NetworkPolicies do not restrict)."""
    peers = [peer(c) for c in plan.spec.serving.allow_from or []]
    if interceptor_namespace:
        peers.append(NetworkPolicyPeer(namespaceSelector=LabelSelector(
            matchLabels={NAMESPACE_NAME_LABEL: interceptor_namespace})))
    rules = [NetworkPolicyIngressRule(
        ports=[NetworkPolicyPort(port=PORT_NAME, protocol="TCP")], from_=peers,
    )] if peers else []
    return NetworkPolicy(
        metadata=server_meta(plan),
        spec=NetworkPolicySpec(
            podSelector=LabelSelector(matchLabels=names.server_selector(plan.name)),
            policyTypes=["Ingress"],
            ingress=rules,
        ),
    )
