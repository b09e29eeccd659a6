"""Spyre cards claimed through Dynamic Resource Allocation (spec.accelerator.deviceClassName):
the model's ResourceClaimTemplate and what a pod on the cards says to use it (pure).

With IBM's Spyre Operator in DRA mode (driver ``spyre.ibm.com``) the device plugin's extended
resources do not exist: a pod names a claim made from a template instead, kube-scheduler
allocates the devices and the driver's CDI edits give the container what the device plugin
gave it (PCIDEVICE_IBM_COM_AIU_PF, the VFIO nodes, /etc/aiu), so the pod's env is the same.
"""

from __future__ import annotations

from typing import Any

from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.core_v1 import PodResourceClaim
from lightkube.models.core_v1 import ResourceClaim as ContainerClaim
from lightkube.models.meta_v1 import ObjectMeta

from ..api.v1alpha1 import SpyreModelSpec
from . import names
from .owners import controller_ref
from .plan import ModelPlan

#: resource.k8s.io/v1 (Kubernetes 1.34+), as generic resources: lightkube-models has typed ones
#: only from 1.34, and the operator runs on lightkube-models 1.33 (pyproject.toml's floor).
RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"
ResourceClaimTemplate = create_namespaced_resource(
    RESOURCE_GROUP, RESOURCE_VERSION, "ResourceClaimTemplate", "resourceclaimtemplates"
)
ResourceClaim = create_namespaced_resource(
    RESOURCE_GROUP, RESOURCE_VERSION, "ResourceClaim", "resourceclaims"
)
DeviceClass = create_global_resource(RESOURCE_GROUP, RESOURCE_VERSION, "DeviceClass",
                                     "deviceclasses")

#: The pod's name for its claim (spec.resourceClaims[].name, the container's resources.claims)
#: and the request's in the template.
POD_CLAIM = "spyre"
REQUEST = "cards"


def card_count(spec: SpyreModelSpec) -> int:
    """How many cards a pod on the cards uses: one per tensor-parallel worker."""
    # plan_model resolved the shape: tensorParallelSize is set (1 only for a bare spec).
    return spec.compile.tensor_parallel_size or 1


def device_class(spec: SpyreModelSpec) -> str | None:
    """The DeviceClass the model's pods claim cards of (None: the extended resource)."""
    return spec.accelerator.device_class_name


def cards_template_name(plan: ModelPlan) -> str:
    """The model's ResourceClaimTemplate for its spec's class and card count."""
    cls = device_class(plan.spec)
    assert cls is not None, "only a model on a DeviceClass has a template"
    return names.cards_template_name(plan.name, cls, card_count(plan.spec))


def build_cards_template(plan: ModelPlan) -> Any:
    """One claim per pod of ``card_count`` devices of the model's class, owned by the model
    (a ResourceClaimTemplate)."""
    cls = device_class(plan.spec)
    assert cls is not None, "only a model on a DeviceClass has a template"
    return ResourceClaimTemplate(
        apiVersion=f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
        kind="ResourceClaimTemplate",
        metadata=ObjectMeta(
            name=cards_template_name(plan),
            namespace=plan.namespace,
            labels={
                **names.common_labels(names.COMPONENT_CARDS),
                names.MODEL_LABEL: names.model_label_value(plan.name),
            },
            ownerReferences=[controller_ref(plan.owner)],
        ),
        spec={"spec": {"devices": {"requests": [{
            "name": REQUEST,
            "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount",
                        "count": card_count(plan.spec)},
        }]}}},
    )  # fmt: skip


def pod_claims(plan: ModelPlan, on_cards: bool) -> list[PodResourceClaim]:
    """spec.resourceClaims of a pod: the model's template, for a pod on the cards under DRA."""
    if not on_cards or device_class(plan.spec) is None:
        return []
    return [PodResourceClaim(name=POD_CLAIM, resourceClaimTemplateName=cards_template_name(plan))]


def container_claims(plan: ModelPlan, on_cards: bool) -> list[ContainerClaim]:
    """The container's resources.claims: the pod's claim, when it has one."""
    return [ContainerClaim(name=c.name) for c in pod_claims(plan, on_cards)]
