"""``spec`` of a SpyreModel, from the pieces of the other modules."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from .cache import CacheSpec
from .common import ApiModel, Task, cel
from .model import CompileSpec, ModelSource
from .placement import AcceleratorSpec, EngineSpec, PrecompileSpec
from .scaling import AutoscalingSpec, RoutingSpec
from .serving import ServingSpec


class SpyreModelSpec(ApiModel):
    """Desired state of a SpyreModel."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.task != 'generate' || !has(self.compile.warmupShapes)",
                    "compile.warmupShapes apply only to pooling models (task embed, score or "
                    "rerank); generate models compile with chunked prefill "
                    "(compile.maxNumBatchedTokens)",
                ),
                cel(
                    "self.task == 'generate' || !has(self.compile.warmupShapes) || "
                    "size(self.compile.warmupShapes) > 0",
                    "compile.warmupShapes must not be empty: omit it to use the plugin's "
                    "supported shapes for the model",
                ),
            ]
        }
    )

    model: ModelSource = Field(description="The model to serve.")
    task: Task = Field(
        default=Task.GENERATE,
        description=(
            "generate (chunked prefill, prefix caching) or a pooling task: embed, score, rerank "
            "(static warmup shapes)."
        ),
    )
    compile: CompileSpec = Field(
        default_factory=CompileSpec, description="The compile shape (part of the artifact key)."
    )
    serving: ServingSpec = Field(default_factory=ServingSpec, description="How inference pods run.")
    precompile: PrecompileSpec = Field(
        default_factory=PrecompileSpec, description="The precompile Job's limits."
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Number of serving replicas. With autoscaling, the HorizontalPodAutoscaler (KEDA's, "
            "with minReplicas: 0) sets it through the scale subresource: leave it out of GitOps "
            "manifests."
        ),
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "Scale replicas on the engine's load with a HorizontalPodAutoscaler; with "
            "minReplicas: 0, to zero when idle (KEDA and its HTTP add-on)."
        ),
    )
    engine: EngineSpec = Field(default_factory=EngineSpec, description="The engine image.")
    accelerator: AcceleratorSpec = Field(
        default_factory=AcceleratorSpec, description="Spyre cards and placement."
    )
    cache: CacheSpec = Field(default_factory=CacheSpec, description="The compile-cache volume.")
    routing: RoutingSpec | None = Field(
        default=None,
        description="Optional routing through an inference gateway (InferencePool).",
    )
