"""The decide floor: what one SpyreModel needs, from its spec and the observed children (pure,
no I/O). This package is its one face: no module outside decide/ imports a module of it
(tests/unit/test_layers.py), so importers (the controller, its collaborators, the handlers,
the generators) need not know where each decision lives.

``decide()`` is the whole reconcile policy: the control floor gathers :class:`Observed` from
the watch caches, calls it, and hands the result to the apply layer (kube/apply.py). It is
split by concern, one module per concern, each part a pure function: :mod:`.observed` holds
what they all read and return (``Observed``, ``Policy``, ``Decision``) and shared helpers;
then the cache claim (:mod:`.cache`, :func:`decide_cache`), the artifact on it
(:mod:`.artifact`, :func:`decide_artifact`), status.cache (:mod:`.cache_status`), what the
Deployment serves (:mod:`.serving`, :func:`decide_serving`), the canary (:mod:`.canary`), the
Gateway routing through an InferencePool (:mod:`.inference_pool`), scale to zero
(:mod:`.scaletozero`), garbage collection (:mod:`.gc`) and the conditions (:mod:`.status`,
:func:`decide_status`); :mod:`.assemble` puts them together in ``decide()``. Keeping it pure
lets unit tests cover every transition without a cluster.

Beside them, the pure facts the decisions read: the condition types and reasons
(:mod:`.conditions`), what a Job's status says (:mod:`.jobs`), whether a pod is stuck
(:mod:`.pods`), the precompile Job's state (:mod:`.precompile_state`), the engine's
termination message (:mod:`.summary`), the canary's and serving pods' reports
(:mod:`.canary_report`), the rollout budget's facts (:mod:`.rollout`) and the claims to
release (:mod:`.release`). ``conditions`` and ``jobs`` are re-exported as modules (their
names are a vocabulary: ``C.READY``, ``jobs.finished``).
"""

from __future__ import annotations

from . import conditions, jobs
from .artifact import ArtifactOutcome, collected_since, decide_artifact, waiting_since
from .assemble import decide
from .cache import CacheOutcome, decide_cache
from .cache_status import MAX_REMEMBERED, decide_cache_status, shape_text
from .canary_report import (
    MAX_REPORT_BYTES,
    REPORT_PATH,
    REPORT_TIMEOUT_SECONDS,
    SERVED_PATH,
    CanaryReport,
    ServedReport,
    parse_report,
    parse_served,
)
from .gc import (
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
from .inference_pool import RoutingOutcome, decide_routing
from .observed import (
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
from .release import claim_named_by, claims_to_release, mounted_claims, rollout_complete
from .rollout import deployment_rolling
from .scaletozero import ScaleToZeroOutcome, decide_scale_to_zero
from .serving import NODE_ENDED_POD_REASONS, Rollout, ServingOutcome, decide_serving, pods_missing
from .slots import FREE, WAITING_RECHECK_SECONDS, Slot, ordinal
from .status import SCHEDULER_SILENCE_SECONDS, decide_status, scheduler_silence, write_error_message

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
    # the vocabulary modules (decide/conditions.py, decide/jobs.py)
    "conditions",
    "jobs",
    # the canary's and serving pods' reports (decide/canary_report.py)
    "MAX_REPORT_BYTES",
    "REPORT_PATH",
    "REPORT_TIMEOUT_SECONDS",
    "SERVED_PATH",
    "CanaryReport",
    "ServedReport",
    "parse_report",
    "parse_served",
    # claims to release and the rollout budget's facts (decide/release.py, decide/rollout.py)
    "claim_named_by",
    "claims_to_release",
    "mounted_claims",
    "rollout_complete",
    "deployment_rolling",
]
