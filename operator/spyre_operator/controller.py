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
import contextlib
import itertools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod

from . import conditions as C
from . import jobs as job_status
from .api.v1alpha1 import SpyreModelSpec
from .apply import Applier
from .desired import names
from .desired.gcjob import COMPONENT_GC, Sweep, build_gc_job
from .desired.plan import plan_model
from .desired.routing import inference_pool_name
from .gc import ClaimUse, GcResult, epoch, keys_to_remove, known_keys, parse_gc_result
from .reconcile import (
    API_UNKNOWN,
    DEFAULT_POLICY,
    Decision,
    Observed,
    Policy,
    WriteError,
    decide,
    write_error_message,
)
from .reconcile import (
    served_key as served_key_of,
)

log = logging.getLogger(__name__)

ModelKey = tuple[str, str]  # (namespace, name)

#: Re-check a model that is waiting on something no watched object announces (a pod crash).
NOT_READY_RECHECK_SECONDS = 15.0
ERROR_BACKOFF_BASE = 1.0
ERROR_BACKOFF_MAX = 300.0
#: Serving pods are listed at most this often per model (see _recent_server_pods).
SERVER_PODS_TTL = 5.0
#: Events posted concurrently in the background.
EVENT_CONCURRENCY = 8
#: A claim nobody left is still swept for orphans this often (or every unusedForSeconds, if
#: longer): orphans of a SpyreModel deleted while the operator was down are found too.
SWEEP_MIN_PERIOD_SECONDS = 3600.0
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

    def __init__(self) -> None:
        self._queue: asyncio.PriorityQueue[tuple[int, int, ModelKey]] = asyncio.PriorityQueue()
        self._queued: dict[ModelKey, int] = {}  # key -> priority of its live entry
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
    """Views of kopf's indices (name -> index); each index maps a key to a store of values."""

    indices: Mapping[str, Any] = field(default_factory=dict)

    def one(self, index: str, key: Any) -> Any | None:
        idx = self.indices.get(index)
        if idx is None or key not in idx:
            return None
        for value in idx[key]:
            return value
        return None

    def all(self, index: str, key: Any) -> list[Any]:
        idx = self.indices.get(index)
        if idx is None or key not in idx:
            return []
        return list(idx[key])


@dataclass
class Stats:
    """Counters exposed on the operator's metrics and used by the benchmark."""

    reconciles: int = 0
    errors: int = 0
    reconcile_seconds: float = 0.0


class RejectedWrites(Exception):
    """Some writes of a reconcile were rejected; status says so, the worker backs off."""


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
    ) -> None:
        self.client = client
        self.policy = policy
        self.caches = caches
        self.applier = Applier(client)
        self.queue = WorkQueue()
        self.workers = workers
        self.clock = clock
        self.stats = Stats()
        #: API requests by (verb, resource), counted on the client (see metrics.count_requests).
        self.requests: Counter[tuple[str, str]] = Counter()
        self._failures: dict[ModelKey, int] = {}
        self._deleted_jobs: dict[str, float] = {}  # uid -> when we deleted it
        self._job_messages: dict[str, list[dict[str, Any]]] = {}  # terminal Job uid -> pods
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()
        #: Events are informational: a few at a time, never ahead of the reconcile's writes.
        self._event_slots = asyncio.Semaphore(EVENT_CONCURRENCY)
        self._written_status: dict[ModelKey, tuple[str | None, dict[str, Any]]] = {}
        self._server_pods: dict[ModelKey, tuple[float, list[dict[str, Any]]]] = {}
        self._claim_sigs: dict[ModelKey, tuple[str, str, str | None]] = {}
        self._pvc_phases: dict[tuple[str, str], str] = {}
        #: (namespace, claim) -> when its artifacts were last evaluated for GC (monotonic).
        self._gc_checked: dict[tuple[str, str], float] = {}
        #: Finished GC Jobs (uid) whose result was acted upon (Events, precompile Jobs). In
        #: memory: after a restart, a Job that finished before ``started_at`` is announced
        #: again only if some status still lists a key it removed (the old process had not
        #: acted on it).
        self._gc_done: set[str] = set()
        self.started_at = clock()
        #: Claims a SpyreModel left (deleted, or moved): sweep them for orphans soon.
        self._sweep_requested: set[tuple[str, str]] = set()
        #: (namespace, claim) -> when it was last swept (monotonic; set at the first look,
        #: so a restart makes no burst of sweeps).
        self._swept: dict[tuple[str, str], float] = {}
        #: (namespace, claim) -> the orphans the last sweep found: {key: first found, unix s}.
        self._orphans: dict[tuple[str, str], dict[str, int]] = {}
        #: (namespace, claim) -> (when, bytes of every artifact dir, claim UID) measured by its
        #: latest GC Job: counts towards ClaimNearlyFull with what the statuses list.
        self._claim_measured: dict[tuple[str, str], tuple[str, int, str | None]] = {}
        #: Set while this replica may write (leader election clears it on standby replicas).
        self.active = asyncio.Event()
        self.active.set()
        #: With leader election: whether the lease is still held (checked before each write,
        #: so a leader that was paused past its lease never writes before it notices).
        self.may_write: Callable[[], bool] = lambda: True
        #: The InferencePool watch (optional.OptionalApiWatch), set by the kopf layer.
        self.inference_pools: Any | None = None

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
            try:
                await self.active.wait()
                await self.reconcile_key(key)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a worker must survive any single failure
                if namespace_going_away(e):
                    # The namespace is gone or terminating: its models' deletion events follow;
                    # retrying would only load the API server (it did, after test namespaces).
                    log.info("reconcile %s/%s: namespace is being deleted; not retrying", *key)
                    self._failures.pop(key, None)
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
                )
                self.queue.add_after(key, delay)
            else:
                self._failures.pop(key, None)
            finally:
                self.queue.done(key)

    def set_leader(self, leading: bool) -> None:
        """Leader election callback: only the leader writes; a new leader resyncs everything."""
        if leading:
            self.active.set()
            models = self.caches.indices.get("models") or {}
            self.enqueue(list(models.keys()))
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
        if not keys and (namespace, name) in (self.caches.indices.get("models") or {}):
            keys = [(namespace, name)]
        return keys

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
        if old is None or old == sig:
            return []
        if sig is None or sig[0] != old[0]:
            # Deleted (or moved): what only it listed on the old claim is an orphan now.
            self._sweep_requested.add((key[0], old[0]))
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
            job_owners=sorted(
                {o for o in self.caches.all("artifact_users", (ns, plan_claim, key))},
                key=lambda o: (o.name, o.uid),
            ),
            cache_users=[(u.owner, u.volume) for u in users if u.volume is not None],
            claim_artifact_bytes=self._claim_artifact_bytes(ns, plan_claim, users),
        )
        self._observe_inference_pool(obs, ns, name)
        for kind, attr in (
            ("Deployment", "deployment"),
            ("Service", "service"),
            ("PodDisruptionBudget", "pdb"),
            ("HorizontalPodAutoscaler", "hpa"),
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
            return None  # deleted: ownerReferences let the garbage collector clean up
        model = self._with_written_status(key, model)
        try:
            spec = SpyreModelSpec.model_validate(model.get("spec") or {})
            plan = plan_model(name, ns, model["metadata"].get("uid", ""), spec)
            obs = self.observe(model, plan.claim, plan.key, plan.job_name, plan.model_claim)
        except Exception:  # noqa: BLE001 - invalid spec: decide() reports it as a condition
            obs = Observed()
            plan = None
        if plan is not None and obs.job is not None:
            obs.job_pods = await self._job_pods(ns, obs.job)
        short = False  # replicas missing: their pods explain why, and may change unwatched
        if plan is not None and obs.deployment is not None:
            st = obs.deployment.get("status") or {}
            if (st.get("replicas") or 0) > 0 and (st.get("availableReplicas") or 0) < spec.replicas:
                short = True
                obs.server_pods = await self._recent_server_pods(key)
        if plan is not None and plan.claim_managed:
            obs.collected = await self._collected(ns, plan.claim)
        decision = decide(model, obs, self.clock(), self.policy)
        await self.execute(model, obs, decision)
        if plan is not None and plan.claim_managed:
            await self.collect_garbage(key, plan)
        if decision.requeue_after is not None:
            self.queue.add_after(key, decision.requeue_after)
        self.stats.reconciles += 1
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

    # ------------------------------------------------------------------ garbage collection

    def _gc_jobs(self, ns: str, claim: str) -> list[dict[str, Any]]:
        return [
            j
            for j in self.caches.all("claim_jobs", (ns, claim))
            if (j["metadata"].get("labels") or {}).get(names.COMPONENT) == COMPONENT_GC
        ]

    async def _gc_result(self, ns: str, job: dict[str, Any]) -> GcResult | None:
        """What a finished GC Job removed (None: running, failed, or no summary)."""
        if not job_status.complete(job):
            return None
        for p in await self._job_pods(ns, job):
            result = parse_gc_result((p.get("terminated") or {}).get("message"))
            if result is not None:
                return result
        return None

    async def _collected(self, ns: str, claim: str) -> set[str]:
        """Keys the claim's finished GC Jobs removed (their pods are read once per Job)."""
        out: set[str] = set()
        for job in self._gc_jobs(ns, claim):
            result = await self._gc_result(ns, job)
            if result is not None:
                out |= set(result.removed)
        return out

    def _claim_artifact_bytes(self, ns: str, claim: str, users: list[Any]) -> int | None:
        """Size of the artifacts on the claim: those its users list, each key once, or what the
        last GC Job measured on the volume if that is more (orphans, dirs nobody lists)."""
        pvc = self.caches.one("pvcs", (ns, claim))
        uid = ((pvc or {}).get("metadata") or {}).get("uid")
        sizes: dict[str, int] = {}
        for u in users:
            m = self.caches.one("models", (ns, u.owner.name)) or {}
            for a in ((m.get("status") or {}).get("cache") or {}).get("artifacts") or []:
                if a.get("claim") == claim and a.get("claimUID") in (None, uid):
                    sizes[a["key"]] = int(a.get("sizeBytes") or 0)
        listed = sum(sizes.values()) if sizes else None
        measured = self._claim_measured.get((ns, claim))
        if measured is None or measured[2] != uid:
            return listed
        return max(listed or 0, measured[1]) or listed

    async def collect_garbage(self, key: ModelKey, plan: Any) -> None:
        """Act on finished GC Jobs of the model's claim, and start one when artifacts are due.

        Evaluation runs at most every ``policy.gc_interval_seconds`` per claim (any user's
        reconcile may do it), never on every reconcile. Only the claim's oldest user is
        requeued for the next evaluation: one timer per claim, not one per model.
        """
        ns, claim = plan.namespace, plan.claim
        jobs = self._gc_jobs(ns, claim)
        users = self.caches.all("claim_users", (ns, claim))
        oldest = min(users, key=lambda u: (u.created, u.owner.name), default=None)
        timer = oldest is not None and oldest.owner.name == key[1]
        models = [m for u in users if (m := self.caches.one("models", (ns, u.owner.name)))]
        for job in jobs:
            uid = job["metadata"].get("uid")
            if uid in self._gc_done:
                continue
            if job_status.failed(job):
                self._gc_done.add(uid)
                if not self._finished_before_start(job):
                    await self._gc_failed(ns, claim, job, models)
                continue
            result = await self._gc_result(ns, job)
            if result is None:
                continue
            self._gc_done.add(uid)
            self._record_measured(ns, claim, job, result)
            announce = not self._finished_before_start(job) or _still_listed(
                set(result.removed) - result.orphans_removed, claim, models
            )
            await self._after_gc(ns, claim, result, models, announce)
        clock = time.monotonic()
        checked = self._gc_checked.get((ns, claim))
        requested = (ns, claim) in self._sweep_requested
        if (
            checked is not None
            and clock - checked < self.policy.gc_interval_seconds
            and not requested
        ):
            if timer:
                self.queue.add_after(key, self.policy.gc_interval_seconds - (clock - checked))
            return
        if timer:
            self.queue.add_after(key, self.policy.gc_interval_seconds)
        if any(not job_status.finished(j) for j in jobs):
            return  # one GC Job at a time per claim (a requested sweep waits for it)
        self._gc_checked[(ns, claim)] = clock
        if oldest is None or oldest.volume is None:
            return
        pvc = self.caches.one("pvcs", (ns, claim))
        if pvc is None:
            return
        protected = set()
        for j in self.caches.all("claim_jobs", (ns, claim)):  # precompiles in progress
            k = (j["metadata"].get("annotations") or {}).get(names.ARTIFACT_KEY_ANNOTATION)
            if k and not job_status.finished(j):
                protected.add(k)
        uses, job_plan = [], plan
        for m in models:
            served = served_key_of(
                self.caches.one("deployments", (ns, names.server_name(m["metadata"]["name"])))
            )
            if served:
                protected.add(served)
            try:
                spec = SpyreModelSpec.model_validate(m.get("spec") or {})
                m_plan = plan_model(m["metadata"]["name"], ns, m["metadata"].get("uid", ""), spec)
                spec_key = m_plan.key
                if m["metadata"]["name"] == oldest.owner.name:
                    job_plan = m_plan  # the oldest user's image and placement, like its PVC
            except Exception:  # noqa: BLE001 - an invalid spec needs nothing
                spec_key = None
            artifacts = ((m.get("status") or {}).get("cache") or {}).get("artifacts") or []
            uses.append(ClaimUse(m["metadata"]["name"], spec_key, list(artifacts)))
        retention, now = oldest.volume.retention, self.clock()
        remove = keys_to_remove(
            claim,
            (pvc.get("metadata") or {}).get("uid"),
            uses,
            protected,
            retention,
            now,
        )
        # Removed by a finished GC Job, but the users' status may not say so yet.
        removed = await self._collected(ns, claim)
        remove = [k for k in remove if k not in removed]
        due = retention.enabled and self._sweep_due(ns, claim, retention, now, clock)
        if not remove and not due:
            return
        # Every GC Job also sweeps (it runs anyway); only a due sweep is a new decision, named
        # by its time: the same removal alone never makes a second Job.
        keep, lingering = self._known_keys(ns, claim, uses, protected)
        sweep = Sweep(frozenset(keep), retention.unused_for_seconds, now if due else "")
        gc_job = build_gc_job(job_plan, remove, [u.owner for u in users], sweep)
        name = gc_job.metadata.name if gc_job.metadata else ""
        if self.caches.one("jobs", (ns, name)) is not None:
            return  # this very set was collected already (or is being)
        log.info(
            "cache claim %s/%s: removing unused artifacts %s%s",
            ns,
            claim,
            remove,
            ", sweeping orphans" if due else "",
        )
        await self.applier.ensure_job(gc_job, None)
        if due:
            self._swept[(ns, claim)] = clock
            if not lingering:  # else sweep again once the deleted model's Deployment is gone
                self._sweep_requested.discard((ns, claim))

    def _sweep_due(self, ns: str, claim: str, retention: Any, now: str, clock: float) -> bool:
        """Sweep the claim for orphans: a SpyreModel left it, an orphan the last sweep found
        is due, or none ran for ``unusedForSeconds`` (at least SWEEP_MIN_PERIOD_SECONDS)."""
        if (ns, claim) in self._sweep_requested:
            return True
        orphans = self._orphans.get((ns, claim))
        t = epoch(now)
        if orphans and t is not None:
            if t - min(orphans.values()) >= retention.unused_for_seconds:
                return True
        swept = self._swept.setdefault((ns, claim), clock)
        period = max(retention.unused_for_seconds, SWEEP_MIN_PERIOD_SECONDS)
        return clock - swept >= period

    def _known_keys(
        self, ns: str, claim: str, uses: list[ClaimUse], protected: set[str]
    ) -> tuple[set[str], bool]:
        """Every key of ``claim`` the operator knows (see gc.known_keys): the statuses of
        every SpyreModel in the namespace (users or not, e.g. one with an invalid spec now),
        the users' spec keys, and the keys every Deployment of the namespace serves. True
        with them while a deleted SpyreModel's Deployment is still there (the garbage
        collector has not removed it yet): its key is kept, so the claim is swept again."""
        models = self.caches.indices.get("models") or {}
        statuses = [
            (self.caches.one("models", k) or {}).get("status") or {}
            for k in list(models.keys())
            if k[0] == ns
        ]
        deployments = self.caches.indices.get("deployments") or {}
        served, lingering = set(), False
        for dk in list(deployments.keys()):
            d = self.caches.one("deployments", dk) if dk[0] == ns else None
            k = served_key_of(d)
            if d is None or not k:
                continue
            served.add(k)
            owners = [
                r.get("name")
                for r in d["metadata"].get("ownerReferences") or []
                if r.get("kind") == "SpyreModel"
            ]
            if owners and not any(self.caches.one("models", (ns, o)) for o in owners):
                lingering = True
        keys = known_keys(claim, statuses, [u.spec_key for u in uses], protected | served)
        return keys, lingering

    async def _gc_failed(
        self, ns: str, claim: str, job: dict[str, Any], models: list[dict[str, Any]]
    ) -> None:
        """A GC Job failed: a Warning on every user of the claim, with the engine's reason.

        Nothing was dropped from any status; the same key set is tried again once the Job is
        gone (ttlSecondsAfterFinished), or at once if it is deleted.
        """
        why = ""
        for p in await self._job_pods(ns, job):
            why = str((p.get("terminated") or {}).get("message") or "").strip() or why
        conds = (job.get("status") or {}).get("conditions") or []
        why = why or next(
            (
                str(c.get("message") or c.get("reason") or "")
                for c in conds
                if c.get("type") == "Failed"
            ),
            "",
        )
        message = (
            f"GC Job {job['metadata'].get('name')} on cache claim {claim} failed"
            f"{': ' + why if why else ''}; nothing was removed from status"
        )
        for m in models:
            self._background(
                self.applier.event(dict(m), "Warning", "ArtifactCollectionFailed", message[:1024])
            )

    def _record_measured(self, ns: str, claim: str, job: dict[str, Any], result: GcResult) -> None:
        """Keep the newest GC Job's measurement of the claim (a restart reads them in any
        order)."""
        if result.remaining_bytes is None:
            return
        when = str((job.get("status") or {}).get("completionTime") or "")
        last = self._claim_measured.get((ns, claim))
        if last is None or when >= last[0]:
            pvc = self.caches.one("pvcs", (ns, claim))
            uid = ((pvc or {}).get("metadata") or {}).get("uid")
            self._claim_measured[(ns, claim)] = (when, result.remaining_bytes, uid)
            self.enqueue([(ns, u.owner.name) for u in self.caches.all("claim_users", (ns, claim))])

    def _finished_before_start(self, job: dict[str, Any]) -> bool:
        """The Job finished before this operator process started: the previous one acted on
        it already, unless it was down (the caller checks what status still says)."""
        t, start = epoch(job_status.finished_at(job)), epoch(self.started_at)
        return t is not None and start is not None and t < start

    async def _after_gc(
        self,
        ns: str,
        claim: str,
        result: GcResult,
        models: list[dict[str, Any]],
        announce: bool = True,
    ) -> None:
        """A GC Job finished: drop the removed keys' precompile Jobs (a revert compiles again),
        tell every user of the claim (``announce``: not again after an operator restart), and
        reconcile them (their status.cache drops the keys)."""
        for k in result.removed:
            name = names.precompile_job_name(k, claim)
            live = self.caches.one("jobs", (ns, name))
            if live is not None:
                self._deleted_jobs[live["metadata"]["uid"]] = time.monotonic()
                await self.applier.delete(Job, name, ns)
        self._announce_orphans(ns, claim, result, models if announce else [])
        if not result.removed:
            return
        if not announce:
            self.enqueue([(ns, m["metadata"]["name"]) for m in models])
            return
        mine_removed = sorted(result.removed)
        orphans = len(result.orphans_removed)
        message = (
            f"removed {len(mine_removed)} unused artifact(s) from cache claim {claim}"
            f"{f' ({orphans} listed by no SpyreModel)' if orphans else ''}, "
            f"freed {result.freed_bytes} bytes: {', '.join(k[:12] for k in mine_removed)}"
        )
        if result.remaining_bytes is not None:
            message += f"; {result.remaining_bytes} bytes of artifacts left on the claim"
        if result.skipped:
            message += f"; skipped {', '.join(sorted(k[:12] for k in result.skipped))}"
        for m in models:
            self._background(
                self.applier.event(dict(m), "Normal", "ArtifactsCollected", message[:1024])
            )
        self.enqueue([(ns, m["metadata"]["name"]) for m in models])

    def _announce_orphans(
        self, ns: str, claim: str, result: GcResult, models: list[dict[str, Any]]
    ) -> None:
        """Remember a sweep's pending orphans (the next sweep is due when the oldest is) and
        tell the claim's users when the set changed: space no SpyreModel accounts for."""
        before = self._orphans.get((ns, claim)) or {}
        now = dict(result.orphans)
        if now:
            self._orphans[(ns, claim)] = now
        else:
            self._orphans.pop((ns, claim), None)
        if not now or set(now) == set(before):
            return
        user = next(iter(models), None)
        volume = None
        if user is not None:
            with contextlib.suppress(Exception):
                volume = SpyreModelSpec.model_validate(user.get("spec") or {}).cache.volume
        wait = f"{volume.retention.unused_for_seconds} s" if volume else "the retention period"
        message = (
            f"{result.orphan_count} artifact(s) on cache claim {claim} "
            f"({result.orphan_bytes} bytes) are listed by no SpyreModel (a deleted one's): "
            f"{', '.join(k[:12] for k in sorted(now))}; removed once unused for {wait} "
            "unless a SpyreModel needs them again"
        )
        for m in models:
            self._background(
                self.applier.event(dict(m), "Normal", "ArtifactsOrphaned", message[:1024])
            )

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

    def _with_written_status(self, key: ModelKey, model: dict[str, Any]) -> dict[str, Any]:
        """``model`` with the status this operator last wrote, if the cache has not caught up.

        Only this operator writes the status, so until the watch delivers our last write
        that write is the newest status. Deciding from the older cached status would
        rewrite the same status and post its transition Events a second time (it did
        under load, with concurrent reconciles).
        """
        uid = model["metadata"].get("uid")
        written = self._written_status.get(key)
        if written is None:
            return model
        if written[0] != uid or model.get("status") == written[1]:
            del self._written_status[key]
            return model
        return {**model, "status": written[1]}

    async def _job_pods(self, ns: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        """Pods of a finished Job (read once per Job: their termination messages)."""
        uid = job["metadata"]["uid"]
        if not job_status.finished(job):
            return []
        if uid not in self._job_messages:
            pods = await self._pods(ns, {"batch.kubernetes.io/controller-uid": uid})
            self._job_messages[uid] = pods
        return self._job_messages[uid]

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
            "HorizontalPodAutoscaler": obs.hpa,
            "InferencePool": obs.inference_pool,
        }
        if not self.may_write():
            raise RuntimeError("leader lease not held; not writing")
        for resource, obj_name in d.delete:
            live = obs.job if resource.__name__ == "Job" else None
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
            writes.append(self.applier.apply(obj, live_by_kind.get(obj.kind)))
        results = await asyncio.gather(*writes, return_exceptions=True)
        for (kind, obj_name), r in zip(targets, results, strict=True):
            if isinstance(r, ApiError) and _rejected(r):
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
            raise RuntimeError("leader lease not held; not writing")
        wrote = await self.applier.apply_status(name, ns, d.status, model.get("status"))
        if wrote:
            self._written_status[(ns, name)] = (model["metadata"].get("uid"), d.status)
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
            if e.status.code != 409:  # conflict: the watch will bring the new version
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


def _still_listed(keys: set[str], claim: str, models: list[dict[str, Any]]) -> bool:
    """Some model's status.cache.artifacts lists one of ``keys`` on ``claim``."""
    return any(
        a.get("key") in keys and a.get("claim") == claim
        for m in models
        for a in ((m.get("status") or {}).get("cache") or {}).get("artifacts") or []
    )


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
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
            out["unschedulable"] = c.get("message") or "no node fits"
    return out
