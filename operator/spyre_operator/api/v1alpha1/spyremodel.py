"""The SpyreModel object itself (what ``kubectl get`` returns)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .common import ApiModel
from .spyremodel_spec import SpyreModelSpec
from .status import SpyreModelStatus


class SpyreModel(ApiModel):
    """A model served on Spyre cards: a cache PVC, a precompile Job, a Deployment and a Service."""

    api_version: str = Field(default="serving.spyre.dev/v1alpha1", alias="apiVersion")
    kind: str = Field(default="SpyreModel")
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SpyreModelSpec
    status: SpyreModelStatus | None = None
