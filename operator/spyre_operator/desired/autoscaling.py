"""The HorizontalPodAutoscaler of an autoscaled SpyreModel (pure).

The HPA scales the SpyreModel through its ``/scale`` subresource, not the Deployment: a
compile-affecting edit rolls the serving pods onto a new artifact inside the same Deployment,
and the operator stays the only writer of the Deployment. ``spec.replicas`` then belongs to
the HPA (its field manager), so GitOps manifests of an autoscaled model leave it out.

The metrics are the engine's own, averaged per pod, as prometheus-adapter serves them under
``custom.metrics.k8s.io``: Prometheus series names contain colons, which metric names in that
API cannot, so the adapter renames ``vllm:X`` to ``vllm_X`` (the rule is in docs/reference.md and in
``tests/cluster/metrics.py``).
"""

from __future__ import annotations

from decimal import Decimal

from lightkube.models.autoscaling_v2 import (
    CrossVersionObjectReference,
    HorizontalPodAutoscalerBehavior,
    HorizontalPodAutoscalerSpec,
    HPAScalingPolicy,
    HPAScalingRules,
    MetricIdentifier,
    MetricSpec,
    MetricTarget,
    PodsMetricSource,
)
from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler

from .. import KIND
from ..api.v1alpha1 import AutoscalingSpec
from .owners import API_VERSION
from .plan import ModelPlan
from .service import server_meta

#: custom.metrics.k8s.io names (prometheus-adapter's rename of the engine's vLLM series).
QUEUE_METRIC = "vllm_num_requests_waiting"
KV_CACHE_METRIC = "vllm_kv_cache_usage_perc"
RUNNING_METRIC = "vllm_num_requests_running"


def wants_hpa(plan: ModelPlan) -> bool:
    return plan.spec.autoscaling is not None


def quantity(value: float) -> str:
    """A Kubernetes quantity for ``value``, exact to the milli (0.8 -> 800m, 2 -> 2)."""
    milli = int((Decimal(str(value)) * 1000).to_integral_value())
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _pods_metric(name: str, average: float) -> MetricSpec:
    return MetricSpec(
        type="Pods",
        pods=PodsMetricSource(
            metric=MetricIdentifier(name=name),
            target=MetricTarget(type="AverageValue", averageValue=quantity(average)),
        ),
    )


def targets(auto: AutoscalingSpec) -> list[tuple[str, float]]:
    """(custom metric name, per-pod average target) for every target the spec sets."""
    return [
        (metric, target)
        for metric, target in (
            (QUEUE_METRIC, auto.target_queue_length),
            (KV_CACHE_METRIC, auto.target_kv_cache_usage),
            (RUNNING_METRIC, auto.target_running_requests),
        )
        if target is not None
    ]


def hpa_behavior(auto: AutoscalingSpec) -> HorizontalPodAutoscalerBehavior:
    """Up: at most one new replica per minute (each needs a card and a model load); down:
    after the stabilisation window, one at a time. (KEDA's HPA gets the same, scaletozero.py.)"""
    return HorizontalPodAutoscalerBehavior(
        scaleUp=HPAScalingRules(
            stabilizationWindowSeconds=0,
            selectPolicy="Max",
            policies=[HPAScalingPolicy(type="Pods", value=1, periodSeconds=60)],
        ),
        scaleDown=HPAScalingRules(
            stabilizationWindowSeconds=auto.scale_down_stabilization_seconds,
            selectPolicy="Max",
            policies=[HPAScalingPolicy(type="Pods", value=1, periodSeconds=60)],
        ),
    )


def build_hpa(plan: ModelPlan) -> HorizontalPodAutoscaler:
    """autoscaling/v2 HPA on the model's ``/scale``, one Pods metric per target set."""
    auto = plan.spec.autoscaling
    assert auto is not None
    return HorizontalPodAutoscaler(
        metadata=server_meta(plan),
        spec=HorizontalPodAutoscalerSpec(
            scaleTargetRef=CrossVersionObjectReference(
                apiVersion=API_VERSION, kind=KIND, name=plan.name
            ),
            minReplicas=auto.min_replicas,
            maxReplicas=auto.max_replicas,
            metrics=[_pods_metric(metric, target) for metric, target in targets(auto)],
            behavior=hpa_behavior(auto),
        ),
    )
