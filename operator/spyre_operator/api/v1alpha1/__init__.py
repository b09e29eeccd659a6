"""SpyreModel v1alpha1: spec and status as pydantic models.

These models are the single source of truth for the API: the CRD in ``crds/`` is generated
from them (``spyre-operator crd``), defaults live here and so in the CRD schema, and the
``x-kubernetes-validations`` (CEL) rules attached below are what the API server enforces at
admission. Every field carries a description because ``kubectl explain`` shows it.

Per-site fields (the engine image and its pull secrets, the card resource, the scheduler, node
placement, the cache's StorageClass) have no default here: the API server would write it into
every object at creation and an operator upgrade or an admin's change would never reach it.
Left unset, they follow the operator's defaults at every reconcile (``desired/site.py``).

The models are split by concern (common, model, serving, placement, cache, scaling, the
spec, status, the object); this package re-exports every name, so importers name
``spyre_operator.api.v1alpha1`` only.
"""

from __future__ import annotations

from .cache import (  # noqa: F401 - re-exported
    DEFAULT_KEEP_LAST,
    DEFAULT_UNUSED_FOR_SECONDS,
    CacheRetention,
    CacheSpec,
    CacheVolumeSpec,
)
from .common import (  # noqa: F401 - re-exported
    DNS_SUBDOMAIN_PATTERN,
    EXTENDED_RESOURCE_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_LABEL_VALUE,
    MAX_MODEL_NAME,
    MODEL_URI_PATTERN,
    POOLING_TASKS,
    POSITIVE_QUANTITY_PATTERN,
    QUALIFIED_NAME,
    QUANTITY_PATTERN,
    ApiModel,
    Backend,
    FreeForm,
    NodeSelector,
    Quantity,
    Task,
    cel,
    keys_are_qualified_names,
)
from .model import (  # noqa: F401 - re-exported
    CompileSpec,
    ConfigMapKeyRef,
    ModelSource,
    SecretKeyRef,
    WarmupShape,
)
from .placement import (  # noqa: F401 - re-exported
    AcceleratorSpec,
    AccessMode,
    EngineSpec,
    PrecompileSpec,
    Toleration,
)
from .scaling import (  # noqa: F401 - re-exported
    AutoscalingSpec,
    EndpointPickerRef,
    InferencePoolRouting,
    RoutingSpec,
    ScaleToZeroSpec,
)
from .serving import (  # noqa: F401 - re-exported
    API_KEY_ENV,
    CANARY_START_ALLOWANCE_SECONDS,
    EXTRA_ARGS_RULE,
    MANAGED_ARG_ABBREVIATIONS,
    MANAGED_ARG_HEAD,
    MANAGED_ARG_PATTERN,
    MANAGED_ARGS,
    OPERATOR_ENV,
    PRECOMPILE_ENV,
    AllowedClients,
    ApiKeyRef,
    CanarySpec,
    EnvVar,
    ResourceRequirements,
    RolloutSpec,
    ServingSpec,
)
from .spyremodel import (  # noqa: F401 - re-exported
    SpyreModel,
)
from .spyremodel_spec import (  # noqa: F401 - re-exported
    SpyreModelSpec,
)
from .status import (  # noqa: F401 - re-exported
    AllocatedDevice,
    ArtifactStatus,
    CachedArtifact,
    CacheStatus,
    CanaryComparison,
    CanaryStatus,
    CompileStatus,
    Condition,
    EffectiveStatus,
    OperatorStamp,
    OutputCheckStatus,
    ReferencesStatus,
    ScaleToZeroStatus,
    ServedCounts,
    ServedFigures,
    SpyreModelStatus,
)
