"""The Service in front of the serving pods, and their PodDisruptionBudget."""

from __future__ import annotations

from lightkube.models.core_v1 import ServicePort, ServiceSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.resources.core_v1 import Service
from lightkube.resources.policy_v1 import PodDisruptionBudget

from . import names
from .deployment import METRICS_PORT_NAME, PORT_NAME
from .owners import controller_ref
from .plan import ModelPlan


def server_meta(plan: ModelPlan) -> ObjectMeta:
    """Metadata of the per-model children beside the Deployment (Service, PDB, HPA): named
    after, and owned by, the model."""
    return ObjectMeta(
        name=names.server_name(plan.name),
        namespace=plan.namespace,
        labels={
            **names.common_labels(names.COMPONENT_SERVER),
            names.MODEL_LABEL: names.model_label_value(plan.name),
        },
        ownerReferences=[controller_ref(plan.owner)],
    )


def serving_ports(plan: ModelPlan) -> list[ServicePort]:
    """`http`, and `metrics` when the metrics have a port of their own (a ServiceMonitor's)."""
    ports = [ServicePort(name=PORT_NAME, port=plan.spec.serving.port, targetPort=PORT_NAME,
                         protocol="TCP", appProtocol="http")]
    if plan.spec.serving.metrics_port is not None:
        ports.append(ServicePort(name=METRICS_PORT_NAME, port=plan.spec.serving.metrics_port,
                                 targetPort=METRICS_PORT_NAME, protocol="TCP", appProtocol="http"))
    return ports


def build_service(plan: ModelPlan) -> Service:
    """ClusterIP Service selecting the model's serving pods of any artifact."""
    return Service(
        metadata=server_meta(plan),
        spec=ServiceSpec(
            type="ClusterIP",
            selector=names.server_selector(plan.name),
            ports=serving_ports(plan),
        ),
    )


def wants_pdb(plan: ModelPlan) -> bool:
    """A PDB only makes sense with more than one replica (or an autoscaler that may add one:
    the PDB then stays while replicas come and go)."""
    auto = plan.spec.autoscaling
    return plan.spec.replicas > 1 or (auto is not None and auto.max_replicas > 1)


def build_pdb(plan: ModelPlan) -> PodDisruptionBudget:
    """At most one serving pod disrupted voluntarily at a time."""
    return PodDisruptionBudget(
        metadata=server_meta(plan),
        spec=PodDisruptionBudgetSpec(
            maxUnavailable=1,
            selector=LabelSelector(matchLabels=names.server_selector(plan.name)),
            unhealthyPodEvictionPolicy="AlwaysAllow",
        ),
    )
