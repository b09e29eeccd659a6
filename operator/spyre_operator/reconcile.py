"""Decide what one SpyreModel needs, from its spec and the observed children (pure, no I/O).

``decide()`` is the whole reconcile policy: the handler layer gathers :class:`Observed` from
the watch caches, calls it, and hands the result to the apply layer. It is split by concern,
each part a pure function: the cache volume (:func:`decide_cache`), the artifact on that
volume (:func:`decide_artifact`), what the Deployment serves (:func:`decide_serving`) and the
status (:func:`decide_status`). Keeping it pure lets unit tests cover every transition
without a cluster.

The decisions live in :mod:`spyre_operator.decide`, one module per concern; this module
re-exports them and is their one face: no module outside decide/ imports it directly
(tests/unit/test_layers.py), so importers (the controller, its collaborators, the handlers)
need not know where each one is.
"""

from __future__ import annotations

from .decide.artifact import ArtifactOutcome, collected_since, decide_artifact, waiting_since
from .decide.assemble import decide
from .decide.cache import CacheOutcome, decide_cache
from .decide.cache_status import MAX_REMEMBERED, decide_cache_status, shape_text
from .decide.gc import (
    ClaimUse,
    GcResult,
    epoch,
    gone_keys,
    keys_to_remove,
    known_keys,
    merge_removed,
    mounts_claim,
    named_models,
    parse_gc_result,
    removed_record,
    stale_compile,
    still_listed,
    with_removed,
)
from .decide.inference_pool import RoutingOutcome, decide_routing
from .decide.observed import (
    API_FORBIDDEN,
    API_NOT_SERVED,
    API_SERVED,
    API_UNKNOWN,
    COMPILING,
    DEFAULT_POLICY,
    FAILED,
    PENDING,
    READY,
    RETRY_ANNOTATION,
    ClaimMeasure,
    Decision,
    Observed,
    Policy,
    ScaleToZeroConfig,
    WriteError,
    served_key,
)
from .decide.scaletozero import ScaleToZeroOutcome, decide_scale_to_zero
from .decide.serving import (
    NODE_ENDED_POD_REASONS,
    Rollout,
    ServingOutcome,
    decide_serving,
    pods_missing,
)
from .decide.slots import FREE, WAITING_RECHECK_SECONDS, Slot, ordinal
from .decide.status import (
    SCHEDULER_SILENCE_SECONDS,
    decide_status,
    scheduler_silence,
    write_error_message,
)

__all__ = [
    "RETRY_ANNOTATION",
    "Decision",
    "Observed",
    "Policy",
    "WriteError",
    "decide",
    "decide_artifact",
    "decide_cache",
    "decide_routing",
    "decide_serving",
    "decide_cache_status",
    "decide_status",
    "served_key",
    "waiting_since",
    "shape_text",
    "write_error_message",
    # also re-exported from the decision modules (imported from here by the operator and tests)
    "API_FORBIDDEN",
    "API_NOT_SERVED",
    "API_SERVED",
    "API_UNKNOWN",
    "COMPILING",
    "DEFAULT_POLICY",
    "FAILED",
    "MAX_REMEMBERED",
    "NODE_ENDED_POD_REASONS",
    "PENDING",
    "READY",
    "SCHEDULER_SILENCE_SECONDS",
    "ArtifactOutcome",
    "CacheOutcome",
    "Rollout",
    "RoutingOutcome",
    "ScaleToZeroConfig",
    "ScaleToZeroOutcome",
    "ServingOutcome",
    "collected_since",
    "decide_scale_to_zero",
    "scheduler_silence",
    "pods_missing",
    "ClaimMeasure",
    # the budgets' answer (decide/slots.py)
    "FREE",
    "WAITING_RECHECK_SECONDS",
    "Slot",
    "ordinal",
    # garbage collection (decide/gc.py)
    "ClaimUse",
    "GcResult",
    "epoch",
    "gone_keys",
    "keys_to_remove",
    "known_keys",
    "merge_removed",
    "mounts_claim",
    "named_models",
    "parse_gc_result",
    "removed_record",
    "stale_compile",
    "still_listed",
    "with_removed",
]
