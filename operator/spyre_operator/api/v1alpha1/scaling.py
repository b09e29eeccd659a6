"""Scaling (scale to zero, autoscaling) and the Gateway routing through an InferencePool."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from .common import ApiModel, cel


class ScaleToZeroSpec(ApiModel):
    """How a model with ``minReplicas: 0`` goes to zero and wakes (KEDA + its HTTP add-on).

    Requests reach the model through the HTTP add-on's interceptor, which counts them, holds
    one that arrives at zero until a replica is Ready and then forwards it
    (``desired/scaletozero.py``; operator/SCALE-TO-ZERO.md).
    """

    idle_seconds: int = Field(
        default=300,
        ge=30,
        le=86400,
        description=(
            "Seconds without a request after which the model goes to 0 replicas (its cards "
            "are freed). Becomes the KEDA ScaledObject's cooldownPeriod and the "
            "HTTPScaledObject's scaledownPeriod."
        ),
    )
    max_wait_seconds: int = Field(
        default=300,
        ge=1,
        le=3600,
        description=(
            "Seconds a request that arrives at zero is held while a replica starts; past it "
            "the client gets 503 with Retry-After. Becomes the HTTPScaledObject's "
            "timeouts.conditionWait and coldStartTimeoutFailoverRef.timeoutSeconds (the "
            "503 comes from the operator's cold-start responder)."
        ),
    )
    response_timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=86400,
        description=(
            "Seconds the proxy waits for a forwarded request's response headers (vLLM sends "
            "them for a non-streamed completion only when it is done). Becomes the "
            "HTTPScaledObject's timeouts.responseHeader (the interceptor's default is 500ms)."
        ),
    )


class AutoscalingSpec(ApiModel):
    """A HorizontalPodAutoscaler on the engine's own load, scaling this SpyreModel's ``/scale``.

    The targets are per-pod averages of the engine's metrics, served to the HPA by
    prometheus-adapter under the names in ``desired/autoscaling.py`` (docs/reference.md:
    Autoscaling).
    With ``minReplicas: 0`` the model scales to zero when idle: KEDA and its HTTP add-on
    replace the HPA (same targets, as Prometheus queries; ``desired/scaletozero.py``).
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
                    "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
                ),
                cel(
                    "has(self.targetQueueLength) || has(self.targetKvCacheUsage) || "
                    "has(self.targetRunningRequests) || "
                    "(has(self.minReplicas) && self.minReplicas == 0 && self.maxReplicas == 1)",
                    "autoscaling needs at least one target: targetQueueLength, "
                    "targetKvCacheUsage or targetRunningRequests (only minReplicas: 0 with "
                    "maxReplicas: 1, which scales 0 <-> 1 on requests alone, needs none)",
                ),
                cel(
                    "!has(self.scaleToZero) || "
                    "(has(self.minReplicas) && self.minReplicas == 0)",
                    "autoscaling.scaleToZero is only allowed with autoscaling.minReplicas: 0 "
                    "(minReplicas 0 is what lets the model scale to zero)",
                ),
            ]
        }
    )

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Fewest serving replicas. 0: scale to zero after scaleToZero.idleSeconds without a "
            "request and wake on the next one (needs KEDA and its HTTP add-on; the KEDA "
            "ScaledObject's minReplicaCount)."
        ),
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most serving replicas.")
    target_queue_length: float | None = Field(
        default=None,
        gt=0,
        le=10000,
        description="Average requests waiting per pod (vllm:num_requests_waiting).",
    )
    target_kv_cache_usage: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Average KV-cache usage per pod, 0-1 (vllm:kv_cache_usage_perc).",
    )
    target_running_requests: float | None = Field(
        default=None,
        gt=0,
        le=10000,
        description="Average requests running per pod (vllm:num_requests_running).",
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description=(
            "How long load must stay low before replicas are removed (a new replica loads "
            "its artifact in about a minute; scaling down too early wastes that)."
        ),
    )
    scale_to_zero: ScaleToZeroSpec | None = Field(
        default=None,
        description=(
            "Idle period and wake-up bounds of a model with minReplicas: 0 (only then; "
            "defaults apply when it is left out)."
        ),
    )

    @model_validator(mode="after")
    def _valid(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        if self.scale_to_zero is not None and self.min_replicas != 0:
            raise ValueError("scaleToZero is only allowed with minReplicas: 0")
        if (
            self.target_queue_length is None
            and self.target_kv_cache_usage is None
            and self.target_running_requests is None
            and not (self.min_replicas == 0 and self.max_replicas == 1)
        ):
            raise ValueError(
                "autoscaling needs at least one target (only minReplicas: 0 with "
                "maxReplicas: 1, which scales 0 <-> 1 on requests alone, needs none)"
            )
        return self


class EndpointPickerRef(ApiModel):
    """The Endpoint Picker (EPP) Service the Gateway asks which pod serves each request."""

    name: str = Field(
        description="Name of the endpoint picker's Service, in the SpyreModel's namespace.",
        min_length=1,
        max_length=253,
    )
    port: int = Field(
        default=9002,
        ge=1,
        le=65535,
        description="Service port of the endpoint picker's ext-proc gRPC server (EPP: 9002).",
    )
    failure_mode: Literal["FailClose", "FailOpen"] = Field(
        default="FailClose",
        description=(
            "What the Gateway does when the endpoint picker does not answer: FailClose drops "
            "the request, FailOpen forwards it to a pod of the Gateway's choosing."
        ),
    )


class InferencePoolRouting(ApiModel):
    """An InferencePool (Gateway API Inference Extension, inference.networking.k8s.io/v1)."""

    endpoint_picker: EndpointPickerRef = Field(
        description=(
            "The endpoint picker that routes this pool's requests (deployed with the "
            "Inference Extension; it reads the pods' vllm:num_requests_waiting, "
            "vllm:kv_cache_usage_perc, ... from /metrics)."
        )
    )


class RoutingSpec(ApiModel):
    """How inference gateways reach the serving pods (besides the model's Service)."""

    inference_pool: InferencePoolRouting | None = Field(
        default=None,
        description=(
            "Create an InferencePool named like the Service, selecting this model's serving "
            "pods on serving.port, for a Gateway's HTTPRoute to reference. Needs the Gateway "
            "API Inference Extension CRDs; without them the RoutingReady condition says so and "
            "the model still serves through its Service."
        ),
    )
