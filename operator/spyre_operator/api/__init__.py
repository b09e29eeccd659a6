"""The SpyreModel API: pydantic models that are the single source of truth for the CRD."""

from .v1alpha1 import (
    AcceleratorSpec,
    ArtifactStatus,
    Backend,
    CacheSpec,
    CompileSpec,
    Condition,
    EngineSpec,
    ModelSource,
    PrecompileSpec,
    ServingSpec,
    SpyreModel,
    SpyreModelSpec,
    SpyreModelStatus,
    Task,
    WarmupShape,
)

__all__ = [
    "AcceleratorSpec",
    "ArtifactStatus",
    "Backend",
    "CacheSpec",
    "CompileSpec",
    "Condition",
    "EngineSpec",
    "ModelSource",
    "PrecompileSpec",
    "ServingSpec",
    "SpyreModel",
    "SpyreModelSpec",
    "SpyreModelStatus",
    "Task",
    "WarmupShape",
]
