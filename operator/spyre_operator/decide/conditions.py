"""Status conditions: types, reasons and pure functions to merge them.

A condition keeps its ``lastTransitionTime`` while its status is unchanged, so recomputing
status on an idle resync produces identical bytes and the operator writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import spyre_contract as contract

# Types
READY = "Ready"
CACHE_VOLUME_READY = "CacheVolumeReady"
ARTIFACT_READY = "ArtifactReady"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
# kstatus (Flux, kpt, cli-utils) reads these two "abnormal-true" conditions; they mirror
# Progressing and Degraded so GitOps tools need no custom health check.
RECONCILING = "Reconciling"
STALLED = "Stalled"
#: Only with spec.autoscaling: what the HorizontalPodAutoscaler says.
AUTOSCALING = "Autoscaling"
#: Only with spec.routing.inferencePool: whether a Gateway accepted the model's InferencePool.
ROUTING_READY = "RoutingReady"
TYPES = (
    READY,
    CACHE_VOLUME_READY,
    ARTIFACT_READY,
    PROGRESSING,
    DEGRADED,
    RECONCILING,
    STALLED,
    AUTOSCALING,
    ROUTING_READY,
)

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

# Reasons (CamelCase, one per situation; tests and dashboards match on them).
# CacheVolumeReady
CLAIM_BOUND = "ClaimBound"
CLAIM_PENDING = "ClaimPending"
CLAIM_LOST = "ClaimLost"
CLAIM_NOT_FOUND = "ClaimNotFound"
CLAIM_CREATING = "ClaimCreating"
#: Degraded: another SpyreModel naming the same managed PVC asks for other settings.
CLAIM_CONFLICT = "ClaimConflict"
#: Degraded: an edit of a PVC field that cannot change in place (class, modes, shrink).
CLAIM_IMMUTABLE = "ClaimImmutable"
#: CacheVolumeReady (still True): the artifacts use cache.usageWarningPercent of the claim.
CLAIM_NEARLY_FULL = "ClaimNearlyFull"
#: The PVC is being deleted (deletionTimestamp set): its finalizers hold it while pods use it.
CLAIM_TERMINATING = "ClaimTerminating"
#: CacheVolumeReady reasons that make the model Degraded.
CLAIM_PROBLEMS = frozenset({CLAIM_NOT_FOUND, CLAIM_LOST, CLAIM_TERMINATING})
# ArtifactReady
COMPILING = "Compiling"
ARTIFACT_AVAILABLE = "ArtifactAvailable"
PRECOMPILE_FAILED = "PrecompileFailed"
#: The precompile pod waits for a node (the scheduler's message); not Degraded: cards or CPU
#: may free up. Its image or a Secret it needs fails as ImagePullFailed / ContainerConfigError.
PRECOMPILE_UNSCHEDULABLE = "PrecompileUnschedulable"
#: The Job controller cannot create the precompile pod (a ResourceQuota, LimitRange or
#: PodSecurity refusal; the message is its FailedCreate Event's).
PRECOMPILE_POD_REJECTED = "PrecompilePodRejected"
#: ArtifactReady=False, Progressing=True: the model needs a precompile Job but every slot of
#: the cluster-wide budget (--max-concurrent-compiles) is in use; no Job is created yet.
WAITING_FOR_COMPILE_SLOT = "WaitingForCompileSlot"
# ... or the engine's own reason when it says what users must fix (engine/spyre_contract)
MODEL_NOT_FOUND = contract.MODEL_NOT_FOUND
MODEL_ACCESS_DENIED = contract.MODEL_ACCESS_DENIED
#: The hub could not be reached or answered with an error, or the claim filled up while
#: downloading: the message names the cause (DNS, proxy, TLS, timeout, 5xx, no space) and its fix.
MODEL_DOWNLOAD_FAILED = contract.MODEL_DOWNLOAD_FAILED
UNSUPPORTED_CONFIGURATION = contract.UNSUPPORTED_CONFIGURATION
#: The engine image's vLLM or sendnn-inference is not a version its spyre-engine supports
#: (engine/spyre_engine/compat.py; e.g. spyre-engine layered onto a site's own vLLM image).
UNSUPPORTED_BASE = contract.UNSUPPORTED_BASE
#: The artifact would not fit on the cache claim, by the size of the last artifact of its shape
#: there (engine/spyre_engine/space.py): refused before compiling, the numbers in the message.
INSUFFICIENT_CACHE_SPACE = contract.INSUFFICIENT_CACHE_SPACE
#: The effective engine image is not on the operator's allow-list: nothing is compiled.
ENGINE_IMAGE_NOT_ALLOWED = "EngineImageNotAllowed"
#: Engine failure reasons that replace the generic PrecompileFailed in conditions.
ENGINE_COMPILE_REASONS = frozenset(
    {
        MODEL_NOT_FOUND,
        MODEL_ACCESS_DENIED,
        MODEL_DOWNLOAD_FAILED,
        UNSUPPORTED_CONFIGURATION,
        UNSUPPORTED_BASE,
        INSUFFICIENT_CACHE_SPACE,
    }
)
# Ready / Progressing / Degraded
SERVING = "Serving"
SCALED_TO_ZERO = "ScaledToZero"
ROLLING_OUT = "RollingOut"
SERVING_PREVIOUS_ARTIFACT = "ServingPreviousArtifact"
PODS_NOT_READY = "PodsNotReady"
RECONCILED = "Reconciled"
AS_EXPECTED = "AsExpected"
INVALID_SPEC = "InvalidSpec"
ENGINE_FAILED = contract.ENGINE_FAILED
#: A serving pod refused the artifact: it does not match the manifest its precompile wrote
#: (missing, truncated, changed) or has none (engine/spyre_engine/manifest.py).
ARTIFACT_CORRUPT = contract.ARTIFACT_CORRUPT
#: A serving pod found no catalog entry it can serve for its shape.
ARTIFACT_MISMATCH = contract.ARTIFACT_MISMATCH
#: A serving pod's answers to the artifact's reference prompts left the reference answers
#: (engine/spyre_engine/answers.py): it stopped before turning Ready. Not compiled again for it
#: (a compile of the same inputs gives the same graphs).
OUTPUT_MISMATCH = contract.OUTPUT_MISMATCH
#: A canary pod's own requests broke spec.serving.canary's bounds (error share or mean latency;
#: engine/spyre_engine/canary.py): it stopped, the model keeps the previous artifact.
CANARY_FAILED = contract.CANARY_FAILED
#: The canary was not passed by canary.deadlineSeconds from its start (its pods never all
#: served, or kept restarting): the model keeps the previous artifact.
CANARY_DEADLINE_EXCEEDED = "CanaryDeadlineExceeded"
#: The user aborted the canary (the canary-abort annotation names its artifact).
CANARY_ABORTED = "CanaryAborted"
#: Progressing=True: the new artifact serves on its canary pods beside the previous one.
CANARY_RUNNING = "CanaryRunning"
#: Progressing=True: the canary's window is over, but a canary pod judged fewer than
#: minRequests requests: the rollout waits for traffic (or the deadline).
CANARY_AWAITING_TRAFFIC = "CanaryAwaitingTraffic"
#: How a canary ended, besides the failures above (status.canary.reason).
WINDOW_PASSED = "WindowPassed"
PROMOTED_BY_ANNOTATION = "PromotedByAnnotation"
#: A canary's failures: the artifact is refused, the previous one keeps serving.
CANARY_REFUSED_REASONS = frozenset({CANARY_FAILED, CANARY_DEADLINE_EXCEEDED, CANARY_ABORTED})
#: Serving pods' reasons that refuse a compiled artifact without compiling it again: the model
#: keeps (or goes back to) the artifact it last rolled out.
SERVING_REFUSED_REASONS = frozenset({OUTPUT_MISMATCH}) | CANARY_REFUSED_REASONS
#: Serving pods' reasons that say the artifact is damaged or missing: it is compiled again once.
ARTIFACT_REFUSED_REASONS = frozenset({ARTIFACT_CORRUPT, ARTIFACT_MISMATCH})
#: Engine failure reasons of a serving pod that replace the generic EngineFailed in conditions.
ENGINE_SERVE_REASONS = ARTIFACT_REFUSED_REASONS | SERVING_REFUSED_REASONS
#: A serving container cannot start because its image cannot be pulled (ErrImagePull,
#: ImagePullBackOff, InvalidImageName; the message is the kubelet's).
IMAGE_PULL_FAILED = "ImagePullFailed"
#: A serving container cannot be created: a Secret, ConfigMap or key it references is
#: missing (CreateContainerConfigError, CreateContainerError; the message is the kubelet's).
CONTAINER_CONFIG_ERROR = "ContainerConfigError"
ROLLOUT_STALLED = "RolloutStalled"
#: Progressing=True: the new artifact is ready but every slot of the cluster-wide rollout
#: budget (--max-concurrent-rollouts) is in use; the Deployment keeps the previous artifact.
WAITING_FOR_ROLLOUT_SLOT = "WaitingForRolloutSlot"
#: Reasons of a model waiting its turn in a cluster-wide budget (Normal Events: not a fault).
WAITING_REASONS = frozenset({WAITING_FOR_COMPILE_SLOT, WAITING_FOR_ROLLOUT_SLOT})
#: Progressing: replicas are missing because no node has the cards (or CPU, memory) they
#: need; the model keeps serving on the others.
INSUFFICIENT_CAPACITY = "InsufficientCapacity"
#: Progressing: replicas claiming their cards through DRA (accelerator.deviceClassName) wait
#: for a node because their claim cannot be allocated (the scheduler's message says why).
DEVICES_UNAVAILABLE = "DevicesUnavailable"
#: Degraded (and Progressing while pods wait): accelerator.deviceClassName names a DeviceClass
#: the cluster does not have; no pod can claim cards of it.
DEVICE_CLASS_NOT_FOUND = "DeviceClassNotFound"
#: Reasons of replicas that wait for cards: a scale-to-zero model woken now would not start.
NO_CARD_REASONS = frozenset({INSUFFICIENT_CAPACITY, DEVICES_UNAVAILABLE, DEVICE_CLASS_NOT_FOUND})
#: Progressing: serving pods wait for a scheduler that has not looked at them (no PodScheduled
#: condition after SCHEDULER_SILENCE_SECONDS): accelerator.schedulerName names a scheduler that
#: is not installed or not running (e.g. spyre-scheduler without IBM's Spyre Operator).
SCHEDULER_NOT_RUNNING = "SchedulerNotRunning"
# Autoscaling
AUTOSCALER_PENDING = "AutoscalerPending"
AUTOSCALER_ACTIVE = "ScalingActive"
#: Autoscaling (minReplicas 0): KEDA's ScaledObject reports Ready; it scales the model
#: 0 <-> N through /scale.
SCALE_TO_ZERO_ACTIVE = "ScaleToZeroActive"
#: Autoscaling (minReplicas 0), and Ready at zero replicas: the cluster does not serve KEDA's
#: ScaledObject or the HTTP add-on's HTTPScaledObject (or the operator may not use them), the
#: interceptor has no endpoints, or the ScaledObject's triggers cannot be built (no Prometheus
#: address): nothing would wake the model. The message carries the API server's.
SCALE_TO_ZERO_UNAVAILABLE = "ScaleToZeroUnavailable"
#: Autoscaling: the ScaledObject exists and KEDA reports it not Ready (its message).
SCALED_OBJECT_NOT_READY = "ScaledObjectNotReady"
#: Autoscaling: minReplicas went back to >= 1 while spec.replicas is 0; the HPA does not
#: scale from zero, so the model stays at zero until spec.replicas is set.
REPLICAS_AT_ZERO = "ReplicasAtZero"
#: A write the API server rejected (the message carries the server's).
RECONCILE_ERROR = "ReconcileError"
#: A Deployment, Service or PDB with the model's name exists and is not the operator's.
NAME_CONFLICT = "NameConflict"

# RoutingReady (reads the InferencePool's status.parents[].conditions, as the v1 API defines them)
#: True: a parent (Gateway) reports Accepted=True and no parent reports ResolvedRefs=False.
INFERENCE_POOL_ACCEPTED = "InferencePoolAccepted"
#: The pool exists but no parent has reported on it yet (no HTTPRoute/Gateway uses it).
INFERENCE_POOL_PENDING = "InferencePoolPending"
#: A parent reports Accepted=False (the message carries its reason and message).
INFERENCE_POOL_NOT_ACCEPTED = "InferencePoolNotAccepted"
#: A parent accepted it but cannot resolve its references (e.g. the endpoint picker Service).
INFERENCE_POOL_REFS_NOT_RESOLVED = "InferencePoolRefsNotResolved"
#: The cluster does not serve inference.networking.k8s.io/v1 InferencePools (no CRD).
INFERENCE_POOL_CRD_MISSING = "InferencePoolCRDMissing"
#: The operator may not read or write InferencePools (RBAC).
INFERENCE_POOL_FORBIDDEN = "InferencePoolForbidden"

#: Reasons only RoutingReady carries (never Ready or Degraded: the model serves regardless).
ROUTING_REASONS = frozenset(
    {
        INFERENCE_POOL_ACCEPTED,
        INFERENCE_POOL_PENDING,
        INFERENCE_POOL_NOT_ACCEPTED,
        SCALE_TO_ZERO_UNAVAILABLE,
        REPLICAS_AT_ZERO,
        INFERENCE_POOL_REFS_NOT_RESOLVED,
        INFERENCE_POOL_CRD_MISSING,
        INFERENCE_POOL_FORBIDDEN,
    }
)

#: Reasons that are warnings when they appear (Kubernetes Event type).
WARNING_REASONS = frozenset(
    {
        SCHEDULER_NOT_RUNNING,
        DEVICE_CLASS_NOT_FOUND,
        CLAIM_LOST,
        CLAIM_NOT_FOUND,
        CLAIM_TERMINATING,
        PRECOMPILE_FAILED,
        PRECOMPILE_POD_REJECTED,
        MODEL_NOT_FOUND,
        MODEL_ACCESS_DENIED,
        MODEL_DOWNLOAD_FAILED,
        UNSUPPORTED_CONFIGURATION,
        UNSUPPORTED_BASE,
        INSUFFICIENT_CACHE_SPACE,
        ENGINE_IMAGE_NOT_ALLOWED,
        INVALID_SPEC,
        ENGINE_FAILED,
        ARTIFACT_CORRUPT,
        ARTIFACT_MISMATCH,
        OUTPUT_MISMATCH,
        CANARY_FAILED,
        CANARY_DEADLINE_EXCEEDED,
        CANARY_ABORTED,
        IMAGE_PULL_FAILED,
        CONTAINER_CONFIG_ERROR,
        ROLLOUT_STALLED,
        RECONCILE_ERROR,
        NAME_CONFLICT,
        CLAIM_CONFLICT,
        CLAIM_IMMUTABLE,
        CLAIM_NEARLY_FULL,
        INFERENCE_POOL_NOT_ACCEPTED,
        INFERENCE_POOL_REFS_NOT_RESOLVED,
        INFERENCE_POOL_CRD_MISSING,
        INFERENCE_POOL_FORBIDDEN,
    }
)


@dataclass(frozen=True)
class Cond:
    """A computed condition, before merging with the stored one."""

    type: str
    status: str
    reason: str
    message: str = ""


def with_kstatus(conds: list[Cond]) -> list[Cond]:
    """``conds`` plus Reconciling and Stalled, mirrors of Progressing and Degraded."""
    by_type = {c.type: c for c in conds}
    out = list(conds)
    for src, dst in ((PROGRESSING, RECONCILING), (DEGRADED, STALLED)):
        c = by_type.get(src)
        if c is not None:
            out.append(Cond(dst, c.status, c.reason, c.message))
    return out


def now_rfc3339() -> str:
    """Current time as Kubernetes writes it (seconds precision, Z)."""
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    current: Iterable[dict[str, Any]] | None,
    computed: Iterable[Cond],
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """New condition list: computed values, keeping lastTransitionTime when status is unchanged.

    Output is in :data:`TYPES` order so that equal states serialise identically.
    """
    old = {c.get("type"): c for c in current or []}
    out = []
    for c in sorted(computed, key=lambda c: TYPES.index(c.type) if c.type in TYPES else 99):
        prev = old.get(c.type)
        ltt = prev.get("lastTransitionTime") if prev and prev.get("status") == c.status else None
        out.append(
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "observedGeneration": generation,
                "lastTransitionTime": ltt or now,
            }
        )
    return out


def set_condition(
    current: Iterable[dict[str, Any]] | None, cond: Cond, generation: int, now: str
) -> list[dict[str, Any]]:
    """``current`` with the condition of ``cond.type`` replaced (or added), the others as
    they are (a report that decides nothing else, e.g. a reconcile that failed)."""
    listed = list(current or [])
    others = [c for c in listed if c.get("type") != cond.type]
    mine = merge_conditions(listed, [cond], generation, now)
    return sorted(
        [*others, *mine],
        key=lambda c: TYPES.index(c.get("type")) if c.get("type") in TYPES else 99,
    )


def find(conditions: Iterable[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    """The condition of ``type_``, if any."""
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def transitions(
    old: Iterable[dict[str, Any]] | None, new: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Conditions whose status or reason changed: each becomes a Kubernetes Event."""
    before = {c.get("type"): (c.get("status"), c.get("reason")) for c in old or []}
    return [c for c in new if before.get(c["type"]) != (c["status"], c["reason"])]


def event_type(reason: str) -> str:
    """Normal or Warning, for an Event about ``reason``."""
    return "Warning" if reason in WARNING_REASONS else "Normal"
