"""Decide what one SpyreModel needs, from its spec and the observed children (pure, no I/O).

``decide()`` is the whole reconcile policy: the handler layer gathers :class:`Observed` from
the watch caches, calls it, and hands the result to the apply layer. It is split by concern,
each part a pure function: the cache volume (:func:`decide_cache`), the artifact on that
volume (:func:`decide_artifact`), what the Deployment serves (:func:`decide_serving`) and the
status (:func:`decide_status`). Keeping it pure lets unit tests cover every transition
without a cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import PersistentVolumeClaim, Service
from lightkube.resources.discovery_v1 import EndpointSlice
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from pydantic import ValidationError

from . import GROUP, jobs
from . import conditions as C
from . import pods as P
from .api.v1alpha1 import CacheVolumeSpec, SpyreModelSpec
from .budget import FREE, WAITING_RECHECK_SECONDS, Slot
from .desired import names
from .desired.autoscaling import build_hpa, targets, wants_hpa
from .desired.deployment import build_deployment, served_spec_json
from .desired.job import build_precompile_job
from .desired.networkpolicy import build_network_policy, wants_network_policy
from .desired.plan import ModelPlan, OwnerRef, plan_model
from .desired.pvc import build_cache_pvc, cache_owners
from .desired.routing import (
    InferencePool,
    build_inference_pool,
    inference_pool_name,
    wants_inference_pool,
)
from .desired.scaletozero import (
    HTTPScaledObject,
    ScaledObject,
    build_coldstart_service,
    build_engine_service,
    build_http_scaled_object,
    build_interceptor_service,
    build_mirror_slice,
    build_scaled_object,
    interceptor_endpoints,
    wants_scale_to_zero,
)
from .desired.service import build_pdb, build_service, wants_pdb
from .desired.site import SiteDefaults, effective_status
from .precompile_state import Stuck, job_attempt, job_stuck, superseded, template_changed
from .quantity import parse_quantity
from .rollout import mark_rolled_out
from .summary import ArtifactSummary, EngineFailure, parse_termination_message

# Artifact phases (status.artifact.phase)
PENDING, COMPILING, READY, FAILED = "Pending", "Compiling", "Ready", "Failed"

#: Setting this annotation to a new value retries a failed compile at once.
RETRY_ANNOTATION = f"{GROUP}/retry-compile"

_TIME_FMT = "%Y-%m-%dT%H:%M:%SZ"

# Whether the cluster serves an optional API (a CRD that may be absent), as its watch found.
API_UNKNOWN = "Unknown"  # the watch has not listed yet
API_SERVED = "Served"
API_NOT_SERVED = "NotServed"  # 404: no such resource (the CRD is not installed)
API_FORBIDDEN = "Forbidden"  # 403: the operator's RBAC does not allow it


@dataclass(frozen=True)
class Policy:
    """Tunables of the reconcile policy (the operator reads them from its environment)."""

    #: A failed compile is retried after base * 2**(attempts-1) seconds, at most cap.
    retry_base_seconds: float = 60.0
    retry_cap_seconds: float = 3600.0
    #: A cache claim's artifacts are evaluated for garbage collection at most this often.
    gc_interval_seconds: float = 300.0
    #: The cluster-wide defaults of per-site fields and the engine-image allow-list.
    site: SiteDefaults = field(default_factory=SiteDefaults)

    def retry_delay(self, attempts: int) -> float:
        delay = self.retry_base_seconds * 2 ** max(0, attempts - 1)
        return float(min(self.retry_cap_seconds, delay))


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class WriteError:
    """A write the API server rejected (a 4xx other than a conflict we retry)."""

    kind: str
    name: str
    code: int
    message: str


@dataclass(frozen=True)
class ScaleToZeroConfig:
    """Where KEDA, its HTTP add-on, Prometheus and the cold-start responder are (the
    operator's flags; see cli.py). Empty ``prometheus_address``: only models without
    autoscaling targets (0 <-> 1 on requests alone) can scale to zero."""

    #: Off (``--no-scale-to-zero``, the chart's default): no KEDA watch or RBAC; a model
    #: asking for zero is told so.
    enabled: bool = True
    scaler_address: str = "keda-add-ons-http-external-scaler.keda:9090"
    interceptor_namespace: str = "keda"
    interceptor_service: str = "keda-add-ons-http-interceptor-proxy"
    #: The interceptor EndpointSlice port to mirror (by name); empty: the slice's first port.
    interceptor_port_name: str = ""
    prometheus_address: str = ""
    #: The responder's Service (namespace, name, port); empty name: no failover (502 past
    #: the wait bound, v0.12.0's own answer).
    coldstart_namespace: str = ""
    coldstart_service: str = ""
    coldstart_port: int = 0


@dataclass
class Observed:
    """Cluster state relevant to one SpyreModel, read from the watch caches."""

    cache_pvc: dict[str, Any] | None = None
    model_pvc_exists: bool = True
    job: dict[str, Any] | None = None
    #: Compact records of the precompile Job's pods (see controller.compact_pod).
    job_pods: list[dict[str, Any]] = field(default_factory=list)
    #: Events of the running precompile Job while it has no pod (FailedCreate: a quota).
    job_events: list[dict[str, Any]] = field(default_factory=list)
    #: status.cache.artifacts entries of the claim's other users: a finished Job is removed
    #: after a while, and what another model compiled on this very claim is not compiled again.
    claim_artifacts: list[dict[str, Any]] = field(default_factory=list)
    #: Precompile Jobs the model owns besides the one of its spec (an earlier edit's), and
    #: the (claim, key) of those some SpyreModel still needs.
    owned_jobs: list[dict[str, Any]] = field(default_factory=list)
    needed_jobs: set[tuple[str, str]] = field(default_factory=set)
    deployment: dict[str, Any] | None = None
    service: dict[str, Any] | None = None
    pdb: dict[str, Any] | None = None
    hpa: dict[str, Any] | None = None
    network_policy: dict[str, Any] | None = None
    server_pods: list[dict[str, Any]] = field(default_factory=list)
    #: Every SpyreModel in the namespace needing this (claim, key): owners of the shared Job.
    job_owners: list[OwnerRef] = field(default_factory=list)
    #: Every SpyreModel in the namespace using this managed claim with its volume settings,
    #: oldest first: the oldest one's settings make the PVC.
    cache_users: list[tuple[OwnerRef, CacheVolumeSpec]] = field(default_factory=list)
    #: The SpyreModels naming the same claim by cache.claimName (they keep it: no owners).
    claim_name_users: list[OwnerRef] = field(default_factory=list)
    #: Children that exist under the model's names but are not the operator's (kind -> detail).
    foreign: dict[str, str] = field(default_factory=dict)
    #: Writes of this reconcile the API server rejected.
    write_errors: list[WriteError] = field(default_factory=list)
    #: The model's InferencePool (only the operator's; see foreign_inference_pool).
    inference_pool: dict[str, Any] | None = None
    #: Whether InferencePools are served (API_*), and the API server's message if not.
    inference_pool_api: str = API_UNKNOWN
    inference_pool_api_message: str = ""
    #: A same-named InferencePool that is not the operator's (why), never written over.
    foreign_inference_pool: str | None = None
    #: Keys finished GC Jobs removed from the model's cache claim, with when (the GC Job's
    #: completion): an artifact compiled before that is gone from the claim.
    collected: dict[str, str] = field(default_factory=dict)
    #: Bytes of the artifacts on the cache claim, as the SpyreModels using it list them
    #: (status.cache.artifacts of every user, each key once); None when unknown.
    claim_artifact_bytes: int | None = None
    #: Scale to zero: the operator's settings, whether KEDA's two APIs are served (API_*,
    #: with the API server's message) and the operator's objects (None: absent or foreign).
    keda: ScaleToZeroConfig = field(default_factory=ScaleToZeroConfig)
    scaled_object_api: str = API_UNKNOWN
    scaled_object_api_message: str = ""
    http_scaled_object_api: str = API_UNKNOWN
    http_scaled_object_api_message: str = ""
    scaled_object: dict[str, Any] | None = None
    http_scaled_object: dict[str, Any] | None = None
    engine_service: dict[str, Any] | None = None
    coldstart_service: dict[str, Any] | None = None
    mirror_slice: dict[str, Any] | None = None
    #: Same-named scale-to-zero objects that are not the operator's (why): none is written.
    foreign_scale_to_zero: str | None = None
    #: The interceptor proxy Service's EndpointSlices (what the mirror copies).
    interceptor_slices: list[dict[str, Any]] = field(default_factory=list)
    #: The cluster-wide precompile budget's answer (budget.py; the controller counts): when
    #: not free, a model that would create a precompile Job waits instead.
    compile_slot: Slot = FREE
    #: The rollout budget's: when not free, a Deployment serving another artifact is not
    #: switched to the spec's ready one yet.
    rollout_slot: Slot = FREE


@dataclass
class Decision:
    """What to write for one SpyreModel."""

    apply: list[Any] = field(default_factory=list)
    #: The precompile Job: created if absent, otherwise only its owners are reconciled.
    job: Job | None = None
    delete: list[tuple[type, str]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    #: Reconcile again after this many seconds (a compile retry that is due later).
    requeue_after: float | None = None


# ------------------------------------------------------------------------------ helpers


def _parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    try:
        return datetime.strptime(s, _TIME_FMT).replace(tzinfo=UTC)
    except ValueError:
        return None


def _fmt_time(t: datetime) -> str:
    return t.strftime(_TIME_FMT)


def _seconds_between(start: str | None, end: str | None) -> float | None:
    a, b = _parse_time(start), _parse_time(end)
    return (b - a).total_seconds() if a and b else None


def _human_size(n: int | None) -> str:
    if n is None:
        return "unknown size"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _job_state(job: dict[str, Any]) -> str:
    if jobs.complete(job):
        return READY
    if jobs.failed(job):
        return FAILED
    return COMPILING


def _latest_termination(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    terminated = [p["terminated"] for p in pods if p.get("terminated")]
    if not terminated:
        return None
    return max(terminated, key=lambda t: (t.get("finishedAt") or "", t.get("exitCode") == 0))


def served_key(deployment: dict[str, Any] | None) -> str | None:
    """The artifact key a live Deployment serves."""
    if not deployment:
        return None
    return deployment.get("metadata", {}).get("annotations", {}).get(names.ARTIFACT_KEY_ANNOTATION)


def _remembered_serving(status: dict[str, Any]) -> tuple[str | None, SpyreModelSpec | None]:
    """The key and spec status says the Deployment serves (servingArtifactKey, servedSpec)."""
    key, raw = status.get("servingArtifactKey"), status.get("servedSpec")
    if not key or not raw:
        return None, None
    try:
        return str(key), SpyreModelSpec.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None, None


def _served_spec(deployment: dict[str, Any]) -> SpyreModelSpec | None:
    raw = deployment.get("metadata", {}).get("annotations", {}).get(names.SERVED_SPEC_ANNOTATION)
    if not raw:
        return None
    try:
        return SpyreModelSpec.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None


# ------------------------------------------------------------------------------ cache


@dataclass
class CacheOutcome:
    """The cache claim: what to write, its condition, and a problem users must fix."""

    cond: C.Cond
    pvc: PersistentVolumeClaim | None = None
    #: Degraded: another model's settings won, or an immutable field was edited.
    problem: C.Cond | None = None

    @property
    def missing(self) -> bool:
        return self.cond.reason == C.CLAIM_NOT_FOUND


def _claim_condition(plan: ModelPlan, pvc: dict[str, Any] | None) -> C.Cond:
    t = C.CACHE_VOLUME_READY
    if pvc is None:
        if plan.claim_managed:
            return C.Cond(t, C.FALSE, C.CLAIM_CREATING, f"creating PVC {plan.claim}")
        return C.Cond(
            t,
            C.FALSE,
            C.CLAIM_NOT_FOUND,
            f"PersistentVolumeClaim {plan.claim} not found in namespace {plan.namespace}; "
            "create it, or unset cache.claimName to let the operator create one",
        )
    terminating = _claim_terminating(plan, pvc)
    if terminating is not None:
        return C.Cond(t, C.FALSE, C.CLAIM_TERMINATING, terminating)
    phase = (pvc.get("status") or {}).get("phase") or "Pending"
    if phase == "Bound":
        vol = (pvc.get("spec") or {}).get("volumeName", "")
        return C.Cond(t, C.TRUE, C.CLAIM_BOUND, f"PVC {plan.claim} is bound to {vol}")
    if phase == "Lost":
        return C.Cond(t, C.FALSE, C.CLAIM_LOST, f"PVC {plan.claim} lost its volume")
    return C.Cond(
        t,
        C.FALSE,
        C.CLAIM_PENDING,
        f"PVC {plan.claim} is Pending: no matching PersistentVolume yet, or its StorageClass "
        "binds on first use",
    )


def _claim_terminating(plan: ModelPlan, pvc: dict[str, Any]) -> str | None:
    """Why a PVC that is being deleted still exists (its finalizers), if it is."""
    meta = pvc.get("metadata") or {}
    since = meta.get("deletionTimestamp")
    if not since:
        return None
    finalizers = meta.get("finalizers") or []
    held = (
        f"held by {', '.join(finalizers)}"
        + (" while pods still mount it" if "kubernetes.io/pvc-protection" in finalizers else "")
        if finalizers
        else "no finalizer holds it"
    )
    then = (
        "the operator then creates an empty one and compiles again"
        if plan.claim_managed
        else "create it again, or name another claim in cache.claimName"
    )
    return f"PVC {plan.claim} is being deleted (since {since}; {held}): once it is gone {then}"


def _claim_usage(
    plan: ModelPlan, pvc: dict[str, Any] | None, used: int | None
) -> C.Cond | None:
    """CacheVolumeReady=True ClaimNearlyFull once the listed artifacts pass the threshold."""
    capacity = ((pvc or {}).get("status") or {}).get("capacity", {}).get("storage")
    if not capacity or not used:
        return None
    total = parse_quantity(capacity)
    limit = plan.spec.cache.usage_warning_percent
    if not total or total <= 0 or used * 100 < limit * total:
        return None
    return C.Cond(
        C.CACHE_VOLUME_READY,
        C.TRUE,
        C.CLAIM_NEARLY_FULL,
        f"artifacts use {_human_size(used)} of PVC {plan.claim}'s {_human_size(int(total))} "
        f"({int(used * 100 // total)}%, warning at {limit}%): a precompile may run out of "
        "space; "
        "lower cache.volume.retention (keepLast, unusedForSeconds) so unused artifacts are "
        "collected, or use a bigger claim",
    )


def _volume_differences(a: CacheVolumeSpec, b: CacheVolumeSpec) -> list[str]:
    """Settings of two cache.volume entries for one PVC that disagree."""
    out = []
    if parse_quantity(a.size) != parse_quantity(b.size):
        out.append(f"size {a.size} vs {b.size}")
    if a.storage_class_name != b.storage_class_name:
        out.append(f"storageClassName {a.storage_class_name} vs {b.storage_class_name}")
    if sorted(a.access_modes) != sorted(b.access_modes):
        out.append(f"accessModes {a.access_modes} vs {b.access_modes}")
    if a.retain_policy != b.retain_policy:
        out.append(f"retainPolicy {a.retain_policy} vs {b.retain_policy}")
    ra, rb = a.retention, b.retention
    for setting, x, y in (("enabled", ra.enabled, rb.enabled), ("keepLast", ra.keep_last,
                        rb.keep_last), ("unusedForSeconds", ra.unused_for_seconds,
                        rb.unused_for_seconds)):  # fmt: skip
        if x != y:  # GC applies the first user's: this one's would be ignored silently
            out.append(f"retention.{setting} {x} vs {y}")
    return out


def _immutable_edits(
    volume: CacheVolumeSpec, live: dict[str, Any], class_defaulted: bool = False
) -> tuple[CacheVolumeSpec, list[str]]:
    """``volume`` with the fields an existing PVC cannot change reset to the live values.

    A bound PVC's StorageClass and access modes are immutable and its size can only grow:
    applying such an edit is rejected on every retry, so the edit is reported instead. With a
    default StorageClass (``class_defaulted``), a volume that names none keeps the live
    class: the PVC may have been created with an earlier default, which is no edit.
    """
    spec = live.get("spec") or {}
    edits: list[str] = []
    keep: dict[str, Any] = {}
    live_class = spec.get("storageClassName")
    if volume.storage_class_name is None and class_defaulted and live_class is not None:
        keep["storage_class_name"] = live_class
    elif volume.storage_class_name is not None and volume.storage_class_name != live_class:
        edits.append(f"storageClassName {live_class} -> {volume.storage_class_name}")
        keep["storage_class_name"] = live_class
    live_modes = spec.get("accessModes") or []
    if live_modes and sorted(volume.access_modes) != sorted(live_modes):
        edits.append(f"accessModes {live_modes} -> {volume.access_modes}")
        keep["access_modes"] = list(live_modes)
    live_size = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    want, have = parse_quantity(volume.size), parse_quantity(live_size)
    if want is not None and have is not None and want < have:
        edits.append(f"size {live_size} -> {volume.size} (a PVC can only grow)")
        keep["size"] = live_size
    return (volume.model_copy(update=keep) if keep else volume), edits


def decide_cache(plan: ModelPlan, obs: Observed) -> CacheOutcome:
    """The cache PVC to write (managed claims only) and CacheVolumeReady."""
    pvc = obs.cache_pvc
    out = CacheOutcome(cond=_claim_condition(plan, pvc))
    if out.cond.reason == C.CLAIM_BOUND:
        out.cond = _claim_usage(plan, pvc, obs.claim_artifact_bytes) or out.cond
    if not (plan.claim_managed and plan.volume is not None):
        return out
    labels = ((pvc or {}).get("metadata") or {}).get("labels") or {}
    if pvc is not None and labels.get(names.MANAGED_BY) != names.MANAGED_BY_VALUE:
        return out  # a same-named PVC someone else made is used as-is, never modified
    users = obs.cache_users or [(plan.owner, plan.volume)]
    first_owner, volume = users[0]
    if first_owner != plan.owner:
        diff = _volume_differences(plan.volume, volume)
        if diff:
            out.problem = C.Cond(
                C.DEGRADED,
                C.TRUE,
                C.CLAIM_CONFLICT,
                f"PVC {plan.claim} is shared with SpyreModel {first_owner.name}, whose "
                f"cache.volume settings were first and are used ({'; '.join(diff)}, this model "
                "vs the first): make the cache.volume entries agree, or name another PVC",
            )
    if pvc is None and volume.storage_class_name is None and plan.site.storage_class_name:
        # The default StorageClass applies when the PVC is created; it keeps its class.
        volume = volume.model_copy(update={"storage_class_name": plan.site.storage_class_name})
    if pvc is not None:
        volume, edits = _immutable_edits(volume, pvc, bool(plan.site.storage_class_name))
        if edits and out.problem is None:
            out.problem = C.Cond(
                C.DEGRADED,
                C.TRUE,
                C.CLAIM_IMMUTABLE,
                f"PVC {plan.claim} cannot be changed in place ({'; '.join(edits)}): keep the "
                "old values, or name a new PVC in cache.volume.name",
            )
    out.pvc = build_cache_pvc(
        plan.namespace, volume, cache_owners(users, obs.claim_name_users)
    )
    return out


# ------------------------------------------------------------------------------ artifact


@dataclass
class ArtifactOutcome:
    """status.artifact for the spec's (claim, key), its condition and the Job to keep."""

    status: dict[str, Any]
    cond: C.Cond
    job: Job | None = None
    delete_job: bool = False
    requeue_after: float | None = None
    #: The running Job's pod cannot start (not scheduled, image, Secret, quota).
    stuck: Stuck | None = None
    #: No precompile Job yet: the model waits for a slot of the compile budget.
    waiting: bool = False

    @property
    def phase(self) -> str:
        return str(self.status["phase"])

    @property
    def problem(self) -> str | None:
        """What Degraded says about the artifact: a failed compile, or a precompile pod that
        only a fix lets start."""
        if self.phase == FAILED or (self.stuck is not None and self.stuck.needs_fix):
            return self.cond.message
        return None


def _summary(obs: Observed) -> ArtifactSummary | EngineFailure | None:
    term = _latest_termination(obs.job_pods)
    return parse_termination_message(term.get("message")) if term else None


def _failure_message(
    obs: Observed, job: dict[str, Any], parsed: ArtifactSummary | EngineFailure | None
) -> str:
    term = _latest_termination(obs.job_pods)
    if isinstance(parsed, EngineFailure):
        msg = f"{parsed.reason}: {parsed.message}" if parsed.message else parsed.reason
    elif term and term.get("exitCode") not in (None, 0):
        msg = f"precompile container exited with code {term.get('exitCode')}"
    else:
        msg = "precompile Job failed"
    failed = jobs.condition(job, jobs.FAILED) or {}
    detail = str(failed.get("message") or failed.get("reason") or "")
    return f"{msg} ({detail})" if detail else msg


def _ready_status(plan: ModelPlan, obs: Observed, job: dict[str, Any]) -> dict[str, Any]:
    st = job.get("status", {})
    out: dict[str, Any] = {
        "phase": READY,
        "completedAt": st.get("completionTime"),
        "compileSeconds": _seconds_between(st.get("startTime"), st.get("completionTime")),
    }
    parsed = _summary(obs)
    if isinstance(parsed, ArtifactSummary):
        if parsed.compile_seconds is not None:
            out["compileSeconds"] = round(parsed.compile_seconds, 3)
        if parsed.size_bytes is not None:
            out["sizeBytes"] = parsed.size_bytes
        if parsed.model_revision:
            out["modelRevision"] = parsed.model_revision
        if parsed.key and parsed.key != plan.key:
            out["message"] = f"engine reported key {parsed.key}, expected {plan.key}"
    return out


def _created_after_completion(pvc: dict[str, Any] | None, job: dict[str, Any]) -> bool:
    """A claim created after the Job finished cannot hold what the Job compiled.

    (A PVC in use by a pod cannot be deleted, so a claim recreated under the same name is
    always newer than the completion of any Job that wrote to the old one.)
    """
    created = _parse_time(((pvc or {}).get("metadata") or {}).get("creationTimestamp"))
    done = _parse_time((job.get("status") or {}).get("completionTime"))
    return bool(created and done and created > done)


@dataclass
class _ArtifactFacts:
    """What decide_artifact reads once: the spec's (claim, key), what status remembers of it,
    the retry budget of that (claim, key) and the clock."""

    plan: ModelPlan
    obs: Observed
    cache: CacheOutcome
    policy: Policy
    now: datetime
    pvc_uid: str | None
    #: status.artifact when it is about this (claim, key), else empty.
    old: dict[str, Any]
    #: The attempt of the live Job (shared by the models of this key), else status's.
    attempts: int
    token: str | None
    old_token: str | None

    @classmethod
    def read(
        cls,
        plan: ModelPlan,
        obs: Observed,
        model: dict[str, Any],
        cache: CacheOutcome,
        now: str,
        policy: Policy,
    ) -> _ArtifactFacts:
        old = (model.get("status") or {}).get("artifact") or {}
        if old.get("key") != plan.key or old.get("claim") != plan.claim:
            old = {}
        return cls(
            plan=plan,
            obs=obs,
            cache=cache,
            policy=policy,
            now=_parse_time(now) or datetime.now(UTC),
            pvc_uid=((obs.cache_pvc or {}).get("metadata") or {}).get("uid"),
            old=old,
            attempts=job_attempt(obs.job) or int(old.get("attempts") or 1),
            token=((model.get("metadata") or {}).get("annotations") or {}).get(RETRY_ANNOTATION),
            old_token=old.get("retryToken"),
        )

    @property
    def base(self) -> dict[str, Any]:
        p = self.plan
        return {"key": p.key, "path": p.artifact_dir(), "jobName": p.job_name, "claim": p.claim}

    def job(self, attempt: int | None = None) -> Job:
        """The precompile Job, owned by every model that needs this (claim, key)."""
        owners = self.obs.job_owners or [self.plan.owner]
        if self.plan.owner not in owners:
            owners = [*owners, self.plan.owner]
        return build_precompile_job(self.plan, owners, attempt or self.attempts)

    def pending(self, message: str, reason: str = C.COMPILING, **extra: Any) -> ArtifactOutcome:
        carry = {"attempts": self.attempts, "retryToken": self.old_token}
        st = _clean({**self.base, **carry, **extra, "phase": PENDING, "message": message})
        return ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, reason, message))

    def retry(self, why: str) -> ArtifactOutcome:
        """Pending the next attempt (the caller deletes the failed Job or creates the new one)."""
        n = self.attempts + 1
        return self.pending(f"{why}: attempt {n}", attempts=n, retryToken=self.token)

    def retry_reason(self, due: datetime | None, template_changed: bool = False) -> str | None:
        """Why a failed compile is retried now, if it is."""
        if self.token and self.token != self.old_token:
            return f"retrying now ({RETRY_ANNOTATION}={self.token})"
        if template_changed:
            return "retrying now: the precompile pod template changed since the failed attempt"
        if due is None or self.now >= due:
            return "retrying after backoff"
        return None

    def failed(self, message: str, reason: str, due: datetime) -> ArtifactOutcome:
        """Failed until ``due`` (the Job, if it is still there, is kept for its owners)."""
        carry = {"attempts": self.attempts, "retryToken": self.old_token}
        st = _clean(
            {**self.base, **carry, "phase": FAILED, "message": message, "reason": reason,
             "nextRetryAt": _fmt_time(due)}
        )  # fmt: skip
        text = (
            f"{message}; attempt {self.attempts}, next retry at {_fmt_time(due)} (or set the "
            f"annotation {RETRY_ANNOTATION} to a new value to retry now)"
        )
        out = ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, reason, text))
        out.requeue_after = max(1.0, (due - self.now).total_seconds())
        return out

    def replaceable(self, job: dict[str, Any]) -> bool:
        """The live Job was built from another pod template of this model's (see
        precompile_state.template_changed)."""
        desired = self.job().metadata
        want = ((desired.annotations if desired else None) or {}).get(
            names.TEMPLATE_HASH_ANNOTATION, ""
        )
        sharers = [o.name for o in self.obs.job_owners]
        return template_changed(job, want, self.plan.name, sharers)


def decide_artifact(
    plan: ModelPlan,
    obs: Observed,
    model: dict[str, Any],
    cache: CacheOutcome,
    now: str,
    policy: Policy,
) -> ArtifactOutcome:
    """The artifact for this spec's key *on this claim*, and the precompile Job behind it.

    Readiness is per (claim, key): a Complete Job on a claim that was recreated since, or a
    remembered Ready on another claim, is not an artifact here.
    """
    a = _ArtifactFacts.read(plan, obs, model, cache, now, policy)
    job = obs.job
    if job is None:
        out = _without_job(a, model)
        if out.job is not None and not obs.compile_slot.free:
            return _waiting_for_compile_slot(a, out)
        return out
    state = _job_state(job)
    if state == READY:
        return _compiled(a, job)
    if state == FAILED:
        return _after_failure(a, job)
    return _running(a, job)


def _without_job(a: _ArtifactFacts, model: dict[str, Any]) -> ArtifactOutcome:
    """No Job for this (claim, key): what status remembers, else a (new) compile."""
    refused = _refused_by_servers(a.plan, a.obs)
    if refused:
        out = a.pending(f"{refused}; the precompile Job is gone: compiling the artifact again")
        out.job = a.job()
        return out
    known = _known_on_claim(a, model)
    if known is not None:
        return known
    if a.cache.missing:
        return a.pending("waiting for the cache claim", reason=C.CLAIM_NOT_FOUND)
    if a.old.get("phase") == FAILED:
        # The failed Job was removed (its TTL, or by hand): status has its reason and retry.
        due = _parse_time(a.old.get("nextRetryAt"))
        why = a.retry_reason(due)
        if why is None and due is not None:
            reason = a.old.get("reason") or C.PRECOMPILE_FAILED
            return a.failed(a.old.get("message") or "precompile Job failed", reason, due)
        out = a.retry(why or "retrying after backoff")
        out.job = a.job(a.attempts + 1)
        return out
    removed = a.obs.collected.get(a.plan.key)  # what status remembered is gone: say so
    out = a.pending(
        "creating the precompile Job"
        if removed is None
        else f"the artifact was removed from PVC {a.plan.claim} by garbage collection"
        f"{f' at {removed}' if removed else ''}; compiling it again"
    )
    out.job = a.job()
    return out


def waiting_since(model: dict[str, Any], plan: ModelPlan, now: str) -> str:
    """Since when the model waits for a compile slot for this (claim, key): what its status
    recorded (so a restarted operator keeps the order), else now."""
    old = (model.get("status") or {}).get("artifact") or {}
    if old.get("key") == plan.key and old.get("claim") == plan.claim and old.get(
        "waitingSince"
    ):
        return str(old["waitingSince"])
    return now


def _waiting_for_compile_slot(a: _ArtifactFacts, out: ArtifactOutcome) -> ArtifactOutcome:
    """The Job ``out`` would create waits for the compile budget: no Job; status says why and
    since when (the order among waiting models, oldest first)."""
    slot = a.obs.compile_slot
    message = (
        f"{slot.message('precompile', 'max-concurrent-compiles')}; the precompile Job "
        f"{a.plan.job_name} starts when a slot frees"
    )
    since = a.old.get("waitingSince") or _fmt_time(a.now)  # as waiting_since() finds it
    st = {**out.status, "phase": PENDING, "message": message, "waitingSince": since}
    waiting = ArtifactOutcome(
        st, C.Cond(C.ARTIFACT_READY, C.FALSE, C.WAITING_FOR_COMPILE_SLOT, message)
    )
    waiting.waiting = True
    waiting.requeue_after = WAITING_RECHECK_SECONDS
    return waiting


def _known_on_claim(a: _ArtifactFacts, model: dict[str, Any]) -> ArtifactOutcome | None:
    """Ready without a Job: the artifact is on this very claim (same UID), as this model's
    status or another user's of the claim records it (the Job was removed: TTL, by hand)."""
    plan, old = a.plan, a.old
    if (
        old.get("phase") == READY
        and a.pvc_uid
        and old.get("claimUID") == a.pvc_uid
        and not collected_since(a.obs, plan.key, old.get("completedAt"))
    ):
        st = {**old, "jobName": plan.job_name}
        return ArtifactOutcome(st, _ready_condition(plan, st, remembered=True))
    known = _remembered_on_claim(model, plan, a.pvc_uid)
    if known is None and a.pvc_uid:
        known = next(
            (
                e
                for e in a.obs.claim_artifacts
                if e.get("key") == plan.key
                and e.get("claim") == plan.claim
                and e.get("claimUID") == a.pvc_uid
            ),
            None,
        )
    if known is None or collected_since(a.obs, plan.key, known.get("completedAt")):
        return None
    # A revert to a shape compiled before (or one another model compiled), still on this
    # claim: serve it, no Job.
    st = _clean(
        {
            **a.base,
            "phase": READY,
            "claimUID": a.pvc_uid,
            "sizeBytes": known.get("sizeBytes"),
            "compileSeconds": known.get("compileSeconds"),
            "completedAt": known.get("completedAt"),
            "modelRevision": known.get("modelRevision"),
        }
    )
    return ArtifactOutcome(st, _ready_condition(plan, st, remembered=True))


def _compiled(a: _ArtifactFacts, job: dict[str, Any]) -> ArtifactOutcome:
    """The Job completed: ready, unless the claim was created again since."""
    if _created_after_completion(a.obs.cache_pvc, job):
        out = a.pending(
            f"PVC {a.plan.claim} was created after this artifact was compiled: the "
            "artifact is not on it; compiling again"
        )
        out.delete_job = True
        return out
    removed = collected_since(a.obs, a.plan.key, jobs.finished_at(job))
    if removed is not None:
        out = a.pending(
            f"the artifact was removed from PVC {a.plan.claim} by garbage collection"
            f"{f' ({removed})' if removed else ''} after this Job compiled it; compiling again"
        )
        out.delete_job = True
        return out
    st = _clean(
        {**a.base, **_ready_status(a.plan, a.obs, job), "claimUID": a.pvc_uid,
         "attempts": a.attempts}
    )  # fmt: skip
    out = ArtifactOutcome(st, _ready_condition(a.plan, st))
    out.job = a.job()
    return out


def _after_failure(a: _ArtifactFacts, job: dict[str, Any]) -> ArtifactOutcome:
    """The Job failed: Failed until the retry is due (one backoff per claim and key: the
    attempt is the Job's), asked for, or the model's pod template changed."""
    failed_at = _parse_time((jobs.condition(job, jobs.FAILED) or {}).get("lastTransitionTime"))
    due = (failed_at or a.now) + timedelta(seconds=a.policy.retry_delay(a.attempts))
    why = a.retry_reason(due, template_changed=a.replaceable(job))
    if why is not None:
        out = a.retry(why)
        out.delete_job = True
        return out
    parsed = _summary(a.obs)
    reason = (
        parsed.reason
        if isinstance(parsed, EngineFailure) and parsed.reason in C.ENGINE_COMPILE_REASONS
        else C.PRECOMPILE_FAILED
    )
    out = a.failed(_failure_message(a.obs, job, parsed), reason, due)
    out.job = a.job()
    return out


def _running(a: _ArtifactFacts, job: dict[str, Any]) -> ArtifactOutcome:
    """The Job runs: compiling, or its pod cannot start (the pod's own reason and message).

    A stuck Job whose pod template this model changed since (placement, resources, a Secret
    outside the key) is replaced at once rather than left to its deadline; a Job whose pod
    runs is never replaced.
    """
    plan = a.plan
    claim_bound = ((a.obs.cache_pvc or {}).get("status") or {}).get("phase") == "Bound"
    stuck = job_stuck(plan.job_name, a.obs.job_pods, a.obs.job_events, claim_bound)
    if stuck is not None and a.replaceable(job):
        out = a.pending(
            f"replacing precompile Job {plan.job_name}: its pod template changed since it was "
            f"created, and it could not start ({stuck.message})"[:1024]
        )
        out.delete_job = True
        return out
    carry = {"attempts": a.attempts, "retryToken": a.old_token}
    if stuck is not None:
        st = _clean({**a.base, **carry, "phase": PENDING, "message": stuck.message})
        out = ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, stuck.reason, stuck.message))
        out.stuck = stuck
        out.job = a.job()
        return out
    active = job.get("status", {}).get("active") or 0
    msg = f"precompile Job {plan.job_name} is running" if active else "precompile pod starting"
    st = _clean({**a.base, **carry, "phase": COMPILING, "message": msg})
    out = ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, C.COMPILING, msg))
    out.job = a.job()
    return out


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _ready_condition(plan: ModelPlan, st: dict[str, Any], remembered: bool = False) -> C.Cond:
    detail = ""
    if st.get("compileSeconds") is not None:
        detail = (
            f" (compiled in {st['compileSeconds']:.0f}s, {_human_size(st.get('sizeBytes'))})"
        )
    if remembered:
        detail += f"; compiled earlier ({st.get('completedAt') or 'time unknown'}), not again"
    return C.Cond(
        C.ARTIFACT_READY,
        C.TRUE,
        C.ARTIFACT_AVAILABLE,
        f"artifact {plan.short_key} ready at {st['path']} on PVC {plan.claim}{detail}",
    )


# ------------------------------------------------------------------------------ remembered

#: How many artifacts a model's status remembers (most recently used first).
MAX_REMEMBERED = 16


def _remembered(model: dict[str, Any]) -> list[dict[str, Any]]:
    cache = (model.get("status") or {}).get("cache") or {}
    return [a for a in cache.get("artifacts") or [] if a.get("key") and a.get("claim")]


def collected_since(obs: Observed, key: str, compiled_at: str | None) -> str | None:
    """When a finished GC Job removed ``key`` from the claim after it was compiled at
    ``compiled_at`` ("" if that Job's time is unknown); None if no GC Job removed it since
    (a removal before the compile is a stale report: the artifact was compiled again)."""
    removed_at = obs.collected.get(key)
    if removed_at is None:
        return None
    removed, compiled = _parse_time(removed_at), _parse_time(compiled_at)
    if removed is not None and compiled is not None and compiled > removed:
        return None
    return removed_at


def _remembered_on_claim(
    model: dict[str, Any], plan: ModelPlan, pvc_uid: str | None
) -> dict[str, Any] | None:
    """The remembered artifact of this spec's key on this very claim (same UID), if any."""
    if not pvc_uid:
        return None
    for a in _remembered(model):
        if a["key"] == plan.key and a["claim"] == plan.claim and a.get("claimUID") == pvc_uid:
            return a
    return None


def _refused_by_servers(plan: ModelPlan, obs: Observed) -> str | None:
    """A serving pod of this key refused its artifact (missing, corrupt, no entry).

    Then remembering it is not enough: with its Job gone, it is compiled again (the engine's
    precompile removes what the manifest shows damaged first). A Job that still exists is not
    re-run by this: one automatic recompile, never a loop.
    """
    for p in obs.server_pods:
        if p.get("artifact") != plan.short_key:
            continue
        term = p.get("terminated") or {}
        parsed = parse_termination_message(term.get("message"))
        if isinstance(parsed, EngineFailure) and parsed.reason in C.ENGINE_SERVE_REASONS:
            return f"pod {p.get('name')} refused the artifact ({parsed.reason})"
    return None


def shape_text(spec: SpyreModelSpec) -> str:
    """The compile shape in short, for status.cache.artifacts."""
    c = spec.compile
    parts = [f"tp={c.tensor_parallel_size}", f"backend={c.backend}"]
    if c.warmup_shapes:
        shapes = ",".join(f"{w.prompt_len}x{w.batch_size}" for w in c.warmup_shapes)
        parts.append(f"warmup={shapes}")
    else:
        parts += [f"maxModelLen={c.max_model_len}", f"maxNumSeqs={c.max_num_seqs}"]
        if c.max_num_batched_tokens:
            parts.append(f"chunk={c.max_num_batched_tokens}")
    return " ".join(parts)


def decide_cache_status(
    model: dict[str, Any],
    plan: ModelPlan,
    obs: Observed,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    now: str,
) -> dict[str, Any] | None:
    """status.cache: the artifacts this model compiled or served, and their total size.

    An artifact is recorded once Ready on a claim and stays listed (at most
    :data:`MAX_REMEMBERED`, most recently used first) so a revert finds it. ``inUse`` is
    whether the spec needs it or the Deployment serves it; ``lastUsed`` changes only when that
    flips, so an idle resync writes nothing. Entries of the spec's claim recorded on an older
    incarnation of it (another UID) are dropped: that claim holds none of them.
    """
    pvc_uid = ((obs.cache_pvc or {}).get("metadata") or {}).get("uid")
    entries: dict[tuple[str, str], dict[str, Any]] = {
        (a["key"], a["claim"]): dict(a) for a in _remembered(model)
    }
    if artifact.phase == READY:
        st = artifact.status
        rec = {
            "key": plan.key,
            "claim": plan.claim,
            "claimUID": st.get("claimUID") or pvc_uid,
            "path": st.get("path"),
            "model": plan.spec.model.uri,
            "shape": shape_text(plan.spec),
            "sizeBytes": st.get("sizeBytes"),
            "compileSeconds": st.get("compileSeconds"),
            "completedAt": st.get("completedAt"),
            "modelRevision": st.get("modelRevision"),
        }
        prev = entries.get((plan.key, plan.claim), {})
        entries[(plan.key, plan.claim)] = {**prev, **_clean(rec)}
    if pvc_uid:
        entries = {
            k: a
            for k, a in entries.items()
            if not (a["claim"] == plan.claim and a.get("claimUID") not in (None, pvc_uid))
        }
    in_use = set()
    if artifact.phase == READY:
        in_use.add((plan.key, plan.claim))
    if serving.key and serving.plan is not None:
        in_use.add((serving.key, serving.plan.claim))
    live_key, live_spec = served_key(obs.deployment), _served_spec(obs.deployment or {})
    if live_key and live_spec is not None:  # its pods serve it until the rollout replaces them
        live = plan_model(
            plan.name, plan.namespace, plan.uid, live_spec, plan.site.for_served_spec()
        )
        in_use.add((live_key, live.claim))
    entries = {  # removed by a GC Job since compiled: no longer on the claim (unless in use)
        k: a
        for k, a in entries.items()
        if not (
            k[1] == plan.claim
            and collected_since(obs, k[0], a.get("completedAt")) is not None
            and k not in in_use
        )
    }
    for k, a in entries.items():
        using = k in in_use
        if "lastUsed" not in a or bool(a.get("inUse")) != using:
            a["lastUsed"] = now
        a["inUse"] = using
    if not entries:
        return None
    ordered = sorted(entries.values(), key=lambda a: (a["key"], a["claim"]))
    ordered.sort(key=lambda a: (not a["inUse"], _neg_time(a.get("lastUsed"))))
    kept = ordered[:MAX_REMEMBERED]
    here = [a for a in kept if a["claim"] == plan.claim]
    used = sum(int(a.get("sizeBytes") or 0) for a in here)
    return {
        "artifacts": kept,
        "usedBytes": used,
        "usage": f"{_human_size(used)} in {len(here)}",
    }


def _neg_time(t: str | None) -> float:
    parsed = _parse_time(t)
    return -parsed.timestamp() if parsed else 0.0


# ------------------------------------------------------------------------------ serving


@dataclass
class ServingOutcome:
    """What the Deployment serves: the spec's artifact once ready, else the previous one."""

    plan: ModelPlan | None = None
    key: str | None = None
    #: The spec's artifact is ready, but the Deployment keeps the previous one: every slot
    #: of the rollout budget is in use (the budget's message).
    waiting: str | None = None

    def current(self, plan: ModelPlan) -> bool:
        return (
            self.plan is not None and self.key == plan.key and self.plan.claim == plan.claim
        )


def decide_serving(
    plan: ModelPlan,
    obs: Observed,
    artifact: ArtifactOutcome,
    old_status: dict[str, Any] | None = None,
) -> ServingOutcome:
    """Switch to the spec's artifact only once it is ready on the spec's claim.

    Until then the Deployment is rebuilt from the spec it was made from (its annotation):
    its shape, compile-time env and cache claim match the artifact it runs. A Deployment
    that is gone (deleted by hand or by a cleanup script) is rebuilt from what status
    remembers (servingArtifactKey, servedSpec): the old artifact serves again while the new
    one compiles. A ready artifact waits too while the rollout budget has no free slot
    (``obs.rollout_slot``), if the live Deployment serves another artifact to users.
    """
    if artifact.phase == READY:
        new = ServingOutcome(plan, plan.key)
        available = ((obs.deployment or {}).get("status") or {}).get("availableReplicas") or 0
        if obs.rollout_slot.free or obs.deployment is None or available == 0:
            # A first Deployment (or one deleted by hand), or one serving nothing (scaled to
            # zero, crashing): switching it takes nothing away from users.
            return new
        previous = _previous_serving(plan, obs, None)
        if previous.plan is None or previous.current(plan):
            return new  # nothing else serves: not a switch to a new artifact
        previous.waiting = (
            f"{obs.rollout_slot.message('rollout', 'max-concurrent-rollouts')}; the "
            f"Deployment switches to artifact {plan.short_key} when a slot frees"
        )
        return previous
    return _previous_serving(plan, obs, old_status)


def _previous_serving(
    plan: ModelPlan, obs: Observed, old_status: dict[str, Any] | None
) -> ServingOutcome:
    """What the live Deployment serves (else what status remembers), at the spec's replicas."""
    live_key, old_spec = served_key(obs.deployment), _served_spec(obs.deployment or {})
    if not live_key or old_spec is None:
        live_key, old_spec = _remembered_serving(old_status or {})
    if not live_key or old_spec is None:
        return ServingOutcome()
    old_spec = old_spec.model_copy(update={"replicas": plan.spec.replicas})
    return ServingOutcome(
        plan_model(plan.name, plan.namespace, plan.uid, old_spec, plan.site.for_served_spec()),
        live_key,
    )


@dataclass(frozen=True)
class Rollout:
    """The Deployment's progress."""

    done: bool = False
    total: int = 0
    available: int = 0
    stall: str | None = None


def _rollout(deployment: dict[str, Any] | None, replicas: int, key: str | None) -> Rollout:
    if not deployment:
        return Rollout()
    st = deployment.get("status") or {}
    gen = deployment.get("metadata", {}).get("generation", 0)
    available = st.get("availableReplicas") or 0
    total = st.get("replicas") or 0
    done = (
        served_key(deployment) == key  # else what we just applied has not been observed yet
        and st.get("observedGeneration", 0) >= gen
        and (st.get("updatedReplicas") or 0) == replicas
        and available == replicas
        and total == replicas
    )
    stall = None
    for c in st.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            stall = c.get("message") or "rollout exceeded its progress deadline"
    return Rollout(done, total, available, stall)


#: ``pod.status.reason`` of pods the kubelet ended itself.
NODE_ENDED_POD_REASONS = frozenset({"Evicted", "Preempting", "NodeShutdown", "Terminated"})


def _engine_failure(pods: list[dict[str, Any]]) -> tuple[str, str] | None:
    """A serving container that exited non-zero (e.g. refusing a mismatched artifact): the
    condition reason (the engine's own when it names the artifact's problem, else EngineFailed)
    and the message.

    A container the kubelet cannot start (its image cannot be pulled, a Secret or ConfigMap
    it references is missing) is reported the same way, with the kubelet's reason and
    message, rather than as a rollout in progress until the progress deadline.

    Not a pod the node ended (evicted under disk or memory pressure, node shutdown,
    preemption): its container was killed, not failed, and the Deployment replaces it; the
    failed pod object stays until garbage-collected and must not mark the model failed.
    """
    for p in pods:
        if p.get("reason") in NODE_ENDED_POD_REASONS:
            continue
        term = p.get("terminated")
        if term and term.get("exitCode") not in (None, 0):
            parsed = parse_termination_message(term.get("message"))
            if isinstance(parsed, EngineFailure):
                reason = (
                    parsed.reason if parsed.reason in C.ENGINE_SERVE_REASONS else C.ENGINE_FAILED
                )
                return reason, f"pod {p['name']}: {parsed.reason}: {parsed.message}"
            code = term.get("exitCode")
            return C.ENGINE_FAILED, f"pod {p['name']}: engine exited with code {code}"
        if p.get("waiting") == "CrashLoopBackOff":
            return C.ENGINE_FAILED, f"pod {p['name']}: CrashLoopBackOff"
        cannot = P.cannot_start(p)  # the one answer for serving and precompile pods
        if cannot is not None:
            return cannot
    return None


# ------------------------------------------------------------------------------ routing


@dataclass
class RoutingOutcome:
    """The InferencePool to write or delete, and RoutingReady (None: routing not asked for)."""

    cond: C.Cond | None = None
    pool: Any | None = None
    delete: bool = False


def _parent_name(parent: dict[str, Any], namespace: str) -> str:
    ref = parent.get("parentRef") or {}
    kind = ref.get("kind") or "Gateway"
    return f"{kind} {ref.get('namespace') or namespace}/{ref.get('name', '?')}"


def _pool_condition(name: str, namespace: str, pool: dict[str, Any] | None) -> C.Cond:
    """RoutingReady from status.parents[].conditions of an InferencePool (v1).

    Accepted=True on some parent (and ResolvedRefs not False there) means a Gateway routes to
    the pool. No parents means no Gateway has taken it up yet: an HTTPRoute must reference it.
    """
    t = C.ROUTING_READY
    if pool is None:
        return C.Cond(t, C.FALSE, C.INFERENCE_POOL_PENDING, f"creating InferencePool {name}")
    parents = ((pool.get("status") or {}).get("parents")) or []
    if not parents:
        return C.Cond(
            t,
            C.FALSE,
            C.INFERENCE_POOL_PENDING,
            f"InferencePool {name} has no parent yet: reference it from an HTTPRoute of a "
            "Gateway whose implementation supports the Inference Extension",
        )
    accepted, refused, unresolved, pending = [], [], [], []
    for parent in parents:
        conds = {c.get("type"): c for c in parent.get("conditions") or []}
        who = _parent_name(parent, namespace)
        acc, refs = conds.get("Accepted") or {}, conds.get("ResolvedRefs") or {}
        detail = f"{who}: {acc.get('reason') or 'no reason'}: {acc.get('message') or ''}".rstrip(
            ": "
        )
        if acc.get("status") == C.TRUE and refs.get("status") == C.FALSE:
            unresolved.append(f"{who}: {refs.get('reason')}: {refs.get('message') or ''}")
        elif acc.get("status") == C.TRUE:
            accepted.append(who)
        elif acc.get("status") == C.FALSE:
            refused.append(detail)
        else:
            pending.append(detail)
    if accepted:
        by = ", ".join(accepted)
        msg = f"InferencePool {name} accepted by {by}"
        return C.Cond(t, C.TRUE, C.INFERENCE_POOL_ACCEPTED, msg)
    if unresolved:
        return C.Cond(
            t,
            C.FALSE,
            C.INFERENCE_POOL_REFS_NOT_RESOLVED,
            f"InferencePool {name}: {'; '.join(unresolved)}"[:1024],
        )
    if refused:
        return C.Cond(
            t,
            C.FALSE,
            C.INFERENCE_POOL_NOT_ACCEPTED,
            f"InferencePool {name} not accepted by {'; '.join(refused)}"[:1024],
        )
    return C.Cond(
        t,
        C.FALSE,
        C.INFERENCE_POOL_PENDING,
        f"InferencePool {name}: waiting for {'; '.join(pending)}"[:1024],
    )


def decide_routing(plan: ModelPlan, obs: Observed, old_conditions: Any) -> RoutingOutcome:
    """The model's InferencePool and RoutingReady.

    Routing is an add-on: whatever happens here (no CRD, no RBAC, a foreign pool, no Gateway)
    the model serves through its Service, so RoutingReady is the only condition it touches.
    Without the CRD nothing is written and nothing retried: the InferencePool watch notices
    when the CRD is installed and reconciles the models that asked for a pool.
    """
    name = inference_pool_name(plan.name)
    t = C.ROUTING_READY
    if not wants_inference_pool(plan):
        return RoutingOutcome(delete=obs.inference_pool is not None)
    if obs.foreign_inference_pool:
        return RoutingOutcome(C.Cond(t, C.FALSE, C.NAME_CONFLICT, obs.foreign_inference_pool))
    if obs.inference_pool_api == API_NOT_SERVED:
        return RoutingOutcome(
            C.Cond(
                t,
                C.FALSE,
                C.INFERENCE_POOL_CRD_MISSING,
                "the cluster does not serve InferencePools (inference.networking.k8s.io/v1): "
                "install the Gateway API Inference Extension CRDs; the operator creates "
                f"InferencePool {name} once they exist. The model serves through its Service "
                "meanwhile",
            )
        )
    if obs.inference_pool_api == API_FORBIDDEN:
        return RoutingOutcome(
            C.Cond(
                t,
                C.FALSE,
                C.INFERENCE_POOL_FORBIDDEN,
                "the operator may not watch or write InferencePools (grant list, watch, create, "
                "patch, delete on inferencepools.inference.networking.k8s.io): "
                + obs.inference_pool_api_message,
            )
        )
    if obs.inference_pool_api == API_UNKNOWN:
        old = C.find(old_conditions, t)
        if old is not None:  # the watch has not listed yet: keep what was known
            return RoutingOutcome(C.Cond(t, old["status"], old["reason"], old.get("message", "")))
        return RoutingOutcome(
            C.Cond(
                t, C.UNKNOWN, C.INFERENCE_POOL_PENDING, "checking whether InferencePools are served"
            )
        )
    return RoutingOutcome(
        _pool_condition(name, plan.namespace, obs.inference_pool), pool=build_inference_pool(plan)
    )


# ------------------------------------------------------------------------------ scale to zero


@dataclass
class ScaleToZeroOutcome:
    """What a model with (or without) ``minReplicas: 0`` needs from KEDA and its add-on."""

    apply: list[Any] = field(default_factory=list)
    delete: list[tuple[type, str]] = field(default_factory=list)
    #: The Autoscaling condition of a scale-to-zero model (None: not one).
    cond: C.Cond | None = None
    #: The model's Service points at the interceptor (selector-less + mirrored EndpointSlice).
    via_interceptor: bool = False
    #: The ScaledObject's status.lastActiveTime.
    last_active: str | None = None


def _scale_to_zero_objects(plan: ModelPlan, obs: Observed) -> list[tuple[type, str]]:
    """The scale-to-zero children that exist (to delete when zero is switched off)."""
    name = plan.name
    return [
        (resource, obj_name)
        for resource, obj_name, live in (
            (HTTPScaledObject, names.server_name(name), obs.http_scaled_object),
            (ScaledObject, names.server_name(name), obs.scaled_object),
            (EndpointSlice, names.mirror_slice_name(name), obs.mirror_slice),
            (Service, names.engine_service_name(name), obs.engine_service),
            (Service, names.coldstart_service_name(name), obs.coldstart_service),
        )
        if live is not None
    ]


def _scale_to_zero_problems(plan: ModelPlan, obs: Observed) -> list[str] | None:
    """Why the model cannot scale to zero now ([]: it can; None: not known yet)."""
    if not obs.keda.enabled:
        return [
            "scale to zero is off in this operator (--no-scale-to-zero; the chart's "
            "scaleToZero.enabled=false): install KEDA and its HTTP add-on, then turn it on"
        ]
    problems, unknown = [], False
    for api, crd, state, message in (
        ("ScaledObjects", "scaledobjects.keda.sh", obs.scaled_object_api,
         obs.scaled_object_api_message),
        ("HTTPScaledObjects", "httpscaledobjects.http.keda.sh", obs.http_scaled_object_api,
         obs.http_scaled_object_api_message),
    ):  # fmt: skip
        if state == API_NOT_SERVED:
            problems.append(
                f"the cluster does not serve {api} ({crd}/v1alpha1): install KEDA and its HTTP "
                f"add-on; the operator creates them once they exist ({message or 'not found'})"
            )
        elif state == API_FORBIDDEN:
            problems.append(
                f"the operator may not watch or write {api} (grant list, watch, create, patch, "
                f"delete on {crd}): {message}"
            )
        elif state == API_UNKNOWN:
            unknown = True
    auto = plan.spec.autoscaling
    if auto is not None and targets(auto) and not obs.keda.prometheus_address:
        problems.append(
            "autoscaling targets need the operator's --prometheus-address (the ScaledObject's "
            "prometheus triggers); without targets the model scales 0 <-> 1 on requests alone"
        )
    if obs.foreign_scale_to_zero:
        problems.append(obs.foreign_scale_to_zero)
    if problems:
        return problems
    if unknown:
        return None
    endpoints, port, _ = interceptor_endpoints(
        obs.interceptor_slices, obs.keda.interceptor_port_name
    )
    if obs.mirror_slice is None and (not endpoints or port is None):
        problems.append(
            f"the interceptor Service {obs.keda.interceptor_namespace}/"
            f"{obs.keda.interceptor_service} has no endpoints: the model's Service keeps "
            "selecting its pods until it has"
        )
    return problems


def _scaled_object_condition(name: str, so: dict[str, Any] | None) -> C.Cond:
    """Autoscaling from KEDA's ScaledObject (its Ready condition)."""
    t = C.AUTOSCALING
    if so is None:
        return C.Cond(t, C.UNKNOWN, C.AUTOSCALER_PENDING, f"creating ScaledObject {name}")
    st = so.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") == C.UNKNOWN:
        return C.Cond(t, C.UNKNOWN, C.AUTOSCALER_PENDING, f"KEDA has not taken up {name} yet")
    if ready.get("status") != C.TRUE:
        return C.Cond(
            t,
            C.FALSE,
            C.SCALED_OBJECT_NOT_READY,
            f"ScaledObject {name}: {ready.get('reason') or ''}: {ready.get('message') or ''}"[
                :1024
            ],
        )
    spec = so.get("spec") or {}
    msg = f"KEDA scales between 0 and {spec.get('maxReplicaCount')} replicas"
    if st.get("lastActiveTime"):
        msg += f"; last active {st['lastActiveTime']}"
    return C.Cond(t, C.TRUE, C.SCALE_TO_ZERO_ACTIVE, msg)


def decide_scale_to_zero(plan: ModelPlan, obs: Observed, old_conditions: Any) -> ScaleToZeroOutcome:
    """The objects of a ``minReplicas: 0`` model, written only when KEDA serves both APIs.

    As with InferencePools: an API that is not served (or forbidden) is a condition, nothing
    is written or retried, and the optional-API watches reconcile the model when it appears.
    Meanwhile the model's Service keeps selecting its pods (it serves while replicas > 0).
    """
    out = ScaleToZeroOutcome()
    if not wants_scale_to_zero(plan):
        out.delete = _scale_to_zero_objects(plan, obs)
        return out
    so = obs.scaled_object
    out.last_active = ((so or {}).get("status") or {}).get("lastActiveTime")
    problems = _scale_to_zero_problems(plan, obs)
    if problems is None:  # the watches have not listed yet: keep what was there
        old = C.find(old_conditions, C.AUTOSCALING)
        out.cond = (
            C.Cond(C.AUTOSCALING, old["status"], old["reason"], old.get("message", ""))
            if old is not None
            else C.Cond(
                C.AUTOSCALING, C.UNKNOWN, C.AUTOSCALER_PENDING,
                "checking whether KEDA's APIs are served",
            )
        )  # fmt: skip
        out.via_interceptor = obs.mirror_slice is not None
        return out
    if problems:
        out.cond = C.Cond(
            C.AUTOSCALING, C.FALSE, C.SCALE_TO_ZERO_UNAVAILABLE, "; ".join(problems)[:1024]
        )
        out.delete = _scale_to_zero_objects(plan, obs)
        return out
    cfg = obs.keda
    endpoints, port, address_type = interceptor_endpoints(
        obs.interceptor_slices, cfg.interceptor_port_name
    )
    if port is None:  # the mirror exists and the interceptor has gone: keep its port
        port = int(((obs.mirror_slice or {}).get("ports") or [{}])[0].get("port") or 0)
    failover_service, failover_port = None, None
    if cfg.coldstart_service and cfg.coldstart_port:
        failover_service = names.coldstart_service_name(plan.name)
        failover_port = cfg.coldstart_port
        target = f"{cfg.coldstart_service}.{cfg.coldstart_namespace}.svc.cluster.local"
        out.apply.append(build_coldstart_service(plan, target, cfg.coldstart_port))
    elif obs.coldstart_service is not None:
        out.delete.append((Service, names.coldstart_service_name(plan.name)))
    out.apply += [
        build_engine_service(plan),
        build_http_scaled_object(
            plan,
            failover_service=failover_service,
            failover_port=failover_port,
            no_capacity=_unschedulable(obs.server_pods) is not None,
        ),
        build_scaled_object(
            plan, scaler_address=cfg.scaler_address, prometheus_address=cfg.prometheus_address
        ),
        build_mirror_slice(plan, endpoints, port, address_type),
    ]
    out.via_interceptor = True
    out.cond = _scaled_object_condition(names.server_name(plan.name), so)
    return out


# ------------------------------------------------------------------------------ status


@dataclass(frozen=True)
class _StatusFacts:
    """What Ready, Progressing and Degraded are decided from, read once."""

    roll: Rollout
    #: The Deployment serves the spec's artifact on the spec's claim.
    current: bool
    #: (reason, message) of a serving pod that failed or cannot start.
    engine_failure: tuple[str, str] | None
    #: The API server rejected a write of this reconcile (its message).
    write_error: str | None
    #: Same-named objects the model wants that are not the operator's (why).
    conflict: str | None
    #: A scale-to-zero model: why it would not answer at zero (None: it would, or not one).
    zero_problem: str | None = None
    #: Serving pods no scheduler has looked at for SCHEDULER_SILENCE_SECONDS (why), if any.
    no_scheduler: str | None = None


def _conflict(plan: ModelPlan, obs: Observed) -> str | None:
    """The same-named objects that are not the operator's, among those the model wants.

    A foreign PodDisruptionBudget or HorizontalPodAutoscaler is in the way only when the
    model asks for one (more than one replica, spec.autoscaling): otherwise it is left alone
    and is no reason to mark the model Degraded (GitOps health would fail for nothing).
    """
    unwanted = set()
    if not wants_pdb(plan):
        unwanted.add("PodDisruptionBudget")
    if not wants_hpa(plan) or wants_scale_to_zero(plan):
        unwanted.add("HorizontalPodAutoscaler")
    if not wants_network_policy(plan):
        unwanted.add("NetworkPolicy")
    return "; ".join(v for k, v in obs.foreign.items() if k not in unwanted) or None


def decide_status(
    plan: ModelPlan,
    obs: Observed,
    cache: CacheOutcome,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    zero: ScaleToZeroOutcome | None = None,
    no_scheduler: str | None = None,
) -> list[C.Cond]:
    """Ready, Progressing and Degraded (CacheVolumeReady and ArtifactReady come as they are).

    Ready means the endpoint serves: at least one replica is available (or the model is
    scaled to zero). Fewer replicas than asked is reported by Progressing, and by Degraded
    once the rollout stalls; it never turns Ready False while pods serve.
    """
    facts = _StatusFacts(
        roll=_rollout(obs.deployment, plan.spec.replicas, serving.key),
        current=serving.current(plan),
        engine_failure=_engine_failure(
            [p for p in obs.server_pods if p.get("artifact") == names.short_key(serving.key or "")]
        ),
        write_error=write_error_message(obs.write_errors),
        conflict=_conflict(plan, obs),
        zero_problem=_zero_problem(zero),
        no_scheduler=no_scheduler,
    )
    conds = [
        _ready(plan, cache, artifact, serving, facts),
        cache.cond,
        artifact.cond,
        _progressing(plan, obs, cache, artifact, serving, facts),
        _degraded(plan, obs, cache, artifact, facts),
    ]
    if zero is not None and zero.cond is not None:
        conds.append(zero.cond)
    elif plan.spec.autoscaling is not None and plan.spec.replicas == 0:
        conds.append(
            C.Cond(
                C.AUTOSCALING,
                C.FALSE,
                C.REPLICAS_AT_ZERO,
                "spec.replicas is 0 and the HorizontalPodAutoscaler does not scale from zero "
                f"(minReplicas {plan.spec.autoscaling.min_replicas}): set spec.replicas to "
                "start the model, or allow zero again (minReplicas: 0)",
            )
        )
    elif plan.spec.autoscaling is not None:
        conds.append(_autoscaling_condition(obs.hpa))
    return conds


def _zero_problem(zero: ScaleToZeroOutcome | None) -> str | None:
    """Why a scale-to-zero model would not answer at zero (its requests would find nothing).

    It answers when its Service points at the interceptor and KEDA reports the ScaledObject
    Ready: then a request wakes it. Until then, at zero, it is not Ready.
    """
    if zero is None or zero.cond is None:
        return None
    if zero.via_interceptor and zero.cond.status == C.TRUE:
        return None
    return zero.cond.message or "KEDA's ScaledObject is not Ready yet"


def _degraded(
    plan: ModelPlan, obs: Observed, cache: CacheOutcome, artifact: ArtifactOutcome, f: _StatusFacts
) -> C.Cond:
    """Degraded: the first problem users must act on."""
    claim_problem = cache.cond if cache.cond.reason in C.CLAIM_PROBLEMS else cache.problem
    for reason, message in (
        (C.NAME_CONFLICT, f.conflict),
        (C.RECONCILE_ERROR, f.write_error),
        (artifact.cond.reason, artifact.problem),
        (claim_problem.reason if claim_problem else "", claim_problem and claim_problem.message),
        (
            C.CLAIM_NOT_FOUND,
            None
            if obs.model_pvc_exists
            else f"model claim {plan.model_claim} not found in namespace {plan.namespace}",
        ),
        f.engine_failure or ("", None),
        (C.ROLLOUT_STALLED, f.roll.stall),
    ):
        if message:
            return C.Cond(C.DEGRADED, C.TRUE, reason, message)
    return C.Cond(C.DEGRADED, C.FALSE, C.AS_EXPECTED, "")


def _ready(
    plan: ModelPlan,
    cache: CacheOutcome,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    f: _StatusFacts,
) -> C.Cond:
    """Ready: does the endpoint serve?"""
    replicas, roll = plan.spec.replicas, f.roll
    if serving.key is None or serving.plan is None:
        if f.conflict:
            return C.Cond(C.READY, C.FALSE, C.NAME_CONFLICT, f.conflict)
        if f.write_error:
            return C.Cond(C.READY, C.FALSE, C.RECONCILE_ERROR, f.write_error)
        if artifact.phase == FAILED or artifact.stuck is not None:
            return C.Cond(C.READY, C.FALSE, artifact.cond.reason, artifact.cond.message)
        if cache.missing:
            return C.Cond(C.READY, C.FALSE, C.CLAIM_NOT_FOUND, cache.cond.message)
        if artifact.waiting:
            return C.Cond(C.READY, C.FALSE, C.WAITING_FOR_COMPILE_SLOT, artifact.cond.message)
        return C.Cond(C.READY, C.FALSE, C.COMPILING, f"compiling artifact {plan.short_key}")
    if replicas == 0 and f.zero_problem is not None:
        return C.Cond(
            C.READY, C.FALSE, C.SCALE_TO_ZERO_UNAVAILABLE,
            f"scaled to zero and nothing wakes the model: {f.zero_problem}"[:1024],
        )  # fmt: skip
    auto = plan.spec.autoscaling
    if replicas == 0 and auto is not None and auto.min_replicas == 0:
        return C.Cond(
            C.READY, C.TRUE, C.SCALED_TO_ZERO,
            "scaled to zero replicas; a request wakes the model (it is held until a replica "
            "is Ready)",
        )  # fmt: skip
    if replicas == 0:
        return C.Cond(C.READY, C.TRUE, C.SCALED_TO_ZERO, "scaled to zero replicas")
    if roll.available > 0 and not f.current:
        what = (
            f"artifact {names.short_key(serving.key)}"
            if serving.key != plan.key
            else f"artifact {plan.short_key} from PVC {serving.plan.claim}"
        )
        return C.Cond(
            C.READY,
            C.TRUE,
            C.SERVING_PREVIOUS_ARTIFACT,
            f"serving {what} while {plan.short_key} on PVC {plan.claim} "
            + (
                "failed to compile"
                if artifact.phase == FAILED
                else f"cannot compile yet ({artifact.stuck.reason})"
                if artifact.stuck is not None
                else f"waits for a rollout slot ({C.WAITING_FOR_ROLLOUT_SLOT})"
                if serving.waiting
                else f"waits for a precompile slot ({C.WAITING_FOR_COMPILE_SLOT})"
                if artifact.waiting
                else "compiles"
            ),
        )
    if roll.available > 0:
        return C.Cond(
            C.READY,
            C.TRUE,
            C.SERVING,
            f"{roll.available}/{replicas} replicas serving artifact {plan.short_key}",
        )
    if f.conflict:
        return C.Cond(C.READY, C.FALSE, C.NAME_CONFLICT, f.conflict)
    if f.write_error:
        return C.Cond(C.READY, C.FALSE, C.RECONCILE_ERROR, f.write_error)
    if f.engine_failure:
        return C.Cond(C.READY, C.FALSE, *f.engine_failure)
    return C.Cond(
        C.READY,
        C.FALSE,
        C.ROLLING_OUT if roll.total else C.PODS_NOT_READY,
        f"0/{replicas} replicas available",
    )


def _progressing(
    plan: ModelPlan,
    obs: Observed,
    cache: CacheOutcome,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    f: _StatusFacts,
) -> C.Cond:
    """Progressing: compiling, or rolling out (with why replicas wait for a node)."""
    roll = f.roll
    if artifact.phase in (PENDING, COMPILING) and not cache.missing:
        reason = artifact.stuck.reason if artifact.stuck is not None else C.COMPILING
        if artifact.waiting:
            reason = C.WAITING_FOR_COMPILE_SLOT
        return C.Cond(C.PROGRESSING, C.TRUE, reason, artifact.cond.message)
    if serving.waiting:
        return C.Cond(C.PROGRESSING, C.TRUE, C.WAITING_FOR_ROLLOUT_SLOT, serving.waiting)
    if serving.key is None or (f.current and roll.done) or roll.stall:
        return C.Cond(C.PROGRESSING, C.FALSE, C.RECONCILED, "nothing to do")
    available = f"{roll.available}/{plan.spec.replicas} replicas available"
    if f.no_scheduler:
        return C.Cond(
            C.PROGRESSING, C.TRUE, C.SCHEDULER_NOT_RUNNING, f"{available}; {f.no_scheduler}"
        )
    unschedulable = _unschedulable(obs.server_pods)
    if unschedulable:
        return C.Cond(
            C.PROGRESSING, C.TRUE, C.INSUFFICIENT_CAPACITY, f"{available}; {unschedulable}"
        )
    return C.Cond(
        C.PROGRESSING,
        C.TRUE,
        C.ROLLING_OUT,
        f"rolling out artifact {plan.short_key}: {available}",
    )


#: A serving pod that no scheduler has looked at for this long (no PodScheduled condition) is
#: reported: a running scheduler tries a new pod within seconds, even when nothing fits.
SCHEDULER_SILENCE_SECONDS = 60.0


def scheduler_silence(
    pods: list[dict[str, Any]], now: datetime
) -> tuple[str | None, float | None]:
    """(why serving pods wait for a scheduler that does not run, when to look again): pods
    that no scheduler has looked at for SCHEDULER_SILENCE_SECONDS are reported; younger ones
    are looked at again once they reach it (a pod that merely waits sends no further event)."""
    silent, recheck = [], None
    for p in pods:
        since = _parse_time(p.get("unscheduledSince"))
        if since is None:
            continue
        age = (now - since).total_seconds()
        if age >= SCHEDULER_SILENCE_SECONDS:
            silent.append((p, age))
        else:
            left = SCHEDULER_SILENCE_SECONDS - age + 1
            recheck = left if recheck is None else min(recheck, left)
    if not silent:
        return None, recheck
    first, age = silent[0]
    why = (
        f"{len(silent)} pod{'s' if len(silent) > 1 else ''} not looked at by scheduler "
        f"{first.get('scheduler')!r} ({first['name']}: {age:.0f}s without a PodScheduled "
        "condition): is that scheduler installed and running? (spec.accelerator.schedulerName, "
        "or the operator's --default-scheduler-name; IBM's Spyre Operator installs "
        "spyre-scheduler)"
    )
    return why[:1024], recheck


def _unschedulable(pods: list[dict[str, Any]]) -> str | None:
    """Why serving pods wait for a node (the scheduler's message), if some do."""
    stuck = [p for p in pods if p.get("unschedulable")]
    if not stuck:
        return None
    first = stuck[0]
    return (
        f"{len(stuck)} pod{'s' if len(stuck) > 1 else ''} cannot be scheduled "
        f"({first['name']}: {first['unschedulable']})"
    )[:1024]


#: The HPA's own conditions, most telling first when one is False.
_HPA_CONDITIONS = ("ScalingActive", "AbleToScale")


def _autoscaling_condition(hpa: dict[str, Any] | None) -> C.Cond:
    """What the HorizontalPodAutoscaler reports: its metrics, or why it cannot scale."""
    if hpa is None:
        return C.Cond(
            C.AUTOSCALING,
            C.UNKNOWN,
            C.AUTOSCALER_PENDING,
            "HorizontalPodAutoscaler not created yet",
        )
    st = hpa.get("status") or {}
    by_type = {c.get("type"): c for c in st.get("conditions") or []}
    if not by_type:
        return C.Cond(
            C.AUTOSCALING,
            C.UNKNOWN,
            C.AUTOSCALER_PENDING,
            "the HorizontalPodAutoscaler has not evaluated its metrics yet",
        )
    for t in _HPA_CONDITIONS:
        c = by_type.get(t)
        if c is not None and c.get("status") == C.FALSE:
            return C.Cond(
                C.AUTOSCALING,
                C.FALSE,
                c.get("reason") or f"{t}False",
                f"HorizontalPodAutoscaler {t}=False: {c.get('message') or ''}"[:1024],
            )
    spec = hpa.get("spec") or {}
    desired, current = st.get("desiredReplicas"), st.get("currentReplicas")
    message = (
        f"{current} replicas, desired {desired} "
        f"(min {spec.get('minReplicas', 1)}, max {spec.get('maxReplicas')})"
    )
    limited = by_type.get("ScalingLimited")
    if limited is not None and limited.get("status") == C.TRUE:
        return C.Cond(
            C.AUTOSCALING,
            C.TRUE,
            limited.get("reason") or "ScalingLimited",
            f"{message}: {limited.get('message') or ''}"[:1024],
        )
    return C.Cond(C.AUTOSCALING, C.TRUE, C.AUTOSCALER_ACTIVE, message)


def write_error_message(errors: list[WriteError]) -> str | None:
    """The API server's rejections of a reconcile's writes, for status and the log."""
    if not errors:
        return None
    return "; ".join(
        f"the API server rejected {e.kind} {e.name} ({e.code}): {e.message}" for e in errors
    )[:1024]


def _invalid_status(
    model: dict[str, Any], error: ValidationError, generation: int, now: str
) -> Decision:
    old_status = model.get("status") or {}
    msg = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in error.errors()
    )[:1024]
    invalid = [
        C.Cond(C.READY, C.FALSE, C.INVALID_SPEC, msg),
        C.Cond(C.DEGRADED, C.TRUE, C.INVALID_SPEC, msg),
        C.Cond(C.PROGRESSING, C.FALSE, C.INVALID_SPEC, "fix the spec"),
    ]
    conds = C.merge_conditions(
        old_status.get("conditions"), C.with_kstatus(invalid), generation, now
    )
    status = {**old_status, "observedGeneration": generation, "conditions": conds}
    return Decision(status=status, events=_events(old_status.get("conditions"), conds))


def _refused_status(
    model: dict[str, Any],
    message: str,
    generation: int,
    now: str,
    reason: str = C.UNSUPPORTED_CONFIGURATION,
    effective: dict[str, Any] | None = None,
) -> Decision:
    """A shape the plugin does not support (or none given for a model it cannot choose one
    for), or an engine image the allow-list refuses: nothing is created or changed (a
    Deployment serving an earlier artifact keeps it)."""
    old_status = model.get("status") or {}
    msg = message[:1024]
    todo = (
        "use an allowed engine image"
        if reason == C.ENGINE_IMAGE_NOT_ALLOWED
        else "choose a supported compile shape"
    )
    refused = [
        C.Cond(C.READY, C.FALSE, reason, msg),
        C.Cond(C.ARTIFACT_READY, C.FALSE, reason, msg),
        C.Cond(C.DEGRADED, C.TRUE, reason, msg),
        C.Cond(C.PROGRESSING, C.FALSE, reason, todo),
    ]
    conds = C.merge_conditions(
        old_status.get("conditions"), C.with_kstatus(refused), generation, now
    )
    status = {**old_status, "observedGeneration": generation, "conditions": conds}
    if effective is not None:
        status["effective"] = effective
    status.pop("compile", None)
    return Decision(status=status, events=_events(old_status.get("conditions"), conds))


def decide(
    model: dict[str, Any], obs: Observed, now: str, policy: Policy = DEFAULT_POLICY
) -> Decision:
    """The reconcile policy for one SpyreModel."""
    meta = model.get("metadata", {})
    name, ns = meta["name"], meta["namespace"]
    generation = meta.get("generation", 1)
    old_status = model.get("status") or {}
    try:
        spec = SpyreModelSpec.model_validate(model.get("spec") or {})
    except ValidationError as e:
        return _invalid_status(model, e, generation, now)
    plan = plan_model(name, ns, meta.get("uid", ""), spec, policy.site)
    effective = effective_status(plan.spec, plan.from_defaults, plan.storage_class(obs.cache_pvc))
    if plan.image_refusal:
        return _refused_status(
            model, plan.image_refusal, generation, now, C.ENGINE_IMAGE_NOT_ALLOWED, effective
        )
    if plan.shape is not None and plan.shape.refusal:
        return _refused_status(model, plan.shape.refusal, generation, now, effective=effective)

    cache = decide_cache(plan, obs)
    artifact = decide_artifact(plan, obs, model, cache, now, policy)
    serving = decide_serving(plan, obs, artifact, old_status)

    routing = decide_routing(plan, obs, old_status.get("conditions"))
    zero = decide_scale_to_zero(plan, obs, old_status.get("conditions"))

    d = Decision(job=artifact.job, requeue_after=artifact.requeue_after)
    if serving.waiting:
        d.requeue_after = min(d.requeue_after or WAITING_RECHECK_SECONDS, WAITING_RECHECK_SECONDS)
    if cache.pvc is not None:
        d.apply.append(cache.pvc)
    if artifact.delete_job:
        d.delete.append((Job, plan.job_name))
    for job_name, _ in superseded(
        obs.owned_jobs, plan.claim, plan.key, lambda c, k: (c, k) in obs.needed_jobs
    ):
        d.delete.append((Job, job_name))  # an earlier spec's compile: stop it, free its cards
    if serving.plan is not None and serving.key is not None:
        d.apply.append(mark_rolled_out(build_deployment(serving.plan, serving.key),
                                       obs.deployment))
    # Deletes run before applies (controller.execute): the operator's HPA is gone before the
    # ScaledObject is written (KEDA refuses a target another HPA scales).
    d.delete += zero.delete
    d.apply.append(build_interceptor_service(plan) if zero.via_interceptor else build_service(plan))
    d.apply += zero.apply
    if wants_pdb(plan):
        d.apply.append(build_pdb(plan))
    elif obs.pdb is not None:
        d.delete.append((PodDisruptionBudget, names.server_name(name)))
    if wants_hpa(plan) and not wants_scale_to_zero(plan):
        d.apply.append(build_hpa(plan))
    elif obs.hpa is not None:
        d.delete.append((HorizontalPodAutoscaler, names.server_name(name)))
    if wants_network_policy(plan):
        interceptor = obs.keda.interceptor_namespace if zero.via_interceptor else None
        d.apply.append(build_network_policy(plan, interceptor))
    elif obs.network_policy is not None:
        d.delete.append((NetworkPolicy, names.server_name(name)))
    if routing.pool is not None:
        d.apply.append(routing.pool)
    elif routing.delete:
        d.delete.append((InferencePool, inference_pool_name(name)))
    # Never write over an object that is not ours.
    if obs.foreign:
        d.apply = [o for o in d.apply if o.kind not in obs.foreign]

    silent, recheck = scheduler_silence(obs.server_pods, _parse_time(now) or datetime.now(UTC))
    if recheck is not None:
        d.requeue_after = min(d.requeue_after or recheck, recheck)
    computed = C.with_kstatus(decide_status(plan, obs, cache, artifact, serving, zero, silent))
    if routing.cond is not None:
        computed.append(routing.cond)
    conds = C.merge_conditions(old_status.get("conditions"), computed, generation, now)
    dep_status = (obs.deployment or {}).get("status") or {}
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "artifact": artifact.status,
        **({"compile": plan.shape.status()} if plan.shape is not None else {}),
        "effective": effective,
        "replicas": dep_status.get("replicas") or 0,
        "readyReplicas": dep_status.get("readyReplicas") or 0,
        "selector": ",".join(f"{k}={v}" for k, v in names.server_selector(name).items()),
        "endpoint": plan.endpoint,
        "conditions": conds,
    }
    cache_status = decide_cache_status(model, plan, obs, artifact, serving, now)
    if cache_status is not None:
        status["cache"] = cache_status
    s2z = _scale_to_zero_status(plan, zero, old_status, now)
    if s2z:
        status["scaleToZero"] = s2z
    if serving.key and serving.plan is not None:
        status["servingArtifactKey"] = serving.key
        status["servedSpec"] = served_spec_json(serving.plan.spec)
    d.status = status
    d.events = _events(old_status.get("conditions"), conds)
    return d


def _scale_to_zero_status(
    plan: ModelPlan, zero: ScaleToZeroOutcome, old_status: dict[str, Any], now: str
) -> dict[str, Any]:
    """status.scaleToZero: when KEDA last saw the model in use, and since when it is at zero."""
    if not wants_scale_to_zero(plan):
        return {}
    old = old_status.get("scaleToZero") or {}
    out: dict[str, Any] = {}
    last = zero.last_active or old.get("lastActiveTime")
    if last:
        out["lastActiveTime"] = last
    if plan.spec.replicas == 0:
        out["scaledToZeroSince"] = old.get("scaledToZeroSince") or now
    return out


def _events(
    old: list[dict[str, Any]] | None, new: list[dict[str, Any]]
) -> list[tuple[str, str, str]]:
    """At most one Event per status write, listing every transition users watch.

    Events were the bulk of the operator's API requests (5.4 per model against a baseline of
    9 requests in all; tests/bench/RESULTS.md), and aggregating identical Events the way
    Kubernetes' event recorder does saves nothing here: every transition is distinct. So one
    reconcile's transitions share one Event: a Warning if any transition is one, named after
    the first Warning, else the first transition to True, else the first transition; its
    message lists them all as ``Type=Status Reason: message``.
    """
    shown = []
    for c in C.transitions(old, new):
        if c["type"] not in (
            C.READY, C.ARTIFACT_READY, C.DEGRADED, C.CACHE_VOLUME_READY, C.ROUTING_READY
        ) and not (c["type"] == C.PROGRESSING and c["reason"] in C.WAITING_REASONS):
            continue
        if c["type"] == C.DEGRADED and c["status"] == C.FALSE and not old:
            continue  # "not degraded" on creation is not news
        shown.append(c)
    if not shown:
        return []
    warnings = [c for c in shown if C.event_type(c["reason"]) == "Warning"]
    to_true = [c for c in shown if c["status"] == C.TRUE]
    lead = (warnings or to_true or shown)[0]
    parts, seen = [], set()
    for c in [lead, *[c for c in shown if c is not lead]]:
        text = f"{c['type']}={c['status']} {c['reason']}: {c['message']}"
        if (c["reason"], c["message"]) in seen:  # Ready and ArtifactReady often say the same
            text = f"{c['type']}={c['status']} {c['reason']}"
        seen.add((c["reason"], c["message"]))
        parts.append(text)
    kind = "Warning" if warnings else "Normal"
    return [(kind, lead["reason"], "; ".join(parts)[:1024])]


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
]
