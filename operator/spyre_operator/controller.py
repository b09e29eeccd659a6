"""Level-based reconciliation: a de-duplicating work queue over SpyreModel keys.

kopf watches SpyreModels and their children and keeps them in in-memory indices (kopf waits
until every index is populated before any handler runs, so a restarted operator never acts
on a half-filled cache). Any event on a model or a child only *enqueues* the affected
models; workers then recompute everything from the caches (``reconcile.decide``) and apply
the difference. This is the controller-runtime pattern expressed with kopf: edge-triggered
watches, level-based decisions, one in-flight reconcile per model.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2  # lightkube's HTTP client (httpx is a test-only package here)
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Event, PersistentVolumeClaim, Pod
from pydantic import ValidationError

from . import budget as B
from . import conditions as C
from . import jobs as job_status
from . import peers
from .api.v1alpha1 import SpyreModelSpec
from .apply import STATUS_FIELDS_KEY, Applier, comparable_status
from .desired import names
from .desired.plan import plan_model
from .desired.routing import inference_pool_name
from .desired.scaletozero import SLICE_SERVICE_NAME
from .gc import GarbageCollector
from .metrics import Instruments
from .reconcile import (
    API_UNKNOWN,
    DEFAULT_POLICY,
    Decision,
    Observed,
    Policy,
    ScaleToZeroConfig,
    WriteError,
    decide,
    served_key,
    waiting_since,
    write_error_message,
)
from .release import claim_named_by, claims_to_release, mounted_claims, rollout_complete
from .rollout import deployment_rolling

log = logging.getLogger(__name__)

ModelKey = tuple[str, str]  # (namespace, name)

#: Re-check a model that is waiting on something no watched object announces (a pod crash).
NOT_READY_RECHECK_SECONDS = 15.0
ERROR_BACKOFF_BASE = 1.0
ERROR_BACKOFF_MAX = 300.0
#: Longest a single reconcile may take. Each API request has its own timeout, but a request
#: on an HTTP/2 stream can wait past it (seen on the real node: a status PATCH whose answer
#: never came, the model's key then held for good, every later event only marking it dirty).
#: Past this the reconcile is cut off, reported (Reconciling=True ReconcileError) and retried.
RECONCILE_DEADLINE_SECONDS = 120.0
#: Serving pods are listed at most this often per model (see _recent_server_pods).
SERVER_PODS_TTL = 5.0
#: Events posted concurrently in the background.
EVENT_CONCURRENCY = 8
#: While another install writes a model, repeat its OperatorConflict Event this often.
CONFLICT_EVENT_SECONDS = 600.0
#: Warning Event reason: the installed CRD prunes status fields the operator writes.
CRD_OUTDATED = "CRDOutdated"
#: Terminal Jobs whose pods are remembered before the gone ones are forgotten.
JOB_MESSAGES_MIN_LIMIT = 256
#: Default concurrent reconciles: a reconcile mostly waits on the API server, so many cheap
#: coroutines keep throughput up (the benchmark at 500 models; see tests/bench/RESULTS.md).
DEFAULT_WORKERS = 32


class WorkQueue:
    """A set-backed queue: a key is queued at most once and processed by one worker at a time.

    Urgent keys (a new SpyreModel, a Job that just finished) go ahead of routine
    re-reconciles: with hundreds of models the routine ones (status echoes, child status
    updates) otherwise delay the steps users wait for (apply -> Job, Job done -> Deployment).
    """

    URGENT, NORMAL = 0, 1

    def __init__(self, on_wait: Callable[[float], None] | None = None) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, ModelKey]] = asyncio.PriorityQueue()
        self._queued: dict[ModelKey, int] = {}  # key -> priority of its live entry
        #: key -> when it entered the queue (a more urgent re-add keeps the first time)
        self._since: dict[ModelKey, float] = {}
        #: Told how long each key waited, when a worker takes it (the metrics' histogram).
        self.on_wait = on_wait
        self._seq = itertools.count()
        self._active: set[ModelKey] = set()
        self._dirty: dict[ModelKey, int] = {}
        self._timers: dict[ModelKey, asyncio.TimerHandle] = {}

    def add(self, key: ModelKey, urgent: bool = False) -> None:
        """Queue ``key`` now (or again once its current reconcile finishes)."""
        prio = self.URGENT if urgent else self.NORMAL
        if key in self._active:
            self._dirty[key] = min(prio, self._dirty.get(key, prio))
        elif self._queued.get(key, self.NORMAL + 1) > prio:
            self._since.setdefault(key, time.monotonic())
            self._queued[key] = prio  # an earlier, less urgent entry becomes stale
            self._queue.put_nowait((prio, next(self._seq), key))

    def add_after(self, key: ModelKey, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds (an earlier pending timer wins)."""
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: ModelKey) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> ModelKey:
        while True:
            prio, _, key = await self._queue.get()
            if self._queued.get(key) == prio:
                break  # else a stale entry: the key was re-queued more urgently, or taken
        del self._queued[key]
        since = self._since.pop(key, None)
        if since is not None and self.on_wait is not None:
            self.on_wait(time.monotonic() - since)
        self._active.add(key)
        return key

    def done(self, key: ModelKey) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self.add(key, urgent=self._dirty.pop(key) == self.URGENT)

    def __len__(self) -> int:
        return len(self._queued) + len(self._active)


@dataclass
class Caches:
    """Views of kopf's indices (name -> index); each index maps a key to a store of values.

    kopf drops a value only on a DELETED event: after a watch gap its re-list adds and updates
    but never removes what was deleted meanwhile. ``ghosts`` holds the UIDs the operator's own
    re-list (resync.py) found gone while an index still holds them: every read skips them."""

    indices: Mapping[str, Any] = field(default_factory=dict)
    ghosts: frozenset[str] = frozenset()

    def _live(self, value: Any) -> bool:
        return not self.ghosts or uid_of(value) not in self.ghosts

    def one(self, index: str, key: Any) -> Any | None:
        idx = self.indices.get(index)
        if idx is None or key not in idx:
            return None
        for value in idx[key]:
            if self._live(value):
                return value
        return None

    def all(self, index: str, key: Any) -> list[Any]:
        idx = self.indices.get(index)
        if idx is None or key not in idx:
            return []
        return [v for v in idx[key] if self._live(v)]

    def keys(self, index: str) -> list[Any]:
        """The keys of ``index`` with a value that is not a ghost."""
        idx = self.indices.get(index) or {}
        return [k for k in list(idx.keys()) if self.one(index, k) is not None]

    def values(self, index: str) -> dict[Any, Any]:
        """``index`` as a plain mapping of key -> first value, ghosts left out."""
        return {k: v for k in list((self.indices.get(index) or {}).keys())
                if (v := self.one(index, k)) is not None}


def uid_of(value: Any) -> str | None:
    """The UID of an index value: an object's (a dict), or its SpyreModel's (an OwnerRef, a
    ClaimUser)."""
    if isinstance(value, Mapping):
        return (value.get("metadata") or {}).get("uid")
    owner = getattr(value, "owner", value)
    uid = getattr(owner, "uid", None)
    return str(uid) if uid else None


@dataclass
class Stats:
    """Counters exposed on the operator's metrics and used by the benchmark."""

    reconciles: int = 0
    errors: int = 0
    #: times another install was found writing a model this one watches (peers.py)
    conflicts: int = 0
    reconcile_seconds: float = 0.0
    #: reconciles per model namespace: a test confirms its own model was reconciled
    namespace_reconciles: Counter[str] = field(default_factory=Counter)


class RejectedWrites(Exception):
    """Some writes of a reconcile were rejected; status says so, the worker backs off."""


class ReconcileHung(Exception):
    """A reconcile ran past the deadline and was cut off (reported, then retried)."""


class NotLeader(RuntimeError):
    """The leader lease is not held (any more): this replica must not write."""


def unexpected(e: BaseException) -> bool:
    """An error no cluster state explains (a bug, e.g. in observe()), as opposed to the API
    server refusing or failing a request, the connection dropping, or losing the lease."""
    return not isinstance(
        e, ApiError | RejectedWrites | NotLeader | httpx2.HTTPError | OSError | TimeoutError
    )


def foreign_owner(kind: str, live: Mapping[str, Any], model: str) -> str | None:
    """Why ``live`` (a child named after ``model``) is not the operator's, or None if it is.

    Ours: controlled by a SpyreModel of that name (any uid: a model deleted and created again
    adopts what its earlier incarnation left for the garbage collector).
    """
    meta = live.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            if ref.get("kind") == "SpyreModel" and ref.get("name") == model:
                return None
            return (
                f"{kind} {meta.get('name')} exists and is controlled by {ref.get('kind')} "
                f"{ref.get('name')}, not by this SpyreModel: delete it or rename the SpyreModel"
            )
    return (
        f"{kind} {meta.get('name')} exists and is not managed by the operator: delete it "
        "or rename the SpyreModel"
    )


class Controller:
    """Owns the queue, the workers and the per-model reconcile."""

    def __init__(
        self,
        client: AsyncClient,
        caches: Caches,
        workers: int = DEFAULT_WORKERS,
        clock: Callable[[], str] = C.now_rfc3339,
        policy: Policy = DEFAULT_POLICY,
        max_concurrent_compiles: int = B.DEFAULT_MAX_CONCURRENT_COMPILES,
        max_concurrent_rollouts: int = B.DEFAULT_MAX_CONCURRENT_ROLLOUTS,
    ) -> None:
        self.client = client
        #: Cluster-wide budgets (budget.py; 0: unlimited), over every watched namespace.
        self.max_concurrent_compiles = max_concurrent_compiles
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.compile_waiting = B.Waiting()
        self.rollout_waiting = B.Waiting()
        #: Precompile Jobs created (key: namespace, Job name) and Deployments switched to a
        #: new artifact (namespace, Deployment name -> key) that the caches do not show yet.
        self._compile_reserved = B.Reservations()
        self._rollout_reserved = B.Reservations()
        #: Whether the waiting lists were rebuilt from the models' status (after a start or
        #: on becoming leader).
        self._budget_seeded = False
        self.policy = policy
        self.caches = caches
        self.applier = Applier(client)
        #: This controller's /metrics registry: its histograms, and its counters and models
        #: read at scrape time (metrics.py).
        self.instruments = Instruments()
        self.queue = WorkQueue(on_wait=self.instruments.queue_wait.observe)
        self.workers = workers
        self.reconcile_deadline = RECONCILE_DEADLINE_SECONDS
        self.clock = clock
        self.stats = Stats()
        #: API requests by (verb, resource), counted by the client (metrics.counting_client).
        self.requests: Counter[tuple[str, str]] = Counter()
        self._failures: dict[ModelKey, int] = {}
        self._deleted_jobs: dict[str, float] = {}  # uid -> when we deleted it
        self._job_messages: dict[str, list[dict[str, Any]]] = {}  # terminal Job uid -> pods
        #: Running Job uid -> (when read, its pods, its Events): see _observe_precompile.
        self._starting_jobs: dict[str, tuple[float, list[Any], list[Any]]] = {}
        self._job_messages_limit = JOB_MESSAGES_MIN_LIMIT
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()
        #: Events are informational: a few at a time, never ahead of the reconcile's writes.
        self._event_slots = asyncio.Semaphore(EVENT_CONCURRENCY)
        #: key -> (uid, resourceVersion decided from, status written): see _with_written_status.
        self._written_status: dict[ModelKey, tuple[str | None, str | None, dict[str, Any]]] = {}
        self._pruned_reported = False
        self._server_pods: dict[ModelKey, tuple[float, list[dict[str, Any]]]] = {}
        self._claim_sigs: dict[ModelKey, tuple[str, str, str | None]] = {}
        self._pvc_phases: dict[tuple[str, str], str] = {}
        self.started_at = clock()
        #: Artifact GC of the managed cache claims (its own state; reads self.caches).
        self.gc = GarbageCollector(self)
        #: Set while this replica may write (leader election clears it on standby replicas).
        self.active = asyncio.Event()
        self.active.set()
        self.instruments.attach(self)
        #: With leader election: whether the lease is still held (checked before each write,
        #: so a leader that was paused past its lease never writes before it notices).
        self.may_write: Callable[[], bool] = lambda: True
        #: This install (peers.install_id) and replica: every status write is stamped with
        #: them, and a model another install wrote within peer_window is left alone (None: no
        #: stamp and no check, e.g. the unit tests).
        self.install: str | None = None
        self.identity = "spyre-model-operator"
        self.peer_window = 30.0
        #: Models another install writes now, by that install (the metrics' gauge).
        self.yielded: dict[ModelKey, str] = {}
        #: model -> (other install, clock when reported): one Event per model and install per
        #: CONFLICT_EVENT_SECONDS while the conflict goes on.
        self._conflicts_reported: dict[ModelKey, tuple[str, float]] = {}
        #: The InferencePool watch (optional.OptionalApiWatch), set by the kopf layer.
        self.inference_pools: Any | None = None
        #: Scale to zero: the operator's settings and the optional watches of KEDA's
        #: ScaledObjects, the add-on's HTTPScaledObjects and the interceptor's EndpointSlices.
        self.scale_to_zero = ScaleToZeroConfig()
        self.scaled_objects: Any | None = None
        self.http_scaled_objects: Any | None = None
        self.interceptor_slices: Any | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the worker tasks."""
        for i in range(self.workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"reconcile-{i}"))

    async def stop(self) -> None:
        for t in [*self._tasks, *self._pending]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._pending, return_exceptions=True)
        self._tasks.clear()

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            outcome = "ok"
            t0: float | None = None  # t0: when the reconcile itself started
            try:
                await self.active.wait()
                t0 = time.perf_counter()
                await self._reconcile_within_deadline(key)
            except asyncio.CancelledError:
                outcome = ""  # shut down: neither outcome
                raise
            except Exception as e:  # noqa: BLE001 - a worker must survive any single failure
                outcome = "timeout" if isinstance(e, ReconcileHung) else "error"
                if namespace_going_away(e):
                    # The namespace is gone or terminating: its models' deletion events follow;
                    # retrying would only load the API server (it did, after test namespaces).
                    log.info("reconcile %s/%s: namespace is being deleted; not retrying", *key)
                    self._failures.pop(key, None)
                    # It will never compile nor roll: out of both queues, where it would hold
                    # the head for good (a model the caches still show after a watch gap is
                    # woken first and fails again), and the slot its refused Job reserved is
                    # free again: the next ones in line go now.
                    self._stop_waiting(key)
                    self.wake_compile_waiters()
                    self.wake_rollout_waiters()
                    continue
                self.stats.errors += 1
                n = self._failures.get(key, 0) + 1
                self._failures[key] = n
                delay = min(ERROR_BACKOFF_MAX, ERROR_BACKOFF_BASE * 2 ** (n - 1))
                delay *= 0.8 + 0.4 * random.random()
                log.warning(
                    "reconcile %s/%s failed (retry in %.1fs): %s: %s",
                    *key,
                    delay,
                    type(e).__name__,
                    e,
                    exc_info=unexpected(e),
                )
                if unexpected(e):
                    try:
                        async with asyncio.timeout(self.reconcile_deadline):
                            await self._report_failure(key, e)
                    except TimeoutError:
                        log.warning("reporting the failure of %s/%s timed out", *key)
                self.queue.add_after(key, delay)
            else:
                self._failures.pop(key, None)
            finally:
                self.queue.done(key)
                if outcome and t0 is not None:
                    self.instruments.reconcile_duration.labels(outcome).observe(
                        time.perf_counter() - t0)

    async def _reconcile_within_deadline(self, key: ModelKey) -> None:
        try:
            async with asyncio.timeout(self.reconcile_deadline) as deadline:
                await self.reconcile_key(key)
        except TimeoutError:
            if not deadline.expired():
                raise  # an API request's own timeout
            raise ReconcileHung(
                f"the reconcile did not finish in {self.reconcile_deadline:.0f}s (an API "
                "request that never answered) and was cut off"
            ) from None

    async def _report_failure(self, key: ModelKey, error: BaseException) -> None:
        """An unexpected error: Reconciling=True ReconcileError with its message and a Warning
        Event; every other field of status, and every child, stays as it is.

        Best effort: a failure to report is logged, the worker backs off either way.
        """
        model = self.caches.one("models", key)
        if model is None or model["metadata"].get("deletionTimestamp") or not self.may_write():
            return
        model = self._with_written_status(key, model)
        meta, old = model["metadata"], model.get("status") or {}
        message = f"reconcile failed, retrying: {type(error).__name__}: {error}"[:1024]
        cond = C.Cond(C.RECONCILING, C.TRUE, C.RECONCILE_ERROR, message)
        generation = meta.get("generation", 1)
        conds = C.set_condition(old.get("conditions"), cond, generation, self.clock())
        status = {**old, "conditions": conds}
        try:
            rv = await self.applier.apply_status(key[1], key[0], status, old)
            if rv is not None:
                self._remember_status(key, model, status)
                await self.applier.event(dict(model), "Warning", C.RECONCILE_ERROR, message)
        except Exception as e:  # noqa: BLE001 - reporting must not hide the original error
            log.warning("could not report the failure of %s/%s: %s", *key, e)

    def _written_elsewhere(self, key: ModelKey, model: dict[str, Any]) -> bool:
        """Whether another install wrote this model's status within peer_window (peers.py):
        then nothing here writes to it (children, status, GC) until it looks again after the
        window; the conflict is logged, counted and told in a Warning Event on the model."""
        other = peers.foreign_writer(
            model.get("status"), self.install or "", self.clock(), self.peer_window
        )
        if other is None:
            if self.yielded.pop(key, None) is not None:
                log.info("%s/%s: no other install wrote it lately; reconciling it again", *key)
            return False
        self.queue.add_after(key, self.peer_window)
        self.yielded[key] = other.install
        now = time.monotonic()
        last = self._conflicts_reported.get(key)
        if last is not None and last[0] == other.install and now - last[1] < CONFLICT_EVENT_SECONDS:
            return True
        self._conflicts_reported[key] = (other.install, now)
        self.stats.conflicts += 1
        message = peers.conflict_message(other, self.install or "")
        log.warning("%s/%s: %s: %s", *key, peers.CONFLICT_REASON, message)
        if self.may_write():  # an Event is a write: a standby replica leaves it to its leader
            self._background(
                self.applier.event(dict(model), "Warning", peers.CONFLICT_REASON, message)
            )
        return True

    def set_leader(self, leading: bool) -> None:
        """Leader election callback: only the leader writes; a new leader resyncs everything."""
        # Budgets: a new leader rebuilds the waiting lists from the models' status, and counts
        # slots from its own caches (the old leader's reservations are not its own).
        self._budget_seeded = False
        self._compile_reserved.clear()
        self._rollout_reserved.clear()
        if leading:
            self.active.set()
            self.enqueue(self.caches.keys("models"))
        else:
            self.active.clear()
            # Another replica writes now: what this one wrote last is not the newest status.
            self._written_status.clear()

    # ------------------------------------------------------------------ routing

    def enqueue(self, keys: Iterable[ModelKey], urgent: bool = False) -> None:
        for k in keys:
            self.queue.add(k, urgent)

    def models_for_owner_refs(self, namespace: str, body: Mapping[str, Any]) -> list[ModelKey]:
        """SpyreModels named in a child's ownerReferences."""
        refs = body.get("metadata", {}).get("ownerReferences") or []
        return [(namespace, r["name"]) for r in refs if r.get("kind") == "SpyreModel"]

    def models_for_claim(self, namespace: str, claim: str) -> list[ModelKey]:
        """SpyreModels using ``claim`` as their cache."""
        users = self.caches.all("claim_users", (namespace, claim))
        return [(namespace, u.owner.name) for u in users]

    def models_for_model_claim(self, namespace: str, claim: str) -> list[ModelKey]:
        """SpyreModels loading weights from pvc://``claim`` (it appeared, went or changed)."""
        owners = self.caches.all("model_claim_users", (namespace, claim))
        return [(namespace, o.name) for o in owners]

    def models_for_routing_object(self, namespace: str, body: Mapping[str, Any]) -> list[ModelKey]:
        """An InferencePool changed: its owners, or the same-named model (a foreign pool)."""
        keys = self.models_for_owner_refs(namespace, body)
        name = str((body.get("metadata") or {}).get("name") or "")
        return keys or self.models_for_child_name(namespace, name)

    def models_for_child_name(self, namespace: str, name: str) -> list[ModelKey]:
        """SpyreModels one of whose children is named ``name`` (a foreign object of that name
        conflicts with them): by the derived names, not the model's own."""
        return [(namespace, m) for m in self.caches.all("child_names", (namespace, name))]

    def models_wanting_routing(self) -> list[ModelKey]:
        """Models that ask for an InferencePool or still report on one (RoutingReady)."""
        models = self.caches.indices.get("models") or {}
        out = []
        for key in list(models.keys()):
            m = self.caches.one("models", key) or {}
            routing = (m.get("spec") or {}).get("routing") or {}
            conds = (m.get("status") or {}).get("conditions")
            if routing.get("inferencePool") or C.find(conds, C.ROUTING_READY):
                out.append(key)
        return out

    def models_wanting_scale_to_zero(self) -> list[ModelKey]:
        """Models that allow zero replicas (autoscaling.minReplicas 0)."""
        models = self.caches.indices.get("models") or {}
        out = []
        for key in list(models.keys()):
            m = self.caches.one("models", key) or {}
            auto = (m.get("spec") or {}).get("autoscaling") or {}
            if auto.get("minReplicas") == 0:
                out.append(key)
        return out

    def models_for_interceptor_slice(self, body: Mapping[str, Any]) -> list[ModelKey]:
        """An EndpointSlice of the interceptor's namespace changed: if it is the proxy
        Service's, every scale-to-zero model mirrors it."""
        labels = (body.get("metadata") or {}).get("labels") or {}
        if labels.get(SLICE_SERVICE_NAME) != self.scale_to_zero.interceptor_service:
            return []
        return self.models_wanting_scale_to_zero()

    def claim_peers_if_changed(self, key: ModelKey, plan: Any | None) -> list[ModelKey]:
        """Models sharing a cache claim with ``key``, if ``key``'s use of the claim changed.

        Every reconcile writes the shared objects (the cache PVC's and the precompile Job's
        ownerReferences) from the indices, so a new model's own reconcile brings them up to
        date. Only a model that leaves a claim or an artifact key (an edit, a deletion, an
        invalid spec) or changes its volume settings leaves state that just its peers can
        fix. Enqueueing every peer on every event (status writes included) would cost N²
        reconciles for N models on one claim.
        """
        sig = None
        if plan is not None:
            sig = (plan.claim, plan.key, repr(plan.volume) if plan.claim_managed else None)
        old = self._claim_sigs.pop(key, None)
        if sig is not None:
            self._claim_sigs[key] = sig
        if old is None and sig is not None and sig[2] is None:
            # A new cache.claimName user: a PVC the operator made for the others must lose
            # its ownerReferences now (deleting them must not delete a claim it names).
            return sorted(set(self.models_for_claim(key[0], sig[0])) - {key})
        if old is None or old == sig:
            return []
        if sig is None or sig[0] != old[0]:
            # Deleted (or moved): what only it listed on the old claim is an orphan now.
            self.gc.sweep_requested.add((key[0], old[0]))
        peers = set(self.models_for_claim(key[0], old[0]))
        if sig is not None and sig[0] != old[0]:
            peers |= set(self.models_for_claim(key[0], sig[0]))
        peers.discard(key)
        return sorted(peers)

    def models_for_pvc_event(self, namespace: str, claim: str, phase: str | None) -> list[ModelKey]:
        """Models to reconcile for an event on PVC ``claim`` (``phase`` None: deleted).

        All users when the PVC appeared, vanished or changed phase (their CacheVolumeReady
        condition changes); otherwise one user, which re-applies the PVC if it drifted (any
        user builds the same PVC). The PVC's owner list changes with every new user, and
        reconciling every user on each of those events would cost N² reconciles.
        """
        users = self.models_for_claim(namespace, claim)
        k = (namespace, claim)
        old = self._pvc_phases.get(k, "absent")
        if phase is None:
            self._pvc_phases.pop(k, None)
        else:
            self._pvc_phases[k] = phase
        if old != (phase or "absent"):
            return users
        return sorted(users)[:1]

    # ------------------------------------------------------------------ reconcile

    def observe(
        self,
        model: Mapping[str, Any],
        plan_claim: str,
        key: str,
        job_name: str,
        model_claim: str | None,
    ) -> Observed:
        """Gather the observed state of one model from the caches."""
        ns, name = model["metadata"]["namespace"], model["metadata"]["name"]
        job = self.caches.one("jobs", (ns, job_name))
        if job is not None and job["metadata"].get("uid") in self._deleted_jobs:
            job = None  # we deleted it; the watch has not caught up yet
        users = sorted(
            self.caches.all("claim_users", (ns, plan_claim)),
            key=lambda u: (u.created, u.owner.name),
        )
        obs = Observed(
            cache_pvc=self.caches.one("pvcs", (ns, plan_claim)),
            model_pvc_exists=model_claim is None
            or self.caches.one("pvcs", (ns, model_claim)) is not None,
            job=job,
            deployment=self.caches.one("deployments", (ns, names.server_name(name))),
            service=self.caches.one("services", (ns, names.server_name(name))),
            pdb=self.caches.one("pdbs", (ns, names.server_name(name))),
            hpa=self.caches.one("hpas", (ns, names.server_name(name))),
            network_policy=self.caches.one("networkpolicies", (ns, names.server_name(name))),
            job_owners=sorted(
                {o for o in self.caches.all("artifact_users", (ns, plan_claim, key))},
                key=lambda o: (o.name, o.uid),
            ),
            cache_users=[(u.owner, u.volume) for u in users if u.volume is not None],
            claim_name_users=[u.owner for u in users if u.volume is None],
            claim_artifact_bytes=self.gc.claim_artifact_bytes(ns, plan_claim, users),
        )
        self._observe_inference_pool(obs, ns, name)
        self._observe_scale_to_zero(obs, ns, name)
        self._observe_jobs(obs, ns, name, plan_claim, job_name)
        for kind, attr in (
            ("Deployment", "deployment"),
            ("Service", "service"),
            ("PodDisruptionBudget", "pdb"),
            ("HorizontalPodAutoscaler", "hpa"),
            ("NetworkPolicy", "network_policy"),
        ):
            live = getattr(obs, attr)
            why = foreign_owner(kind, live, name) if live is not None else None
            if why:
                obs.foreign[kind] = why
                setattr(obs, attr, None)  # not ours: neither written nor read as ours
        return obs

    def _observe_inference_pool(self, obs: Observed, ns: str, name: str) -> None:
        """The model's InferencePool from the optional watch (no API request)."""
        watch = self.inference_pools
        if watch is None:
            obs.inference_pool_api = API_UNKNOWN
            return
        obs.inference_pool_api, obs.inference_pool_api_message = watch.state, watch.message
        live = watch.get(ns, inference_pool_name(name))
        why = foreign_owner("InferencePool", live, name) if live is not None else None
        if why:
            obs.foreign_inference_pool = why
        else:
            obs.inference_pool = live

    def _observe_scale_to_zero(self, obs: Observed, ns: str, name: str) -> None:
        """KEDA's objects, the engine/cold-start Services and the mirror, from the caches.

        A same-named object that is not the operator's is never read as ours nor written over:
        the model reports it (ScaleToZeroUnavailable) and writes none of them.
        """
        cfg = obs.keda = self.scale_to_zero
        server = names.server_name(name)
        foreign: list[str] = []

        def ours(kind: str, live: dict[str, Any] | None) -> dict[str, Any] | None:
            why = foreign_owner(kind, live, name) if live is not None else None
            if why:
                foreign.append(why)
                return None
            return live

        for watch, state, message, attr, kind in (
            (self.scaled_objects, "scaled_object_api", "scaled_object_api_message",
             "scaled_object", "ScaledObject"),
            (self.http_scaled_objects, "http_scaled_object_api",
             "http_scaled_object_api_message", "http_scaled_object", "HTTPScaledObject"),
        ):  # fmt: skip
            if watch is None:
                continue
            setattr(obs, state, watch.state)
            setattr(obs, message, watch.message)
            setattr(obs, attr, ours(kind, watch.get(ns, server)))
        obs.engine_service = ours(
            "Service", self.caches.one("services", (ns, names.engine_service_name(name)))
        )
        obs.coldstart_service = ours(
            "Service", self.caches.one("services", (ns, names.coldstart_service_name(name)))
        )
        obs.mirror_slice = ours(
            "EndpointSlice", self.caches.one("endpointslices", (ns, names.mirror_slice_name(name)))
        )
        obs.foreign_scale_to_zero = "; ".join(foreign) or None
        if self.interceptor_slices is not None:
            obs.interceptor_slices = [
                body
                for (slice_ns, _), body in self.interceptor_slices.cache.items()
                if slice_ns == cfg.interceptor_namespace
                and ((body.get("metadata") or {}).get("labels") or {}).get(SLICE_SERVICE_NAME)
                == cfg.interceptor_service
            ]

    async def _pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        pods = []
        labels: dict[str, Any] = dict(selector)
        async for p in self.client.list(Pod, namespace=namespace, labels=labels):
            pods.append(compact_pod(p.to_dict()))
        return pods

    async def reconcile_key(self, key: ModelKey) -> Decision | None:
        """Reconcile one SpyreModel from the caches."""
        t0 = time.perf_counter()
        ns, name = key
        model = self.caches.one("models", key)
        if model is None or model["metadata"].get("deletionTimestamp"):
            self._written_status.pop(key, None)
            self._server_pods.pop(key, None)
            self.yielded.pop(key, None)
            self._conflicts_reported.pop(key, None)
            self._stop_waiting(key)
            return None  # deleted: ownerReferences let the garbage collector clean up
        if self.install is not None and self._written_elsewhere(key, model):
            return None
        model = self._with_written_status(key, model)
        try:
            spec = SpyreModelSpec.model_validate(model.get("spec") or {})
        except ValidationError:  # invalid spec: decide() reports it, writes no child
            obs, plan = Observed(), None
        else:
            # Anything else that fails here is a bug: it propagates, so nothing is decided
            # from a partial observation (the worker reports it and backs off).
            plan = plan_model(name, ns, model["metadata"].get("uid", ""), spec, self.policy.site)
            obs = self.observe(model, plan.claim, plan.key, plan.job_name, plan.model_claim)
        if plan is not None and obs.job is not None:
            await self._observe_precompile(key, obs)
        short = False  # replicas missing: their pods explain why, and may change unwatched
        if plan is not None and obs.deployment is not None:
            st = obs.deployment.get("status") or {}
            wanted = plan.spec.replicas
            if (st.get("replicas") or 0) > 0 and (st.get("availableReplicas") or 0) < wanted:
                short = True
                obs.server_pods = await self._recent_server_pods(key)
        if plan is not None and plan.claim_managed:
            obs.collected = await self.gc.collected(ns, plan.claim)
        if plan is not None:  # no await from here to the reservation: slots are counted once
            self._observe_budgets(key, model, plan, obs)
        decision = decide(model, obs, self.clock(), self.policy)
        self._track_budgets(key, plan, obs, decision)
        await self.execute(model, obs, decision)
        if plan is not None:
            await self.release_claims(plan, obs.deployment)
        if plan is not None and plan.claim_managed:
            await self.collect_garbage(key, plan)
        if decision.requeue_after is not None:
            self.queue.add_after(key, decision.requeue_after)
        self.stats.reconciles += 1
        self.stats.namespace_reconciles[ns] += 1
        self.stats.reconcile_seconds += time.perf_counter() - t0
        ready = C.find(decision.status.get("conditions"), C.READY)
        waiting = any(p.get("phase") == "Pending" for p in obs.server_pods)
        if short or (obs.server_pods and (waiting or (ready and ready.get("status") != C.TRUE))):
            # Nothing else wakes us: a crash loop or a pod waiting for a node (the scheduler
            # writes only the pod, which is not watched). Also while replicas are missing even
            # if the pod list (cached SERVER_PODS_TTL) did not show the new pod yet: a scale-up
            # right after a listing otherwise never looked again (InsufficientCapacity stayed
            # unreported in a loaded run).
            self.queue.add_after(key, NOT_READY_RECHECK_SECONDS)
        return decision

    # ------------------------------------------------------------------ budgets

    def _seed_waiting(self) -> None:
        """Rebuild who waits for a slot, in order, from the models' status (the watch cache
        is complete before any reconcile): a restarted operator or a new leader keeps the
        order of the models that waited before it."""
        self._budget_seeded = True
        self.compile_waiting.clear()
        self.rollout_waiting.clear()
        models = self.caches.indices.get("models") or {}
        for key in list(models.keys()):
            st = (self.caches.one("models", key) or {}).get("status") or {}
            conds = st.get("conditions")
            art = st.get("artifact") or {}
            ready = C.find(conds, C.ARTIFACT_READY) or {}
            if ready.get("reason") == C.WAITING_FOR_COMPILE_SLOT and art.get("waitingSince"):
                self.compile_waiting.add(key, str(art["waitingSince"]))
            progressing = C.find(conds, C.PROGRESSING) or {}
            if progressing.get("reason") == C.WAITING_FOR_ROLLOUT_SLOT:
                self.rollout_waiting.add(key, str(art.get("completedAt") or ""))

    def compiles_in_use(self) -> int:
        """Precompile Jobs of this operator that have not finished, in every watched namespace
        (from the Job cache; a Job shared by several models is one), plus the ones just created
        that the cache does not show yet."""
        running: set[tuple[str, str]] = set()
        seen: set[tuple[str, str]] = set()  # Jobs in the cache that are not deleted ones
        index = self.caches.indices.get("jobs") or {}
        for k in list(index.keys()):
            job = self.caches.one("jobs", k)
            if job is None:
                continue
            meta = job.get("metadata") or {}
            if meta.get("uid") in self._deleted_jobs:
                continue  # e.g. a failed Job removed for its retry, under the same name
            seen.add(k)
            labels = meta.get("labels") or {}
            if (
                labels.get(names.COMPONENT) == names.COMPONENT_PRECOMPILE
                and not job_status.finished(job)
            ):
                running.add(k)
        for k in self._compile_reserved.live():
            if k in seen:
                self._compile_reserved.drop(*k)  # the cache shows the new Job now
            else:
                running.add(k)
        return len(running)

    def rollouts_in_use(self, exclude: tuple[str, str] | None = None) -> int:
        """Serving Deployments of this operator whose rollout is not complete (pods of an
        older template left, or fewer available than asked) and has not exceeded its progress
        deadline, plus the ones just switched that the cache does not show yet."""
        rolling: set[tuple[str, str]] = set()
        index = self.caches.indices.get("deployments") or {}
        reserved = self._rollout_reserved.live()
        for k in list(index.keys()):
            dep = self.caches.one("deployments", k)
            if dep is None:
                continue
            labels = (dep.get("metadata") or {}).get("labels") or {}
            if labels.get(names.MANAGED_BY) != names.MANAGED_BY_VALUE:
                continue
            if k in reserved and served_key(dep) == reserved[k]:
                self._rollout_reserved.drop(*k)  # the cache shows the switch now
                reserved.pop(k)
            if deployment_rolling(dep):
                rolling.add(k)
        rolling |= set(reserved)
        rolling.discard(exclude)  # type: ignore[arg-type]
        return len(rolling)

    def _observe_budgets(
        self, key: ModelKey, model: Mapping[str, Any], plan: Any, obs: Observed
    ) -> None:
        """The budgets' answers for this model (Observed.compile_slot, rollout_slot): asked
        only when it may need a slot (no Job of its own yet; a Deployment serving another
        artifact or claim)."""
        if not self._budget_seeded:
            self._seed_waiting()
        ns = key[0]
        now = self.clock()
        if (
            self.max_concurrent_compiles > 0
            and obs.job is None
            and self._compile_reserved.get(ns, plan.job_name) is None  # a sharer just made it
        ):
            obs.compile_slot = B.slot(
                self.max_concurrent_compiles,
                self.compiles_in_use(),
                self.compile_waiting,
                key,
                waiting_since(dict(model), plan, now),
            )
        dep = obs.deployment
        if (
            self.max_concurrent_rollouts > 0
            and dep is not None
            and (served_key(dep) != plan.key or plan.claim not in mounted_claims(dep))
        ):
            own = (ns, names.server_name(key[1]))
            if deployment_rolling(dep):
                return  # already rolling: it holds its slot, switching it adds no rollout
            # Order: when the new artifact was compiled (status, else its Job's completion).
            artifact = (model.get("status") or {}).get("artifact") or {}
            done = artifact.get("completedAt") if artifact.get("key") == plan.key else None
            obs.rollout_slot = B.slot(
                self.max_concurrent_rollouts,
                self.rollouts_in_use(exclude=own),
                self.rollout_waiting,
                key,
                str(done or job_status.finished_at(obs.job) or now),
            )

    def _track_budgets(
        self, key: ModelKey, plan: Any, obs: Observed, d: Decision
    ) -> None:
        """After decide(): hold the slot a new Job or a switch takes until the caches show it,
        and keep the waiting lists; a model that stops waiting lets the next ones go."""
        ns = key[0]
        conds = d.status.get("conditions")
        artifact = d.status.get("artifact") or {}
        if d.job is not None and obs.job is None and d.job.metadata is not None:
            self._compile_reserved.hold(ns, str(d.job.metadata.name))
        if (C.find(conds, C.ARTIFACT_READY) or {}).get("reason") == C.WAITING_FOR_COMPILE_SLOT:
            self.compile_waiting.add(key, str(artifact.get("waitingSince") or ""))
        elif self.compile_waiting.discard(key):
            self.wake_compile_waiters()
        switched = next(
            (o for o in d.apply if o.kind == "Deployment" and o.metadata is not None), None
        )
        if switched is not None and obs.deployment is not None and plan is not None:
            new_key = served_key({"metadata": switched.metadata.to_dict()})
            if new_key and new_key != served_key(obs.deployment):
                self._rollout_reserved.hold(ns, names.server_name(key[1]), new_key)
        if (C.find(conds, C.PROGRESSING) or {}).get("reason") == C.WAITING_FOR_ROLLOUT_SLOT:
            self.rollout_waiting.add(key, str(artifact.get("completedAt") or ""))
        elif self.rollout_waiting.discard(key):
            self.wake_rollout_waiters()

    def _stop_waiting(self, key: ModelKey) -> None:
        """A deleted model leaves both waiting lists (the next ones may go)."""
        if self.compile_waiting.discard(key):
            self.wake_compile_waiters()
        if self.rollout_waiting.discard(key):
            self.wake_rollout_waiters()

    def wake_compile_waiters(self) -> None:
        """A precompile slot may have freed (a Job finished or went, a waiting model left):
        reconcile as many of the longest-waiting models as there are free slots."""
        if not self.compile_waiting:
            return
        free = self.max_concurrent_compiles - self.compiles_in_use()
        self.enqueue(self.compile_waiting.first(free))

    def wake_rollout_waiters(self) -> None:
        """Same for the rollout budget (a rollout completed, a Deployment went)."""
        if not self.rollout_waiting:
            return
        free = self.max_concurrent_rollouts - self.rollouts_in_use()
        self.enqueue(self.rollout_waiting.first(free))

    # ------------------------------------------------------------------ claims left behind

    async def release_claims(self, plan: Any, deployment: dict[str, Any] | None) -> None:
        """Release the managed cache PVCs the model owns but no longer names (release.py):
        drop its ownerReference, or delete the PVC once no SpyreModel owns or names it; only
        when no pod of the operator may read from it."""
        ns, uid = plan.namespace, plan.uid
        pvc_index = self.caches.indices.get("pvcs") or {}
        owned = [
            pvc
            for k in list(pvc_index.keys())
            if k[0] == ns
            and k[1] != plan.claim
            and (pvc := self.caches.one("pvcs", k)) is not None
            and any(r.get("uid") == uid for r in pvc["metadata"].get("ownerReferences") or [])
        ]
        if not owned or not rollout_complete(deployment) or not self.may_write():
            return
        users = self.caches.indices.get("claim_users") or {}
        named = {k[1] for k in list(users.keys()) if k[0] == ns and self.caches.all(
            "claim_users", k)}
        # every model's spec as written, valid or not: a spec the API models refuse now still
        # names its claim (it is no claim user above), which must outlive the Delete users
        named |= {c for k in self.caches.keys("models") if k[0] == ns and (c := claim_named_by(
            (self.caches.one("models", k) or {}).get("spec")))}
        mounted = mounted_claims(deployment)
        for r in claims_to_release(
            uid, plan.claim, owned, mounted, self._claims_in_use(ns), named
        ):
            if r.keep is None:
                log.info("PVC %s/%s: no SpyreModel names it (retainPolicy Delete)", ns, r.name)
                await self.applier.delete(PersistentVolumeClaim, r.name, ns)
            else:
                await self.applier.release_owner(r.pvc, r.keep, plan.name)

    def _claims_in_use(self, ns: str) -> set[str]:
        """Claims a pod of the operator may read or write: those every Deployment of the
        namespace mounts, and those an unfinished Job (precompile or GC) writes to."""
        in_use: set[str] = set()
        for k in list((self.caches.indices.get("deployments") or {}).keys()):
            if k[0] == ns:
                in_use |= mounted_claims(self.caches.one("deployments", k))
        for k in list((self.caches.indices.get("claim_jobs") or {}).keys()):
            jobs = self.caches.all("claim_jobs", k) if k[0] == ns else []
            if any(not job_status.finished(j) for j in jobs):
                in_use.add(k[1])
        return in_use

    # ------------------------------------------------------------------ garbage collection

    async def collect_garbage(self, key: ModelKey, plan: Any) -> None:
        """Artifact GC of the model's claim: see gc.GarbageCollector.collect."""
        await self.gc.collect(key, plan)

    async def _recent_server_pods(self, key: ModelKey) -> list[dict[str, Any]]:
        """The model's serving pods, listed at most every SERVER_PODS_TTL seconds.

        Only needed to explain a rollout that does not become available (crash loops, engine
        exits); while hundreds of Deployments roll out, listing on every Deployment event
        made a LIST per reconcile.
        """
        now = time.monotonic()
        cached = self._server_pods.get(key)
        if cached is not None and now - cached[0] < SERVER_PODS_TTL:
            return cached[1]
        pods = await self._pods(key[0], names.server_selector(key[1]))
        self._server_pods[key] = (now, pods)
        return pods

    def _report_pruned(self, model: Mapping[str, Any]) -> None:
        """The API server dropped status fields this write sent: the installed CRD is older
        than the operator, and what those fields record (the served spec, the waiting order,
        the install stamp) is lost at every write. Said once per process: an error in the log
        and a Warning Event on the model (then spyre_operator_status_fields_pruned)."""
        last = getattr(self.applier, "last_pruned", None)
        if not last or self._pruned_reported:
            return
        self._pruned_reported = True
        ns, name, lost = last
        message = (
            f"the API server dropped status fields the operator wrote ({', '.join(lost[:8])}): "
            "the installed SpyreModel CRD is older than this operator. Apply the CRD of this "
            "release (crds/serving.spyre.dev_spyremodels.yaml; helm upgrade does not update "
            "CRDs): until then rollbacks, budget order and install conflicts are unreliable"
        )
        log.error("%s/%s: %s", ns, name, message)
        self._background(self.applier.event(dict(model), "Warning", CRD_OUTDATED, message))

    def _with_written_status(self, key: ModelKey, model: dict[str, Any]) -> dict[str, Any]:
        """``model`` with the status this operator last wrote, if the cache has not caught up.

        Until the watch delivers our last write, that write is the newest status: deciding
        from the older cached status would rewrite the same status and post its transition
        Events a second time (it did under load, with concurrent reconciles). The cache has
        caught up once it holds any other version of the model than the one that write was
        decided from: from then on the live status is compared, so a status field another
        field manager changed is written back (it was not while the operator compared with
        its own last write).
        """
        meta = model["metadata"]
        written = self._written_status.get(key)
        if written is None:
            return model
        uid, decided_from, status = written
        if uid != meta.get("uid") or meta.get("resourceVersion") != decided_from:
            del self._written_status[key]
            return model
        return {**model, "status": status}

    def _remember_status(
        self, key: ModelKey, model: Mapping[str, Any], status: dict[str, Any]
    ) -> None:
        """Decide from ``status`` until the cache holds a newer version than ``model``."""
        meta = model["metadata"]
        self._written_status[key] = (meta.get("uid"), meta.get("resourceVersion"), status)

    def _observe_jobs(
        self, obs: Observed, ns: str, name: str, claim: str, job_name: str
    ) -> None:
        """The precompile Jobs the model owns besides its own, and which of them some model
        needs; the artifacts the claim's other users recorded (a Job is removed after a
        while: what one of them compiled on this claim is not compiled again)."""
        for job in self.caches.all("owned_jobs", (ns, name)):
            meta = job.get("metadata") or {}
            if meta.get("uid") in self._deleted_jobs or meta.get("name") == job_name:
                continue
            obs.owned_jobs.append(job)
            job_claim = (meta.get("labels") or {}).get(names.CLAIM_LABEL)
            job_key = (meta.get("annotations") or {}).get(names.ARTIFACT_KEY_ANNOTATION)
            if self.caches.all("artifact_users", (ns, job_claim, job_key)):
                obs.needed_jobs.add((str(job_claim), str(job_key)))
        for user in self.caches.all("claim_users", (ns, claim)):
            if user.owner.name == name:
                continue
            m = self.caches.one("models", (ns, user.owner.name)) or {}
            for a in ((m.get("status") or {}).get("cache") or {}).get("artifacts") or []:
                if a.get("claim") == claim:
                    obs.claim_artifacts.append(a)

    async def _observe_precompile(self, key: ModelKey, obs: Observed) -> None:
        """The precompile Job's pods: a finished Job's termination messages (read once), and
        while the Job runs but none of its pods does, what holds it up (unschedulable, image,
        Secret; with no pod at all its FailedCreate Events). The scheduler and the kubelet
        write only the pod, which is not watched: look again every NOT_READY_RECHECK_SECONDS
        until it runs (a Job whose pod is ready makes progress; it is not read)."""
        job = obs.job
        if job is None:
            return
        if job_status.finished(job):
            obs.job_pods = await self._job_pods(key[0], job)
            return
        if ((job.get("status") or {}).get("ready") or 0) > 0:
            return
        now = time.monotonic()
        for uid, (t, _, _) in list(self._starting_jobs.items()):
            if now - t >= SERVER_PODS_TTL:
                del self._starting_jobs[uid]  # bounded: only reads of the last seconds stay
        uid = job["metadata"]["uid"]
        if uid not in self._starting_jobs:
            pods = await self._pods(key[0], {"batch.kubernetes.io/controller-uid": uid})
            live = [p for p in pods if not p.get("terminated")]
            events = [] if live else await self._job_events(key[0], uid)
            self._starting_jobs[uid] = (now, pods, events)
        _, obs.job_pods, obs.job_events = self._starting_jobs[uid]
        self.queue.add_after(key, NOT_READY_RECHECK_SECONDS)

    async def _job_events(self, ns: str, uid: str) -> list[dict[str, Any]]:
        """Warning Events of a Job (the Job controller's FailedCreate when a pod is refused)."""
        out = []
        try:
            async for e in self.client.list(
                Event, namespace=ns, fields={"involvedObject.uid": uid, "type": "Warning"}
            ):
                d = e.to_dict()
                out.append({k: d.get(k) for k in ("reason", "message", "lastTimestamp")})
        except ApiError as err:
            if err.status.code != 403:
                raise
            log.warning("cannot list Events in %s (grant list on events): %s", ns, err)
        return out

    async def _job_pods(self, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Pods of a finished Job (read once per Job: their termination messages)."""
        uid = job["metadata"]["uid"]
        if not job_status.finished(job):
            return []
        if uid not in self._job_messages:
            pods = await self._pods(ns, {"batch.kubernetes.io/controller-uid": uid})
            self._forget_gone_job_messages()
            self._job_messages[uid] = pods
        return self._job_messages[uid]

    def _forget_gone_job_messages(self) -> None:
        """Bound ``_job_messages``: drop the Jobs that are gone (TTL, deleted, superseded);
        a uid is never seen again. Checked when the map doubled, so amortised O(1)."""
        if len(self._job_messages) < self._job_messages_limit:
            return
        live = {j["metadata"].get("uid") for j in self.caches.values("jobs").values()}
        for uid in [u for u in self._job_messages if u not in live]:
            del self._job_messages[uid]
        self._job_messages_limit = max(JOB_MESSAGES_MIN_LIMIT, 2 * len(self._job_messages))

    async def execute(self, model: Mapping[str, Any], obs: Observed, d: Decision) -> None:
        """Hand a decision to the apply layer; rejected writes end up in status.

        A write the API server rejects (invalid, forbidden, over quota) or a same-named object
        that is not ours is folded back into the decision, so the status and an Event say what
        happened, with the server's message; then the worker backs off and tries again.
        """
        ns = model["metadata"]["namespace"]
        name = model["metadata"]["name"]
        live_by_kind = {
            "PersistentVolumeClaim": obs.cache_pvc,
            "Deployment": obs.deployment,
            "Service": obs.service,
            "PodDisruptionBudget": obs.pdb,
            "NetworkPolicy": obs.network_policy,
            "HorizontalPodAutoscaler": obs.hpa,
            "InferencePool": obs.inference_pool,
            "HTTPScaledObject": obs.http_scaled_object,
            "ScaledObject": obs.scaled_object,
            "EndpointSlice": obs.mirror_slice,
        }
        # Services other than the model's own (scale to zero), by name.
        other_services = {
            names.engine_service_name(name): obs.engine_service,
            names.coldstart_service_name(name): obs.coldstart_service,
        }
        if not self.may_write():
            raise NotLeader("leader lease not held; not writing")
        for resource, obj_name in d.delete:
            live = None
            if resource.__name__ == "Job":  # the spec's Job, or one an earlier spec left
                live = next(
                    (
                        j
                        for j in [obs.job, *obs.owned_jobs]
                        if j is not None and j["metadata"].get("name") == obj_name
                    ),
                    None,
                )
            if live is not None:
                self._deleted_jobs[live["metadata"]["uid"]] = time.monotonic()
            await self.applier.delete(resource, obj_name, ns)
        # The children do not depend on each other: write them concurrently, so a reconcile
        # costs one API round trip rather than one per child (the benchmark is bound by
        # round trips, not CPU). The Job goes first: it is the slow path (the compile).
        # Same-named children that are not ours were found in observe() (obs.foreign); decide()
        # writes none of them.
        targets: list[tuple[str, str]] = []
        writes: list[Coroutine[Any, Any, Any]] = []
        if d.job is not None:
            targets.append(("Job", str(d.job.metadata.name if d.job.metadata else "")))
            writes.append(self._ensure_job(ns, name, d.job, obs.job))
        for obj in d.apply:
            targets.append((obj.kind, obj.metadata.name))
            live = live_by_kind.get(obj.kind)
            if obj.kind == "Service" and obj.metadata.name in other_services:
                live = other_services[obj.metadata.name]
            writes.append(self.applier.apply(obj, live))
        results = await asyncio.gather(*writes, return_exceptions=True)
        for (kind, obj_name), r in zip(targets, results, strict=True):
            if isinstance(r, ApiError) and _rejected(r):
                if kind == "Job":  # not created: the slot it held is free again
                    self._compile_reserved.drop(ns, obj_name)
                obs.write_errors.append(
                    WriteError(kind, obj_name, r.status.code or 0, r.status.message or str(r))
                )
            elif isinstance(r, BaseException):
                raise r
        if obs.write_errors and all(_terminating(e.message) for e in obs.write_errors):
            raise RejectedWrites(write_error_message(obs.write_errors) or "")  # nothing to tell
        if obs.foreign or obs.write_errors:
            again = decide(dict(model), obs, self.clock(), self.policy)
            d.status, d.events = again.status, again.events
        if not self.may_write():
            raise NotLeader("leader lease not held; not writing")
        if self.install is not None:
            d.status = peers.stamped(
                d.status, model.get("status"), self.install, self.identity, self.clock()
            )
        current = comparable_status(model.get("status"), d.status, model.get(STATUS_FIELDS_KEY))
        rv = await self.applier.apply_status(name, ns, d.status, current)
        if rv is not None:
            self._remember_status((ns, name), model, d.status)
            self._report_pruned(model)
            for type_, reason, message in d.events:
                self._background(self.applier.event(dict(model), type_, reason, message))
        self._expire_deleted_jobs()
        if obs.write_errors:
            raise RejectedWrites(write_error_message(obs.write_errors) or "")

    async def _ensure_job(
        self, ns: str, name: str, job: Any | None, live: dict[str, Any] | None
    ) -> None:
        if job is None:
            return
        try:
            await self.applier.ensure_job(job, live)
        except ApiError as e:
            # 409: the watch will bring the new version. 422 "field is immutable" on a Job
            # the cache did not show: a model sharing the key created it an instant ago from
            # its own pod template; the next reconcile sees it and only adds this owner.
            created_by_sharer = (live is None and e.status.code == 422
                                 and "field is immutable" in (e.status.message or ""))
            if e.status.code != 409 and not created_by_sharer:
                raise
            self.queue.add_after((ns, name), 1.0)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a best-effort write (an Event) without holding up the worker."""
        task = asyncio.create_task(self._bounded(coro))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _bounded(self, coro: Coroutine[Any, Any, None]) -> None:
        async with self._event_slots:
            await coro

    def _expire_deleted_jobs(self) -> None:
        cutoff = time.monotonic() - 600
        for uid, when in list(self._deleted_jobs.items()):
            if when < cutoff:
                del self._deleted_jobs[uid]


def _rejected(e: ApiError) -> bool:
    """A client error the API server will repeat until something changes (not a race)."""
    code = e.status.code or 0
    return 400 <= code < 500 and code not in (404, 409, 429)


def _terminating(message: str) -> bool:
    return "because it is being terminated" in message


def namespace_going_away(e: BaseException) -> bool:
    """An error that only says the model's namespace is being (or was) deleted."""
    if isinstance(e, RejectedWrites):
        return _terminating(str(e))
    if not isinstance(e, ApiError):
        return False
    details = e.status.details
    gone = e.status.code == 404 and details is not None and details.kind == "namespaces"
    return gone or (e.status.code == 403 and _terminating(e.status.message or ""))


def compact_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The few fields of a pod the reconcile reads (termination messages, crash loops)."""
    meta = pod.get("metadata", {})
    labels = meta.get("labels") or {}
    out: dict[str, Any] = {
        "name": meta.get("name"),
        "phase": (pod.get("status") or {}).get("phase"),
        "artifact": labels.get(names.ARTIFACT_LABEL),
    }
    reason = (pod.get("status") or {}).get("reason")
    if reason:  # set when the kubelet ended the pod itself (Evicted, NodeShutdown, ...)
        out["reason"] = reason
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        last = cs.get("lastState") or {}
        # The last termination explains a container that is down now (restarting, crash
        # looping); once it runs and is ready again, an old OOM kill is history, not a failure.
        term = state.get("terminated") or (
            last.get("terminated") if not cs.get("ready") and not state.get("running") else None
        )
        if term:
            out["terminated"] = {
                "exitCode": term.get("exitCode"),
                "reason": term.get("reason"),
                "message": term.get("message"),
                "finishedAt": term.get("finishedAt"),
            }
        waiting = (state.get("waiting") or {}).get("reason")
        if waiting:
            out["waiting"] = waiting
            message = (state.get("waiting") or {}).get("message")
            if message:  # the kubelet's: which image, which Secret or ConfigMap
                out["waitingMessage"] = str(message)[:512]
        out["ready"] = bool(cs.get("ready"))
    conds = (pod.get("status") or {}).get("conditions") or []
    for c in conds:
        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
            out["unschedulable"] = c.get("message") or "no node fits"
    spec = pod.get("spec") or {}
    if not spec.get("nodeName") and not any(c.get("type") == "PodScheduled" for c in conds):
        # No scheduler has looked at it yet (each writes PodScheduled when it tries).
        out["unscheduledSince"] = meta.get("creationTimestamp")
        out["scheduler"] = spec.get("schedulerName") or "default-scheduler"
    return out
