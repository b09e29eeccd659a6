"""The InferencePool (Gateway API Inference Extension) in front of the serving pods (pure).

An InferencePool tells a Gateway which pods serve a model and on which port, and which
endpoint picker (EPP) chooses among them per request from the pods' own metrics
(``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``;
the extension's model-server protocol). The pool selects exactly what the model's Service
selects: the model's serving pods of every artifact, so a rollout keeps the pool populated.
"""

from __future__ import annotations

from typing import Any

from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta

from . import names
from .owners import controller_ref
from .plan import ModelPlan

INFERENCE_GROUP = "inference.networking.k8s.io"
INFERENCE_VERSION = "v1"
INFERENCE_POOL_KIND = "InferencePool"
INFERENCE_POOL_PLURAL = "inferencepools"

InferencePool = create_namespaced_resource(
    INFERENCE_GROUP, INFERENCE_VERSION, INFERENCE_POOL_KIND, INFERENCE_POOL_PLURAL
)


def wants_inference_pool(plan: ModelPlan) -> bool:
    """Whether the spec asks for an InferencePool."""
    routing = plan.spec.routing
    return routing is not None and routing.inference_pool is not None


def inference_pool_name(model: str) -> str:
    """The pool is named like the model's Service (an RFC 1035 label, so always valid)."""
    return names.server_name(model)


def build_inference_pool(plan: ModelPlan) -> Any:
    """The model's InferencePool: its serving pods, on serving.port, behind its endpoint picker."""
    routing = plan.spec.routing
    assert routing is not None and routing.inference_pool is not None
    epp = routing.inference_pool.endpoint_picker
    return InferencePool(
        apiVersion=f"{INFERENCE_GROUP}/{INFERENCE_VERSION}",
        kind=INFERENCE_POOL_KIND,
        metadata=ObjectMeta(
            name=inference_pool_name(plan.name),
            namespace=plan.namespace,
            labels={
                **names.common_labels(names.COMPONENT_SERVER),
                names.MODEL_LABEL: names.model_label_value(plan.name),
            },
            ownerReferences=[controller_ref(plan.owner)],
        ),
        spec={
            "selector": {"matchLabels": names.server_selector(plan.name)},
            "targetPorts": [{"number": plan.spec.serving.port}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": epp.name,
                "port": {"number": epp.port},
                "failureMode": epp.failure_mode,
            },
        },
    )
