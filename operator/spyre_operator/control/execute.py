"""Execution of a decision (``Controller.writer``): the writes (deletes, children, the Job,
status, Events) through the apply layer, rejected writes folded back into status. Its state:
the Jobs it deleted that the cache may still show, and the Events being posted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Mapping
from typing import Any

from lightkube import ApiError
from lightkube.resources.core_v1 import ConfigMap

from ..decide import Decision, Observed, WriteError, decide, write_error_message
from ..desired import names
from ..kube.apply import STATUS_FIELDS_KEY, comparable_status
from . import peers
from .base import ControllerParts
from .common import (
    EVENT_CONCURRENCY,
    NotLeader,
    OwnerGone,
    RejectedWrites,
    foreign_owner,
    is_rejected_write,
    says_terminating,
)

#: A Job this writer deleted is remembered this long (the watch catches up well before).
DELETED_JOB_MEMORY_SECONDS = 600.0
#: A same-named object of a kind watched with the operator's label only (ConfigMaps) sends no
#: event when it goes: the model is looked at again this often while one is in the way.
UNWATCHED_RECHECK_SECONDS = 60.0


class Writer:
    """Execution of decisions: the writes, and the background Events."""

    def __init__(self, controller: ControllerParts) -> None:
        self.c = controller
        #: Job uid -> when this writer deleted it: observation reads it as gone meanwhile.
        self.deleted_jobs: dict[str, float] = {}
        #: Events being posted in the background.
        self.pending: set[asyncio.Task[None]] = set()
        #: Events are informational: a few at a time, never ahead of the reconcile's writes.
        self._event_slots = asyncio.Semaphore(EVENT_CONCURRENCY)

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
            "ConfigMap": obs.verified_configmap,
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
        if not self.c.may_write():
            raise NotLeader("leader lease not held; not writing")
        for resource, obj_name in d.delete:
            if resource.__name__ == "Deployment" and (
                obj_name != names.canary_name(name) or obs.canary_deployment is None
            ):
                # The chart grants delete on Deployments for the canary's alone: a serving
                # Deployment is only ever removed by the garbage collector with its model.
                raise RuntimeError(
                    f"refusing to delete Deployment {ns}/{obj_name}: the operator deletes only "
                    f"the model's own canary Deployment ({names.canary_name(name)})"
                )
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
                self.deleted_jobs[live["metadata"]["uid"]] = time.monotonic()
            await self.c.applier.delete(resource, obj_name, ns)
        # A child created for a model the API server no longer has would only be the garbage
        # collector's (and created again at its next event): after a watch gap the caches can
        # still hold a deleted model. A create asks first; an update of what exists needs not.
        def live_of(obj: Any) -> dict[str, Any] | None:
            if obj.kind == "Deployment" and obj.metadata.name == names.canary_name(name):
                return obs.canary_deployment
            if obj.kind == "Service" and obj.metadata.name in other_services:
                return other_services[obj.metadata.name]
            if obj.kind == "ResourceClaimTemplate":
                return obs.cards_templates.get(obj.metadata.name)
            return live_by_kind.get(obj.kind)

        await self._find_unwatched_foreign(ns, name, obs, d)
        creates = (d.job is not None and obs.job is None) or any(
            live_of(obj) is None for obj in d.apply
        )
        if creates and not await self.c.applier.owner_exists(model):
            raise OwnerGone(f"{ns}/{name} (uid {model['metadata'].get('uid')}) is not in the "
                            "API server: deleted while the watches were broken")
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
            writes.append(self.c.applier.apply(obj, live_of(obj)))
        results = await asyncio.gather(*writes, return_exceptions=True)
        for (kind, obj_name), r in zip(targets, results, strict=True):
            if isinstance(r, ApiError) and is_rejected_write(r):
                if kind == "Job":  # not created: the slot it held is free again
                    self.c.budgets.compile_reserved.drop(ns, obj_name)
                obs.write_errors.append(
                    WriteError(kind, obj_name, r.status.code or 0, r.status.message or str(r))
                )
            elif isinstance(r, BaseException):
                raise r
        if obs.write_errors and all(says_terminating(e.message) for e in obs.write_errors):
            raise RejectedWrites(write_error_message(obs.write_errors) or "")  # nothing to tell
        if obs.foreign or obs.write_errors:
            again = decide(dict(model), obs, self.c.clock(), self.c.policy)
            d.status, d.events = again.status, again.events
        if not self.c.may_write():
            raise NotLeader("leader lease not held; not writing")
        owned = model.get(STATUS_FIELDS_KEY)
        if self.c.install is not None:
            # the stamp is kept when nothing else changes: compared without the status fields
            # another field manager set alone (they made a new stamp, so a write, every time)
            live = comparable_status(
                model.get("status"), {**d.status, peers.STAMP_FIELD: None}, owned
            )
            d.status = peers.stamped(
                d.status, live, self.c.install, self.c.identity, self.c.clock()
            )
        current = comparable_status(model.get("status"), d.status, owned)
        try:
            rv = await self.c.applier.apply_status(name, ns, d.status, current)
        except ApiError as e:
            if e.status.code != 404:
                raise
            # The model itself is gone (deleted since the caches read it): what its DELETED
            # event will say, not a failure to retry.
            raise OwnerGone(f"{ns}/{name} was deleted before its status was written") from e
        if rv is not None:
            self.c.status.remember((ns, name), model, d.status)
            self.c.status.report_pruned(model)
            for type_, reason, message in d.events:
                self.background(self.c.applier.event(dict(model), type_, reason, message))
        self._expire_deleted_jobs()
        if obs.write_errors:
            raise RejectedWrites(write_error_message(obs.write_errors) or "")

    async def _find_unwatched_foreign(
        self, ns: str, name: str, obs: Observed, d: Decision
    ) -> None:
        """ConfigMaps are watched with the operator's labels only (a server-side selector:
        every other ConfigMap of the cluster, however large, never reaches the operator, issue
        45, 2), so the model's ``<model>-output-check`` is looked up by name before it is
        first written: a same-named ConfigMap of someone else's is reported (NameConflict) and
        left alone, as a watched kind's is; its deletion sends no event, so the model is looked
        at again every UNWATCHED_RECHECK_SECONDS meanwhile."""
        if obs.verified_configmap is not None or "ConfigMap" in obs.foreign:
            return
        wanted = [o for o in d.apply if o.kind == "ConfigMap"]
        if not wanted:
            return
        cm = wanted[0].metadata.name
        live = await self.c.applier.named(ConfigMap, cm, ns)
        if live is None:
            return
        why = foreign_owner("ConfigMap", live, name)
        if why:
            obs.foreign["ConfigMap"] = why
            d.apply = [o for o in d.apply if o.kind != "ConfigMap"]
            self.c.queue.add_after((ns, name), UNWATCHED_RECHECK_SECONDS)
        else:  # ours, not in the cache yet (just written): an update, not a create
            obs.verified_configmap = live

    async def _ensure_job(
        self, ns: str, name: str, job: Any | None, live: dict[str, Any] | None
    ) -> None:
        if job is None:
            return
        try:
            await self.c.applier.ensure_job(job, live)
        except ApiError as e:
            # 409: the watch will bring the new version; 404 on the owners' patch of a Job the
            # cache showed: it was deleted an instant ago (a TTL, its namespace going) and the
            # watch will bring that. 422 "field is immutable" on a Job the cache did not show:
            # a model sharing the key created it an instant ago from its own pod template; the
            # next reconcile sees it and only adds this owner.
            created_by_sharer = (live is None and e.status.code == 422
                                 and "field is immutable" in (e.status.message or ""))
            deleted_since_read = live is not None and e.status.code == 404
            if e.status.code != 409 and not created_by_sharer and not deleted_since_read:
                raise
            self.c.queue.add_after((ns, name), 1.0)

    def background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a best-effort write (an Event) without holding up the worker."""
        task = asyncio.create_task(self._bounded(coro))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _bounded(self, coro: Coroutine[Any, Any, None]) -> None:
        async with self._event_slots:
            await coro

    def _expire_deleted_jobs(self) -> None:
        cutoff = time.monotonic() - DELETED_JOB_MEMORY_SECONDS
        for uid, when in list(self.deleted_jobs.items()):
            if when < cutoff:
                del self.deleted_jobs[uid]
