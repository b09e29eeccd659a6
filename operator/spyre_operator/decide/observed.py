"""What every decision reads and returns, and the small helpers they share (pure, no I/O).

:class:`Observed` (the cluster state of one SpyreModel, from the watch caches),
:class:`Policy`, :class:`Decision`, the artifact phases, the states of optional APIs, time
parsing and :func:`served_key` (the artifact a live Deployment serves).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lightkube.resources.batch_v1 import Job
from pydantic import ValidationError

from .. import GROUP
from ..api.v1alpha1 import CacheVolumeSpec, SpyreModelSpec
from ..desired import names
from ..desired.plan import OwnerRef
from ..desired.site import SiteDefaults
from . import jobs
from .canary_report import CanaryReport, ServedReport
from .slots import FREE, Slot

# Artifact phases (status.artifact.phase)
PENDING, COMPILING, READY, FAILED = "Pending", "Compiling", "Ready", "Failed"

#: Setting this annotation to a new value retries a failed compile at once.
RETRY_ANNOTATION = f"{GROUP}/retry-compile"
#: On a SpyreModel, naming the short key of the artifact on its canary: promote it now (the
#: window is not waited for), or abort it (refused as CanaryAborted). A value naming another
#: artifact does nothing, so a GitOps source that keeps it is harmless at the next edit.
CANARY_PROMOTE_ANNOTATION = f"{GROUP}/canary-promote"
CANARY_ABORT_ANNOTATION = f"{GROUP}/canary-abort"

_TIME_FMT = "%Y-%m-%dT%H:%M:%SZ"

# Whether the cluster serves an optional API (a CRD that may be absent), as its watch found.
API_UNKNOWN = "Unknown"  # the watch has not listed yet
API_SERVED = "Served"
API_NOT_SERVED = "NotServed"  # 404: no such resource (the CRD is not installed)
API_FORBIDDEN = "Forbidden"  # 403: the operator's RBAC does not allow it


@dataclass(frozen=True)
class ClaimMeasure:
    """What a GC Job measured on a cache claim's volume: when (its completion), its free space
    (statvfs) and the size of the downloaded models beside the artifacts (None: not reported)."""

    at: str
    free_bytes: int | None = None
    weights_bytes: int | None = None


@dataclass(frozen=True)
class Policy:
    """Tunables of the reconcile policy (the operator reads them from its environment)."""

    #: A failed compile is retried after base * 2**(attempts-1) seconds, at most cap.
    retry_base_seconds: float = 60.0
    retry_cap_seconds: float = 3600.0
    #: A cache claim's artifacts are evaluated for garbage collection at most this often.
    gc_interval_seconds: float = 300.0
    #: Serving pods no scheduler has looked at for this long are reported (SchedulerNotRunning).
    scheduler_silence_seconds: float = 60.0
    #: The cluster-wide defaults of per-site fields and the engine-image allow-list.
    site: SiteDefaults = field(default_factory=SiteDefaults)
    #: The operator's own namespace (POD_NAMESPACE): a model's NetworkPolicy admits it while
    #: the model has a canary (the operator reads the canary pods' counts and every pod's figures).
    operator_namespace: str | None = None

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
    #: spec.serving.canary's Deployment (names.canary_name), if there is one
    canary_deployment: dict[str, Any] | None = None
    #: why a Deployment under the canary's name is not the operator's (no canary is started)
    canary_foreign: str | None = None
    service: dict[str, Any] | None = None
    pdb: dict[str, Any] | None = None
    hpa: dict[str, Any] | None = None
    network_policy: dict[str, Any] | None = None
    #: <model>-output-check (desired/verified.py)
    verified_configmap: dict[str, Any] | None = None
    server_pods: list[dict[str, Any]] = field(default_factory=list)
    #: DRA (accelerator.deviceClassName): the model's ResourceClaimTemplates by name, and
    #: whether its DeviceClass exists (None: not known, or not looked at).
    cards_templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    device_class_found: bool | None = None
    #: A running canary's pods (by name): the count each says it judged, or why it could not
    #: be read (canary_report.py).
    canary_reports: dict[str, CanaryReport | str] = field(default_factory=dict)
    #: While a canary runs, every Ready serving pod's figures since Ready (the canary's and
    #: the baseline's), or why they could not be read (decide/baseline.py).
    served_reports: dict[str, ServedReport | str] = field(default_factory=dict)
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
    #: The cache claim as the newest GC Job on it measured it (the operator mounts no claim);
    #: None when none did.
    claim_measured: ClaimMeasure | None = None
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
    #: Look again this many seconds from now (what no watch reports: a same-named mirror
    #: EndpointSlice of someone else going away).
    recheck_after: float | None = None
    #: The interceptor proxy Service's EndpointSlices (what the mirror copies).
    interceptor_slices: list[dict[str, Any]] = field(default_factory=list)
    #: The cluster-wide precompile budget's answer (control/budgets.py; the controller counts): when
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


def parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    try:
        return datetime.strptime(s, _TIME_FMT).replace(tzinfo=UTC)
    except ValueError:
        return None


def fmt_time(t: datetime) -> str:
    return t.strftime(_TIME_FMT)


def seconds_between(start: str | None, end: str | None) -> float | None:
    a, b = parse_time(start), parse_time(end)
    return (b - a).total_seconds() if a and b else None


def human_size(n: int | None) -> str:
    if n is None:
        return "unknown size"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def job_state(job: dict[str, Any]) -> str:
    if jobs.complete(job):
        return READY
    if jobs.failed(job):
        return FAILED
    return COMPILING


def latest_termination(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    terminated = [p["terminated"] for p in pods if p.get("terminated")]
    if not terminated:
        return None
    return max(terminated, key=lambda t: (t.get("finishedAt") or "", t.get("exitCode") == 0))


def served_key(deployment: dict[str, Any] | None) -> str | None:
    """The artifact key a live Deployment serves."""
    if not deployment:
        return None
    return deployment.get("metadata", {}).get("annotations", {}).get(names.ARTIFACT_KEY_ANNOTATION)


def remembered_serving(
    status: dict[str, Any], key_field: str = "servingArtifactKey", spec_field: str = "servedSpec"
) -> tuple[str | None, SpyreModelSpec | None]:
    """The key and spec status says the Deployment serves (servingArtifactKey, servedSpec), or
    another pair of status fields of that shape (lastGoodArtifactKey, lastGoodServedSpec)."""
    key, spec = status.get(key_field), parse_served_spec(status.get(spec_field))
    if not key or spec is None:
        return None, None
    return str(key), spec


def parse_served_spec(raw: str | None) -> SpyreModelSpec | None:
    """A served spec (``served_spec_json``: an annotation or status field), None if unreadable."""
    if not raw:
        return None
    try:
        return SpyreModelSpec.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None


def served_spec_of(deployment: dict[str, Any]) -> SpyreModelSpec | None:
    return parse_served_spec(
        deployment.get("metadata", {}).get("annotations", {}).get(names.SERVED_SPEC_ANNOTATION)
    )
