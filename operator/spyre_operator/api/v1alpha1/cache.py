"""The compile cache: its claim, retention and ``spec.cache``."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from .common import DNS_SUBDOMAIN_PATTERN, MAX_LABEL_VALUE, ApiModel, Quantity, cel
from .placement import AccessMode


def _shared_access() -> list[AccessMode]:
    return ["ReadWriteMany"]


#: Defaults of cache.volume.retention (see docs/operations.md, "Garbage collection").
DEFAULT_KEEP_LAST = 2
DEFAULT_UNUSED_FOR_SECONDS = 24 * 3600


class CacheRetention(ApiModel):
    """When the operator removes artifacts no SpyreModel uses from a cache volume it manages.

    An artifact is removed once it is not in use (no SpyreModel's spec needs it, no Deployment
    serves it, no precompile Job writes it), has not been used for unusedForSeconds, and is not
    among the keepLast most recently used unused artifacts of any SpyreModel listing it.
    """

    enabled: bool = Field(
        default=True,
        description="Remove unused artifacts (false: never remove anything from this volume).",
    )
    keep_last: int = Field(
        default=DEFAULT_KEEP_LAST,
        ge=0,
        le=16,
        description=(
            "Unused artifacts kept per SpyreModel, most recently used first: reverting an "
            "edit to one of them serves it again without compiling."
        ),
    )
    unused_for_seconds: int = Field(
        default=DEFAULT_UNUSED_FOR_SECONDS,
        ge=0,
        description=(
            "An unused artifact is kept at least this long after it was last used (default "
            "one day: a rollback the day after a bad edit needs no compile)."
        ),
    )


class CacheVolumeSpec(ApiModel):
    """A compile-cache PVC the operator creates and shares between SpyreModels naming it."""

    name: str = Field(
        default="spyre-compile-cache",
        description=(
            "PVC name; every SpyreModel in the namespace naming it shares it. At most 63 "
            "characters: it is also a label value (serving.spyre.dev/cache-claim)."
        ),
        max_length=MAX_LABEL_VALUE,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    )
    storage_class_name: str | None = Field(
        default=None,
        description=(
            "StorageClass of the PVC when the operator creates it. Unset: the operator's "
            "default (chart defaults.storageClassName), or else the cluster's default "
            "StorageClass. A PVC keeps the class it was created with."
        ),
    )
    size: Quantity = Field(default="50Gi", description="Requested capacity.")
    access_modes: list[AccessMode] = Field(
        default_factory=_shared_access,
        description=(
            "Access modes. ReadWriteMany lets replicas on several nodes share the cache; "
            "ReadWriteOnce confines the precompile pod and every replica to one node (the "
            "operator adds the pod affinity that keeps them there). ReadOnlyMany and "
            "ReadWriteOncePod cannot work for a cache one pod writes and many read."
        ),
        min_length=1,
    )
    retain_policy: str = Field(
        default="Retain",
        description=(
            "Retain keeps the PVC (and its compiled artifacts) when SpyreModels are deleted; "
            "Delete garbage-collects it once no SpyreModel naming it remains."
        ),
        json_schema_extra={"enum": ["Retain", "Delete"]},
    )
    retention: CacheRetention = Field(
        default_factory=CacheRetention,
        description=(
            "Garbage collection of unused artifacts on this volume (the settings of the oldest "
            "SpyreModel naming the volume apply, like the PVC's)."
        ),
    )


class CacheSpec(ApiModel):
    """Where compiled artifacts live: an existing PVC, or one the operator creates."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.claimName) && has(self.volume))",
                    "set cache.claimName (an existing PVC) or cache.volume (a PVC the operator "
                    "creates), not both",
                )
            ]
        }
    )

    claim_name: str | None = Field(
        default=None,
        description=(
            "An existing PVC to use; the operator never creates or deletes it. "
            "Unset means cache.volume (with its defaults). At most 63 characters: it is also "
            "a label value (serving.spyre.dev/cache-claim)."
        ),
        max_length=MAX_LABEL_VALUE,
        pattern=DNS_SUBDOMAIN_PATTERN,
    )
    volume: CacheVolumeSpec | None = Field(
        default=None,
        description="A PVC the operator creates (the default when claimName is unset).",
    )
    usage_warning_percent: int = Field(
        default=85,
        ge=1,
        le=100,
        description=(
            "CacheVolumeReady turns to reason ClaimNearlyFull (a Warning Event) when the "
            "artifacts the claim's SpyreModels list use this share of its capacity: a "
            "precompile Job on a full claim fails with 'no space left on device'."
        ),
    )
