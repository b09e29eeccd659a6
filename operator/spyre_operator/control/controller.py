"""Level-based reconciliation: a de-duplicating work queue over SpyreModel keys.

kopf watches SpyreModels and their children and keeps them in in-memory indices (kopf waits
until every index is populated before any handler runs, so a restarted operator never acts
on a half-filled cache). Any event on a model or a child only *enqueues* the affected
models; workers then recompute everything from the caches (``decide.decide``) and apply
the difference. This is the controller-runtime pattern expressed with kopf: edge-triggered
watches, level-based decisions, one in-flight reconcile per model.

The Controller owns the shared infrastructure (client, caches, apply layer, queue, clock) and
the workers, and runs the reconcile of one model; the jobs of a reconcile are collaborators
with names and their own state (control/): ``router`` (which models an event concerns),
``observer`` (the observed state; ``devices``: a model's DRA claims), ``budgets`` (compile
and rollout slots), ``writer`` (the writes of a decision), ``status`` (failures, install
conflicts, the status last written),
``claims`` (claims left behind) and ``gc`` (the artifact GC, control/gc.py, deciding with
decide/gc.py). This module re-exports
what importers take from here.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from lightkube import AsyncClient
from pydantic import ValidationError

from ..api.v1alpha1 import SpyreModelSpec
from ..decide import (
    DEFAULT_POLICY,
    Decision,
    Observed,
    Policy,
    ScaleToZeroConfig,
    decide,
    pods_missing,
)
from ..decide import conditions as C
from ..desired.plan import plan_model
from ..kube.apply import Applier
from ..runtime.metrics import Instruments
from . import budgets as B
from .budgets import Budgets
from .claims import ClaimReleaser
from .common import (
    CONFLICT_EVENT_SECONDS,
    CRD_OUTDATED,
    DEFAULT_WORKERS,
    ERROR_BACKOFF_BASE,
    ERROR_BACKOFF_MAX,
    EVENT_CONCURRENCY,
    JOB_MESSAGES_MIN_LIMIT,
    NOT_READY_RECHECK_SECONDS,
    RECONCILE_DEADLINE_SECONDS,
    SERVER_PODS_TTL,
    Caches,
    ModelKey,
    NotLeader,
    OwnerGone,
    ReconcileHung,
    RejectedWrites,
    Stats,
    compact_pod,
    foreign_owner,
    is_rejected_write,
    namespace_going_away,
    says_terminating,
    uid_of,
    unexpected,
)
from .devices import DeviceObserver
from .event_routing import Router
from .execute import Writer
from .gc import GarbageCollector
from .observe import Observer
from .queue import WorkQueue
from .status import StatusReporter

__all__ = [
    "CONFLICT_EVENT_SECONDS",
    "CRD_OUTDATED",
    "DEFAULT_WORKERS",
    "ERROR_BACKOFF_BASE",
    "ERROR_BACKOFF_MAX",
    "EVENT_CONCURRENCY",
    "JOB_MESSAGES_MIN_LIMIT",
    "NOT_READY_RECHECK_SECONDS",
    "RECONCILE_DEADLINE_SECONDS",
    "SERVER_PODS_TTL",
    "Caches",
    "Controller",
    "ModelKey",
    "NotLeader",
    "ReconcileHung",
    "RejectedWrites",
    "Stats",
    "WorkQueue",
    "is_rejected_write",
    "says_terminating",
    "compact_pod",
    "foreign_owner",
    "namespace_going_away",
    "uid_of",
    "unexpected",
]

log = logging.getLogger(__name__)


class Controller:
    """Owns the queue, the workers and the per-model reconcile; its collaborators do the rest."""

    def __init__(
        self,
        client: AsyncClient,
        caches: Caches,
        workers: int = DEFAULT_WORKERS,
        clock: Callable[[], str] = C.now_rfc3339,
        policy: Policy = DEFAULT_POLICY,
        max_concurrent_compiles: int = B.DEFAULT_MAX_CONCURRENT_COMPILES,
        max_concurrent_rollouts: int = B.DEFAULT_MAX_CONCURRENT_ROLLOUTS,
        compiles_per_namespace: int = 0,
        rollouts_per_namespace: int = 0,
    ) -> None:
        self.client = client
        self.policy = policy
        self.caches = caches
        self.applier = Applier(client)
        #: This controller's /metrics registry: its histograms, and its counters and models
        #: read at scrape time (runtime/metrics.py).
        self.instruments = Instruments()
        self.queue = WorkQueue(on_wait=self.instruments.queue_wait.observe)
        self.workers = workers
        self.reconcile_deadline = RECONCILE_DEADLINE_SECONDS
        self.clock = clock
        self.stats = Stats()
        #: API requests by (verb, resource), counted by the client (metrics.counting_client).
        self.requests: Counter[tuple[str, str]] = Counter()
        self._failures: dict[ModelKey, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.started_at = clock()
        #: Set while this replica may write (leader election clears it on standby replicas).
        self.active = asyncio.Event()
        self.active.set()
        #: With leader election: whether the lease is still held (checked before each write,
        #: so a leader that was paused past its lease never writes before it notices).
        self.may_write: Callable[[], bool] = lambda: True
        #: This install (peers.install_id) and replica: every status write is stamped with
        #: them, and a model another install wrote within peer_window is left alone (None: no
        #: stamp and no check, e.g. the unit tests).
        self.install: str | None = None
        self.identity = "spyre-model-operator"
        self.peer_window = 30.0
        #: The InferencePool watch (optional.OptionalApiWatch), set by the kopf layer.
        self.inference_pools: Any | None = None
        #: Scale to zero: the operator's settings and the optional watches of KEDA's
        #: ScaledObjects, the add-on's HTTPScaledObjects and the interceptor's EndpointSlices.
        self.scale_to_zero = ScaleToZeroConfig()
        self.scaled_objects: Any | None = None
        self.http_scaled_objects: Any | None = None
        self.interceptor_slices: Any | None = None
        # The collaborators (control/): each keeps its own state and reaches the
        # others through this controller.
        self.writer = Writer(self)
        self.status = StatusReporter(self)
        self.budgets = Budgets(self, max_concurrent_compiles, max_concurrent_rollouts,
                               compiles_per_namespace, rollouts_per_namespace)
        self.observer = Observer(self)
        self.devices = DeviceObserver(self)
        self.router = Router(self)
        self.claims = ClaimReleaser(self)
        #: Artifact GC of the managed cache claims (its own state; reads self.caches).
        self.gc = GarbageCollector(self)
        self.instruments.attach(self)

    def enqueue(self, keys: Iterable[ModelKey], urgent: bool = False) -> None:
        for k in keys:
            self.queue.add(k, urgent)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the worker tasks."""
        for i in range(self.workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"reconcile-{i}"))

    async def stop(self) -> None:
        for t in [*self._tasks, *self.writer.pending]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self.writer.pending, return_exceptions=True)
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
                    self.budgets.stop_waiting(key)
                    self.budgets.wake_compile_waiters()
                    self.budgets.wake_rollout_waiters()
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
                            await self.status.report_failure(key, e)
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

    def set_leader(self, leading: bool) -> None:
        """Leader election callback: only the leader writes; a new leader resyncs everything."""
        self.budgets.reset()
        if leading:
            self.active.set()
            self.enqueue(self.caches.keys("models"))
        else:
            self.active.clear()
            # Another replica writes now: what this one wrote last is not the newest status.
            self.status.written.clear()

    # ------------------------------------------------------------------ reconcile

    def _forget(self, key: ModelKey) -> None:
        """A deleted model: its remembered status and observations dropped, out of the queues
        for a slot."""
        self.status.forget(key)
        self.observer.forget(key)
        self.devices.forget(key)
        self.budgets.stop_waiting(key)

    async def reconcile_key(self, key: ModelKey) -> Decision | None:
        """Reconcile one SpyreModel from the caches."""
        t0 = time.perf_counter()
        ns, name = key
        model = self.caches.one("models", key)
        if model is None or model["metadata"].get("deletionTimestamp"):
            self._forget(key)
            return None  # deleted: ownerReferences let the garbage collector clean up
        if self.install is not None and self.status.written_elsewhere(key, model):
            return None
        model = self.status.with_written_status(key, model)
        try:
            spec = SpyreModelSpec.model_validate(model.get("spec") or {})
        except ValidationError:  # invalid spec: decide() reports it, writes no child
            obs, plan = Observed(), None
        else:
            # Anything else that fails here is a bug: it propagates, so nothing is decided
            # from a partial observation (the worker reports it and backs off).
            plan = plan_model(name, ns, model["metadata"].get("uid", ""), spec, self.policy.site)
            obs = self.observer.observe(
                model, plan.claim, plan.key, plan.job_name, plan.model_claim
            )
        if plan is not None and obs.job is not None:
            await self.observer.precompile(key, obs)
        if plan is not None:
            await self.observer.mirror_slice(obs, plan)
        # Pods missing (the main Deployment's, or the canary's): theirs explain why, and may
        # change unwatched. A canary's pods always: when each last turned Ready starts its
        # window (a pod created again or restarted starts it again; decide/canary.py).
        short = plan is not None and (
            pods_missing(obs.deployment, plan.spec.replicas)
            or obs.canary_deployment is not None
        )
        if short:
            obs.server_pods = await self.observer.recent_server_pods(key)
        if plan is not None:
            await self.devices.observe(key, obs, plan, listed=short)
        if plan is not None and obs.canary_deployment is not None:
            # Both at once: a pod that does not answer costs one timeout, not two.
            obs.canary_reports, obs.served_reports = await asyncio.gather(
                self.observer.canary_reports(
                    obs.server_pods, plan.short_key, plan.spec.serving.port
                ),
                self.observer.served_reports(obs.server_pods, plan.spec.serving.port),
            )
        if plan is not None and plan.claim_managed:
            obs.collected = await self.gc.reports.collected(ns, plan.claim)
        if plan is not None:  # no await from here to the reservation: slots are counted once
            self.budgets.observe(key, model, plan, obs)
        decision = decide(model, obs, self.clock(), self.policy, plan)
        self.budgets.track(key, plan, obs, decision)
        try:
            await self.writer.execute(model, obs, decision)
        except OwnerGone as e:
            # As its DELETED event would have: forgotten, out of the queues, its slot freed.
            log.info("reconcile %s/%s: %s; forgotten", *key, e)
            self._forget(key)
            if decision.job is not None and decision.job.metadata is not None:
                self.budgets.compile_reserved.drop(ns, str(decision.job.metadata.name))
            self.budgets.wake_compile_waiters()
            self.budgets.wake_rollout_waiters()
            return None
        if plan is not None:
            await self.claims.release(plan, obs.deployment)
        if plan is not None and plan.claim_managed:
            await self.gc.collect(key, plan)
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
