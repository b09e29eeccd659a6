"""Re-list what the indices hold: no ghost of an object deleted during a watch gap.

kopf keeps its indices from watch events. After a watch gap (an API-server restart, every
cluster upgrade; a 410 after etcd compaction; a network cut) kopf lists the resource again and
feeds the listed objects to the index handlers, but an object deleted during the gap gets no
DELETED event, so it stays in the index for good: a deleted model reconciled again, a deleted
precompile Job holding a compile slot, a deleted Deployment holding a rollout slot. A
controller-runtime operator has re-list tombstones for this; this is ours.

Every ``period`` seconds each watched resource is listed (the same namespaces and label
selectors as its indices) and compared with what the indices held just before the list:
an object the indices hold and the list lacks is gone. Its UID goes into ``Caches.ghosts``,
which every read of the caches skips; the models it concerns are reconciled and the budget
waiters woken, so the operator decides as a freshly started one would (issue 31, 1). The set
is recomputed at every round from the API server's answer, never accumulated: an object
created again under the same name has another UID.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, PersistentVolumeClaim, Service
from lightkube.resources.discovery_v1 import EndpointSlice
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget

from ..desired import names
from ..kube.apply import SpyreModelResource
from .common import uid_of

log = logging.getLogger(__name__)

#: A watch gap is noticed within this long (SPYRE_RESYNC_SECONDS).
DEFAULT_PERIOD_SECONDS = 30.0

MANAGED = {names.MANAGED_BY: names.MANAGED_BY_VALUE}


@dataclass(frozen=True)
class Source:
    """One watched resource and the indices kopf fills from its events."""

    resource: Any
    indices: tuple[str, ...]
    labels: Mapping[str, str] | None = None


SOURCES: tuple[Source, ...] = (
    Source(SpyreModelResource, ("models", "artifact_users", "claim_users", "model_claim_users")),
    Source(Job, ("jobs", "claim_jobs", "owned_jobs"), MANAGED),
    Source(EndpointSlice, ("endpointslices",), MANAGED),
    Source(PersistentVolumeClaim, ("pvcs",)),
    Source(Deployment, ("deployments",)),
    Source(Service, ("services",)),
    Source(PodDisruptionBudget, ("pdbs",)),
    Source(HorizontalPodAutoscaler, ("hpas",)),
    Source(NetworkPolicy, ("networkpolicies",)),
    # the watch's own scope (handlers.watch_selectors): every ConfigMap of the cluster, a
    # tenant's megabyte ones included, was listed whole every period (issue 45, 2)
    Source(ConfigMap, ("configmaps",), MANAGED),
)
#: Each re-list, and each watch's initial list (handlers.watch_selectors), comes in pages of
#: this many objects: what one round holds at a time.
PAGE_SIZE = 100


@dataclass(frozen=True)
class Ghost:
    """A value an index holds for an object the API server no longer has."""

    index: str
    key: Any
    value: Any


def held(indices: Mapping[str, Any], source: Source,
         uid_of: Callable[[Any], str | None]) -> dict[str, list[Ghost]]:
    """UID -> where the indices of ``source`` hold it (a snapshot: kopf updates them)."""
    out: dict[str, list[Ghost]] = {}
    for name in source.indices:
        idx = indices.get(name) or {}
        for key in list(idx.keys()):
            for value in list(idx.get(key) or ()):
                uid = uid_of(value)
                if uid:
                    out.setdefault(uid, []).append(Ghost(name, key, value))
    return out


def ghosts_of(before: Mapping[str, list[Ghost]], listed: Iterable[str]) -> dict[str, list[Ghost]]:
    """What the indices held before the list and the list lacks: deleted meanwhile."""
    live = set(listed)
    return {uid: where for uid, where in before.items() if uid not in live}


class Resync:
    """The periodic re-list for the controller ``c`` (its caches, queue and budgets)."""

    def __init__(self, controller: Any, client: AsyncClient,
                 namespaces: Sequence[str] | None = None,
                 period: float = DEFAULT_PERIOD_SECONDS) -> None:
        self.c = controller
        self.client = client
        self.namespaces = list(namespaces or [])
        self.period = period
        #: per resource: the ghosts its last successful list found
        self._ghosts: dict[str, dict[str, list[Ghost]]] = {}
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0

    def start(self) -> None:
        if self._task is None and self.period > 0:
            self._task = asyncio.create_task(self._run(), name="resync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("re-listing the watched resources failed")

    async def _uids(self, source: Source) -> set[str]:
        out: set[str] = set()
        for ns in self.namespaces or ["*"]:
            async for obj in self.client.list(source.resource, namespace=ns,
                                              chunk_size=PAGE_SIZE,
                                              labels=dict(source.labels or {}) or None):
                uid = getattr(obj.metadata, "uid", None) if obj.metadata else None
                if uid:
                    out.add(uid)
        return out

    async def once(self) -> list[Ghost]:
        """One round: list every source, recompute the ghosts; returns the new ones."""
        new: list[Ghost] = []
        for source in SOURCES:
            kind = source.resource.__name__
            before = held(self.c.caches.indices, source, uid_of)
            if not before:
                self._ghosts.pop(kind, None)
                continue
            try:
                listed = await self._uids(source)
            except Exception as e:  # noqa: BLE001 - keep the last answer for this one
                log.debug("re-list of %s failed: %s", kind, e)
                continue
            found = ghosts_of(before, listed)
            old = self._ghosts.get(kind) or {}
            new += [g for uid, where in found.items() if uid not in old for g in where]
            self._ghosts[kind] = found
        self.c.caches.ghosts = frozenset(u for g in self._ghosts.values() for u in g)
        self.rounds += 1
        if new:
            self._react(new)
        return new

    def _react(self, new: list[Ghost]) -> None:
        """Reconcile what the ghosts concern, as their DELETED events would have."""
        log.warning(
            "%d object(s) were deleted while the watches were broken: %s", len(new),
            ", ".join(sorted({f"{g.index} {g.key}" for g in new})[:20]))
        keys: list[Any] = []
        for g in new:
            if g.index == "models":
                keys.append(g.key)
                keys += self.c.router.claim_peers_if_changed(g.key, None)
            elif isinstance(g.value, Mapping) and isinstance(g.key, tuple):
                keys += self.c.router.models_for_owner_refs(g.key[0], g.value)
        self.c.enqueue(list(dict.fromkeys(keys)))
        self.c.budgets.wake_compile_waiters()
        self.c.budgets.wake_rollout_waiters()
