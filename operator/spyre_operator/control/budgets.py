"""Cluster-wide budgets: how many precompile Jobs run, and how many models roll, at once.

An engine-image change (or any compile-affecting edit of many models) would otherwise start a
precompile Job per model at the same moment, and switch every serving Deployment as soon as
its artifact is ready. With a budget, a model that would start a Job (or switch its
Deployment to a new artifact) while every slot is taken waits instead: nothing is created,
the Deployment keeps serving the old artifact, and status says so
(``WaitingForCompileSlot`` / ``WaitingForRolloutSlot``).

``decide()`` stays pure: the controller (the one active replica, through leader election)
counts the slots in use from its watch caches, across every namespace it watches, and hands
each model a :class:`Slot` in ``Observed``. The order among waiting models is kept here: a
freed slot goes to the namespace holding the fewest, and within it oldest waiting first (when
it started waiting, as its status records it, then name), so a restarted operator or a new
leader rebuilds the same order from the models' status and its caches.

Here too, the budgets as the Controller keeps them (``Controller.budgets``, :class:`Budgets`):
the slots compiles and rollouts use, the models waiting for one, and waking them when a slot
frees. Its state is its own; it reads the controller's caches and enqueues through it. The
pure part, what a decision reads (:class:`Slot`), is decide/slots.py.
"""


from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from .. import KIND
from ..decide import (
    FREE,
    WAITING_RECHECK_SECONDS,
    Decision,
    Observed,
    Slot,
    deployment_rolling,
    mounted_claims,
    ordinal,
    served_key,
    waiting_since,
)
from ..decide import conditions as C
from ..decide import jobs as job_status
from ..desired import names
from .base import ControllerParts

__all__ = ["FREE", "WAITING_RECHECK_SECONDS", "Slot", "ordinal"]  # the decisions' part, here too

ModelKey = tuple[str, str]  # (namespace, name)

#: A slot taken by a write the watch has not shown yet is held at most this long.
RESERVATION_SECONDS = 60.0
DEFAULT_MAX_CONCURRENT_COMPILES = 4
DEFAULT_MAX_CONCURRENT_ROLLOUTS = 4


class Waiting:
    """Models waiting for one budget, by when they started waiting (then namespace, name)."""

    def __init__(self) -> None:
        self._since: dict[ModelKey, str] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._since

    def __len__(self) -> int:
        return len(self._since)

    def add(self, key: ModelKey, since: str) -> None:
        self._since[key] = since

    def discard(self, key: ModelKey) -> bool:
        """Forget ``key``; whether it was waiting."""
        return self._since.pop(key, None) is not None

    def clear(self) -> None:
        self._since.clear()

    def since(self) -> dict[ModelKey, str]:
        """Every waiting model and when it started waiting."""
        return dict(self._since)


def _walk(
    limit: int, held: Mapping[str, int], waiting: Mapping[ModelKey, str], ns_limit: int
) -> Iterator[tuple[ModelKey, bool]]:
    """The waiting models in the order slots go to them, each with whether one does now.

    Fair share (issue 45): the next slot goes to the longest-waiting model of the namespace
    that holds the fewest slots (counting the ones just given), so one namespace's many
    models cannot take every slot while another namespace waits; with one namespace it is
    plain oldest-first. A namespace at ``ns_limit`` (0: no cap) gets none."""
    queues: dict[str, list[tuple[str, ModelKey]]] = {}
    for k, since in waiting.items():
        queues.setdefault(k[0], []).append((since, k))
    for q in queues.values():
        q.sort(reverse=True)  # the oldest last: popped first
    taken = dict(held)
    free = limit - sum(held.values()) if limit > 0 else None
    heap = [(taken.get(ns, 0), q[-1], ns) for ns, q in queues.items()]
    heapq.heapify(heap)
    while heap:
        _, _, ns = heapq.heappop(heap)
        _, k = queues[ns].pop()
        goes = (free is None or free > 0) and (ns_limit <= 0 or taken.get(ns, 0) < ns_limit)
        if goes:
            taken[ns] = taken.get(ns, 0) + 1
            if free is not None:
                free -= 1
        yield k, goes
        if queues[ns]:
            heapq.heappush(heap, (taken.get(ns, 0), queues[ns][-1], ns))


def fair_slot(
    limit: int, held: Mapping[str, int], waiting: Waiting, key: ModelKey, since: str,
    ns_limit: int = 0,
) -> Slot:
    """``key``'s answer: free when its turn in :func:`_walk` (with it waiting since
    ``since``) comes with a slot. ``held``: slots in use by namespace."""
    if limit <= 0 and ns_limit <= 0:
        return FREE
    order = {**waiting.since(), key: since}
    in_use, ns_in_use = sum(held.values()), held.get(key[0], 0)
    for position, (k, goes) in enumerate(_walk(limit, held, order, ns_limit), start=1):
        if k == key:
            full = not goes and ns_limit > 0 and ns_in_use >= ns_limit
            return Slot(goes, in_use, limit, position, ns_in_use, ns_limit, full)
    raise AssertionError("unreachable: key is in the order")  # pragma: no cover


def fair_first(
    limit: int, held: Mapping[str, int], waiting: Waiting, ns_limit: int = 0
) -> list[ModelKey]:
    """The waiting models a slot goes to now (whom to wake)."""
    return [k for k, goes in _walk(limit, held, waiting.since(), ns_limit) if goes]


class Reservations:
    """Slots taken by this replica's writes that the watch cache does not show yet (a Job just
    created, a Deployment just switched): without them, concurrent reconciles would each see
    the same free slot. Each is dropped once the cache shows the write, or after
    RESERVATION_SECONDS."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[str, float]] = {}

    def hold(self, ns: str, name: str, what: str = "") -> None:
        self._held[(ns, name)] = (what, time.monotonic())

    def get(self, ns: str, name: str) -> str | None:
        held = self._held.get((ns, name))
        return None if held is None else held[0]

    def drop(self, ns: str, name: str) -> None:
        self._held.pop((ns, name), None)

    def clear(self) -> None:
        self._held.clear()

    def live(self) -> dict[tuple[str, str], str]:
        """The reservations not expired (expired ones are forgotten)."""
        cutoff = time.monotonic() - RESERVATION_SECONDS
        for k, (_, t) in list(self._held.items()):
            if t < cutoff:
                del self._held[k]
        return {k: what for k, (what, _) in self._held.items()}


class Budgets:
    """Budgets for compiles and rollouts: slots in use, waiting lists, waking waiters."""

    def __init__(
        self, controller: ControllerParts, max_concurrent_compiles: int,
        max_concurrent_rollouts: int, compiles_per_namespace: int = 0,
        rollouts_per_namespace: int = 0,
    ) -> None:
        self.c = controller
        #: Cluster-wide budgets (0: unlimited), over every watched namespace.
        self.max_concurrent_compiles = max_concurrent_compiles
        self.max_concurrent_rollouts = max_concurrent_rollouts
        #: The most one namespace may hold of each (0: no cap; the fair share applies anyway).
        self.compiles_per_namespace = compiles_per_namespace
        self.rollouts_per_namespace = rollouts_per_namespace
        self.compile_waiting = Waiting()
        self.rollout_waiting = Waiting()
        #: Precompile Jobs created (key: namespace, Job name) and Deployments switched to a
        #: new artifact (namespace, Deployment name -> key) that the caches do not show yet.
        self.compile_reserved = Reservations()
        self.rollout_reserved = Reservations()
        #: Whether the waiting lists were rebuilt from the models' status (after a start or
        #: on becoming leader).
        self.seeded = False

    def reset(self) -> None:
        """Leadership changed: a new leader rebuilds the waiting lists from the models'
        status, and counts slots from its own caches (the old leader's reservations are not
        its own)."""
        self.seeded = False
        self.compile_reserved.clear()
        self.rollout_reserved.clear()

    def seed_waiting(self) -> None:
        """Rebuild who waits for a slot, in order, from the models' status (the watch cache
        is complete before any reconcile): a restarted operator or a new leader keeps the
        order of the models that waited before it."""
        self.seeded = True
        self.compile_waiting.clear()
        self.rollout_waiting.clear()
        models = self.c.caches.indices.get("models") or {}
        for key in list(models.keys()):
            st = (self.c.caches.one("models", key) or {}).get("status") or {}
            conds = st.get("conditions")
            art = st.get("artifact") or {}
            ready = C.find(conds, C.ARTIFACT_READY) or {}
            if ready.get("reason") == C.WAITING_FOR_COMPILE_SLOT and art.get("waitingSince"):
                self.compile_waiting.add(key, str(art["waitingSince"]))
            progressing = C.find(conds, C.PROGRESSING) or {}
            if progressing.get("reason") == C.WAITING_FOR_ROLLOUT_SLOT:
                self.rollout_waiting.add(key, str(art.get("completedAt") or ""))

    def _owners(self, ns: str, obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The SpyreModels (from the cache) that ``obj``'s ownerReferences name, by name and
        UID: an owner reference is namespace-local, and a forged one names no live UID."""
        out = []
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("kind") != KIND:
                continue
            m = self.c.caches.one("models", (ns, str(ref.get("name") or "")))
            if m is not None and (m.get("metadata") or {}).get("uid") == ref.get("uid"):
                out.append(m)
        return out

    def _own_job(self, ns: str, job: Mapping[str, Any]) -> bool:
        """A precompile Job of this operator: one an owning SpyreModel's status names as its
        own (status is written by the operator alone); labels are anyone's to set."""
        name = (job.get("metadata") or {}).get("name")
        return any(((m.get("status") or {}).get("artifact") or {}).get("jobName") == name
                   for m in self._owners(ns, job))

    def _own_deployment(self, ns: str, dep: Mapping[str, Any]) -> list[str]:
        """The models whose serving (or canary) Deployment ``dep`` is: owned by them, under
        the name derived from theirs."""
        name = (dep.get("metadata") or {}).get("name")
        return [str(m["metadata"]["name"]) for m in self._owners(ns, dep)
                if name in (names.server_name(str(m["metadata"]["name"])),
                            names.canary_name(str(m["metadata"]["name"])))]

    def compiles_in_use(self) -> int:
        return len(self._compiles_running())

    def compiles_by_namespace(self) -> Counter[str]:
        """The precompile slots each namespace holds."""
        return Counter(ns for ns, _ in self._compiles_running())

    def _compiles_running(self) -> set[tuple[str, str]]:
        """Precompile Jobs of this operator that have not finished, in every watched namespace
        (from the Job cache; a Job shared by several models is one), plus the ones just created
        that the cache does not show yet. A Job counts when a SpyreModel that owns it names it
        in its status (``_own_job``): the labels alone let any namespace editor take every slot
        (issue 45). One just created, before the status naming it is in the cache, keeps its
        reservation."""
        running: set[tuple[str, str]] = set()
        seen: set[tuple[str, str]] = set()  # Jobs in the cache that are not deleted ones
        index = self.c.caches.indices.get("jobs") or {}
        for k in list(index.keys()):
            job = self.c.caches.one("jobs", k)
            if job is None:
                continue
            meta = job.get("metadata") or {}
            if meta.get("uid") in self.c.writer.deleted_jobs:
                continue  # e.g. a failed Job removed for its retry, under the same name
            labels = meta.get("labels") or {}
            if labels.get(names.COMPONENT) != names.COMPONENT_PRECOMPILE:
                continue
            if not self._own_job(k[0], job):
                continue  # someone else's, or its model's status does not name it yet
            seen.add(k)
            if not job_status.finished(job):
                running.add(k)
        for k in self.compile_reserved.live():
            if k in seen:
                self.compile_reserved.drop(*k)  # the cache shows the new Job now
            else:
                running.add(k)
        return running

    def rollouts_in_use(self, exclude: tuple[str, str] | None = None) -> int:
        return len(self._rollouts_running(exclude))

    def rollouts_by_namespace(self, exclude: tuple[str, str] | None = None) -> Counter[str]:
        """The rollout slots each namespace holds."""
        return Counter(ns for ns, _ in self._rollouts_running(exclude))

    def _rollouts_running(self, exclude: tuple[str, str] | None = None) -> set[tuple[str, str]]:
        """Serving Deployments of this operator whose rollout is not complete (pods of an
        older template left, or fewer available than asked) and has not exceeded its progress
        deadline, plus the ones just switched that the cache does not show yet. Only a
        model's own Deployments count (``_own_deployment``: owned by it, under its derived
        names), not whatever carries the labels (issue 45)."""
        rolling: set[tuple[str, str]] = set()
        index = self.c.caches.indices.get("deployments") or {}
        reserved = self.rollout_reserved.live()
        for k in list(index.keys()):
            dep = self.c.caches.one("deployments", k)
            if dep is None:
                continue
            labels = (dep.get("metadata") or {}).get("labels") or {}
            if labels.get(names.MANAGED_BY) != names.MANAGED_BY_VALUE:
                continue
            models = self._own_deployment(k[0], dep)
            if not models:
                continue
            if labels.get(names.CANARY_LABEL) == "true":
                # A canary holds its model's slot for as long as it exists: the switch it
                # leads to is under way (counted once with the main Deployment's rollout).
                for model in models:
                    rolling.add((k[0], names.server_name(model)))
                continue
            if k in reserved and served_key(dep) == reserved[k]:
                self.rollout_reserved.drop(*k)  # the cache shows the switch now
                reserved.pop(k)
            if deployment_rolling(dep):
                rolling.add(k)
        rolling |= set(reserved)
        rolling.discard(exclude)  # type: ignore[arg-type]
        return rolling

    def observe(
        self, key: ModelKey, model: Mapping[str, Any], plan: Any, obs: Observed
    ) -> None:
        """The budgets' answers for this model (Observed.compile_slot, rollout_slot): asked
        only when it may need a slot (no Job of its own yet; a Deployment serving another
        artifact or claim)."""
        if not self.seeded:
            self.seed_waiting()
        ns = key[0]
        now = self.c.clock()
        if (
            (self.max_concurrent_compiles > 0 or self.compiles_per_namespace > 0)
            and obs.job is None
            and self.compile_reserved.get(ns, plan.job_name) is None  # a sharer just made it
        ):
            obs.compile_slot = fair_slot(
                self.max_concurrent_compiles,
                self.compiles_by_namespace(),
                self.compile_waiting,
                key,
                waiting_since(dict(model), plan, now),
                self.compiles_per_namespace,
            )
        dep = obs.deployment
        if (
            (self.max_concurrent_rollouts > 0 or self.rollouts_per_namespace > 0)
            and dep is not None
            and (served_key(dep) != plan.key or plan.claim not in mounted_claims(dep))
        ):
            own = (ns, names.server_name(key[1]))
            if deployment_rolling(dep) or obs.canary_deployment is not None:
                # Already rolling, or running its canary: it holds its slot, switching it
                # adds no rollout.
                return
            # Order: when the new artifact was compiled (status, else its Job's completion).
            artifact = (model.get("status") or {}).get("artifact") or {}
            done = artifact.get("completedAt") if artifact.get("key") == plan.key else None
            obs.rollout_slot = fair_slot(
                self.max_concurrent_rollouts,
                self.rollouts_by_namespace(exclude=own),
                self.rollout_waiting,
                key,
                str(done or job_status.finished_at(obs.job) or now),
                self.rollouts_per_namespace,
            )

    def track(
        self, key: ModelKey, plan: Any, obs: Observed, d: Decision
    ) -> None:
        """After decide(): hold the slot a new Job or a switch takes until the caches show it,
        and keep the waiting lists; a model that stops waiting lets the next ones go."""
        ns = key[0]
        conds = d.status.get("conditions")
        artifact = d.status.get("artifact") or {}
        if d.job is not None and obs.job is None and d.job.metadata is not None:
            self.compile_reserved.hold(ns, str(d.job.metadata.name))
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
                self.rollout_reserved.hold(ns, names.server_name(key[1]), new_key)
        if (C.find(conds, C.PROGRESSING) or {}).get("reason") == C.WAITING_FOR_ROLLOUT_SLOT:
            self.rollout_waiting.add(key, str(artifact.get("completedAt") or ""))
        elif self.rollout_waiting.discard(key):
            self.wake_rollout_waiters()

    def stop_waiting(self, key: ModelKey) -> None:
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
        self.c.enqueue(fair_first(self.max_concurrent_compiles, self.compiles_by_namespace(),
                                    self.compile_waiting, self.compiles_per_namespace))

    def wake_rollout_waiters(self) -> None:
        """Same for the rollout budget (a rollout completed, a Deployment went)."""
        if not self.rollout_waiting:
            return
        self.c.enqueue(fair_first(self.max_concurrent_rollouts, self.rollouts_by_namespace(),
                                    self.rollout_waiting, self.rollouts_per_namespace))
