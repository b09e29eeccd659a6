"""Garbage collection of the managed cache claims (``Controller.gc``): acts on finished GC
Jobs, decides when a claim is evaluated and creates its GC Job, from the pure decisions of
decide/gc.py (which keys are unused, what a GC Job reported, the PVC's record of removals)."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import PersistentVolumeClaim

from ..api.v1alpha1 import SpyreModelSpec
from ..decide import (
    ClaimMeasure,
    ClaimUse,
    GcResult,
    epoch,
    gone_keys,
    jobs,
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
from ..decide import served_key as served_key_of
from ..desired import names
from ..desired.gcjob import COMPONENT_GC, Sweep, build_gc_access, build_gc_job
from ..desired.plan import plan_model
from .base import ControllerParts

log = logging.getLogger("spyre_operator.gc")  # the logger's name before the split


# ------------------------------------------------------------------------------ collaborator

#: Finished GC Jobs remembered (as acted upon) before the gone ones are forgotten.
DONE_MIN_LIMIT = 256
#: A claim nobody left is still swept for orphans this often (or every unusedForSeconds, if
#: longer): orphans of a SpyreModel deleted while the operator was down are found too.
SWEEP_MIN_PERIOD_SECONDS = 3600.0

ModelKey = tuple[str, str]


class GcReports:
    """What finished GC Jobs said, and acting on it (``GarbageCollector.reports``): their
    removals recorded on the PVC, the claim's measurements, Events to the claim's users, the
    stale precompile Jobs of removed keys deleted, and what the last sweep left pending (the
    orphans, the downloads), which the collector's sweep timing reads."""

    def __init__(self, controller: ControllerParts) -> None:
        self.c = controller
        #: Finished GC Jobs (uid -> namespace, name) whose result was acted upon (Events,
        #: precompile Jobs); forgotten once the Job is gone. In memory: after a restart, a
        #: Job that finished before ``started_at`` is announced again only if some status
        #: still lists a key it removed (the old process had not acted on it).
        self._done: dict[str, tuple[str, str]] = {}
        self._done_limit = DONE_MIN_LIMIT
        #: (namespace, claim) -> the orphans the last sweep found: {key: first found, unix s}.
        self.orphans: dict[tuple[str, str], dict[str, int]] = {}
        #: (namespace, claim) -> when the oldest download the last sweep left pending was
        #: first found unnamed (unix s): the next sweep is due then too.
        self.models_pending: dict[tuple[str, str], int] = {}
        #: (namespace, claim) -> (when, bytes of every artifact dir, claim UID) measured by its
        #: latest GC Job: counts towards ClaimNearlyFull with what the statuses list.
        self._claim_measured: dict[tuple[str, str], tuple[str, int, str | None]] = {}
        #: What the newest GC Job measured on each claim's volume, and the claim's UID then.
        self._claim_volume: dict[tuple[str, str], tuple[ClaimMeasure, str | None]] = {}

    def claims(self) -> set[tuple[str, str]]:
        """The claims something is remembered of."""
        return (set(self.orphans) | set(self.models_pending) | set(self._claim_measured)
                | set(self._claim_volume))

    def forget_claim(self, claim: tuple[str, str]) -> None:
        for m in (self.orphans, self.models_pending, self._claim_measured, self._claim_volume):
            m.pop(claim, None)

    def jobs(self, ns: str, claim: str) -> list[dict[str, Any]]:
        return [
            j
            for j in self.c.caches.all("claim_jobs", (ns, claim))
            if (j["metadata"].get("labels") or {}).get(names.COMPONENT) == COMPONENT_GC
        ]

    async def result(self, ns: str, job: dict[str, Any]) -> GcResult | None:
        """What a finished GC Job removed (None: running, failed, or no summary)."""
        if not jobs.complete(job):
            return None
        for p in await self.c.observer.job_pods(ns, job):
            result = parse_gc_result((p.get("terminated") or {}).get("message"))
            if result is not None:
                return result
        return None

    async def collected(self, ns: str, claim: str) -> dict[str, str]:
        """Keys GC removed from the claim (or found absent), with when: the PVC's record, and
        the finished GC Jobs' reports not recorded yet (the latest such Job's completion; ""
        if unknown). Their pods are read once per Job."""
        out = removed_record(self.c.caches.one("pvcs", (ns, claim)))
        for job in self.jobs(ns, claim):
            result = await self.result(ns, job)
            if result is None:
                continue
            when = jobs.finished_at(job) or ""
            entries = {**result.removed_record, **dict.fromkeys(gone_keys(result), when)}
            out = merge_removed(out, entries, limit=None)
        return out

    async def _record_removed(self, ns: str, claim: str, job: dict[str, Any],
                              result: GcResult) -> None:
        """Write what the GC Job left absent onto the PVC (it outlives the Job), and what the
        volume's own record says earlier GC Jobs removed (a Job that went before it was read:
        its TTL while the operator was down, a cleanup of finished Jobs)."""
        gone = gone_keys(result)
        pvc = self.c.caches.one("pvcs", (ns, claim))
        if not (gone or result.removed_record) or pvc is None:
            return
        record = removed_record(pvc)
        when = jobs.finished_at(job) or self.c.clock()
        new = merge_removed(record, {**result.removed_record, **dict.fromkeys(gone, when)})
        if new != record:
            await self.c.applier.annotate(
                PersistentVolumeClaim, claim, ns,
                {names.REMOVED_ARTIFACTS_ANNOTATION: json.dumps(new, separators=(",", ":"))})

    def claim_artifact_bytes(self, ns: str, claim: str, users: list[Any]) -> int | None:
        """Size of the artifacts on the claim: those its users list, each key once, or what the
        last GC Job measured on the volume if that is more (orphans, dirs nobody lists)."""
        pvc = self.c.caches.one("pvcs", (ns, claim))
        uid = ((pvc or {}).get("metadata") or {}).get("uid")
        sizes: dict[str, int] = {}
        for u in users:
            m = self.c.caches.one("models", (ns, u.owner.name)) or {}
            for a in ((m.get("status") or {}).get("cache") or {}).get("artifacts") or []:
                if a.get("claim") == claim and a.get("claimUID") in (None, uid):
                    sizes[a["key"]] = int(a.get("sizeBytes") or 0)
        listed = sum(sizes.values()) if sizes else None
        measured = self._claim_measured.get((ns, claim))
        if measured is None or measured[2] != uid:
            return listed
        return max(listed or 0, measured[1]) or listed

    async def act_on_finished(
        self, ns: str, claim: str, gc_jobs: list[dict[str, Any]], models: list[dict[str, Any]]
    ) -> None:
        """Announce each finished GC Job once (failed: a Warning; complete: what it removed)."""
        self._forget_gone_jobs()
        for job in gc_jobs:
            uid = job["metadata"].get("uid")
            if uid in self._done:
                continue
            if jobs.failed(job):
                self._done[uid] = (ns, job["metadata"].get("name"))
                if not self._finished_before_start(job):
                    await self._failed_job(ns, claim, job, models)
                continue
            result = await self.result(ns, job)
            if result is None:
                continue
            self._done[uid] = (ns, job["metadata"].get("name"))
            self._record_measured(ns, claim, job, result)
            await self._record_removed(ns, claim, job, result)
            announce = not self._finished_before_start(job) or still_listed(
                set(result.removed) - result.orphans_removed, claim, models
            )
            await self._after(ns, claim, result, models, announce, jobs.finished_at(job))
            if any(r.startswith("in use by") for r in result.skipped.values()):
                # Its name is the decision's: while it exists the same keys are never tried
                # again (a replica that was still draining then keeps a key for an hour).
                await self.c.applier.delete(Job, job["metadata"]["name"], ns)

    def _forget_gone_jobs(self) -> None:
        """Bound ``_done``: a uid whose Job is gone (TTL, deleted) is never seen again."""
        if len(self._done) <= self._done_limit:
            return
        for uid, (ns, name) in list(self._done.items()):
            live = self.c.caches.one("jobs", (ns, name))
            if live is None or live["metadata"].get("uid") != uid:
                del self._done[uid]
        self._done_limit = max(DONE_MIN_LIMIT, 2 * len(self._done))

    async def _failed_job(
        self, ns: str, claim: str, job: dict[str, Any], models: list[dict[str, Any]]
    ) -> None:
        """A GC Job failed: a Warning on every user of the claim, with the engine's reason.

        Nothing was dropped from any status; the same key set is tried again once the Job is
        gone (ttlSecondsAfterFinished), or at once if it is deleted.
        """
        why = ""
        for p in await self.c.observer.job_pods(ns, job):
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
        self._tell_users(models, "Warning", "ArtifactCollectionFailed", message)

    def _record_measured(self, ns: str, claim: str, job: dict[str, Any], result: GcResult) -> None:
        """Keep the newest GC Job's measurement of the claim (a restart reads them in any
        order)."""
        when = str((job.get("status") or {}).get("completionTime") or "")
        pvc = self.c.caches.one("pvcs", (ns, claim))
        uid = ((pvc or {}).get("metadata") or {}).get("uid")
        changed = False
        last = self._claim_measured.get((ns, claim))
        if result.remaining_bytes is not None and (last is None or when >= last[0]):
            self._claim_measured[(ns, claim)] = (when, result.remaining_bytes, uid)
            changed = True
        volume = self._claim_volume.get((ns, claim))
        if (result.free_bytes is not None or result.weights_bytes is not None) and (
                volume is None or when >= volume[0].at):
            self._claim_volume[(ns, claim)] = (
                ClaimMeasure(when, result.free_bytes, result.weights_bytes), uid)
            changed = True
        if changed:
            users = self.c.caches.all("claim_users", (ns, claim))
            self.c.enqueue([(ns, u.owner.name) for u in users])

    def claim_measured(self, ns: str, claim: str) -> ClaimMeasure | None:
        """What the newest GC Job measured on the claim's volume; None when none did on this
        incarnation of the claim."""
        measured = self._claim_volume.get((ns, claim))
        pvc = self.c.caches.one("pvcs", (ns, claim))
        if measured is None or measured[1] != ((pvc or {}).get("metadata") or {}).get("uid"):
            return None
        return measured[0]

    def _finished_before_start(self, job: dict[str, Any]) -> bool:
        """The Job finished before this operator process started: the previous one acted on
        it already, unless it was down (the caller checks what status still says)."""
        t, start = epoch(jobs.finished_at(job)), epoch(self.c.started_at)
        return t is not None and start is not None and t < start

    async def _after(
        self,
        ns: str,
        claim: str,
        result: GcResult,
        models: list[dict[str, Any]],
        announce: bool = True,
        removed_at: str | None = None,
    ) -> None:
        """A GC Job finished (at ``removed_at``): drop the removed keys' precompile Jobs that
        compiled them before (a revert compiles again; a recompile since is left alone),
        tell every user of the claim (``announce``: not again after an operator restart), and
        reconcile them (their status.cache drops the keys)."""
        for k in result.removed:
            name = names.precompile_job_name(k, claim)
            live = self.c.caches.one("jobs", (ns, name))
            if live is None or not stale_compile(live, removed_at):
                continue
            self.c.writer.deleted_jobs[live["metadata"]["uid"]] = time.monotonic()
            await self.c.applier.delete(Job, name, ns)
        self._announce_orphans(ns, claim, result, models if announce else [])
        self._announce_models(ns, claim, result, models if announce else [])
        in_use = {k: r for k, r in result.skipped.items() if r.startswith("in use by")}
        if in_use and announce:
            # The Job that kept them is deleted next (and its pod's message with it).
            kept = "; ".join(f"{k[:12]} {r}" for k, r in sorted(in_use.items()))
            message = (
                f"kept {len(in_use)} artifact(s) on cache claim {claim} that pods use again, "
                f"although they were due for removal: {kept}"
            )
            self._tell_users(models, "Normal", "ArtifactsKept", message)
        if not result.removed:
            return
        if not announce:
            self.c.enqueue([(ns, m["metadata"]["name"]) for m in models])
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
        self._tell_users(models, "Normal", "ArtifactsCollected", message)
        self.c.enqueue([(ns, m["metadata"]["name"]) for m in models])

    def _tell_users(
        self, models: list[dict[str, Any]], type_: str, reason: str, message: str
    ) -> None:
        """The same Event on every user of the claim (sent in the background)."""
        for m in models:
            self.c.writer.background(self.c.applier.event(dict(m), type_, reason, message[:1024]))

    def _announce_models(
        self, ns: str, claim: str, result: GcResult, models: list[dict[str, Any]]
    ) -> None:
        """Remember when the oldest pending download is due, and tell the claim's users which
        downloaded models (or old revisions) a GC Job removed."""
        if result.models_pending:
            self.models_pending[(ns, claim)] = min(since for _, since in result.models_pending)
        else:
            self.models_pending.pop((ns, claim), None)
        if not result.models_removed or not models:
            return
        names_ = ", ".join(u.removeprefix("models--").replace("--", "/", 1)
                           for u in sorted(result.models_removed))  # fmt: skip
        message = (
            f"removed {len(result.models_removed)} downloaded model(s) or old revision(s) no "
            f"SpyreModel names from cache claim {claim}, freed {result.models_freed_bytes} "
            f"bytes: {names_}"
        )
        self._tell_users(models, "Normal", "ModelsCollected", message)

    def _announce_orphans(
        self, ns: str, claim: str, result: GcResult, models: list[dict[str, Any]]
    ) -> None:
        """Remember a sweep's pending orphans (the next sweep is due when the oldest is) and
        tell the claim's users when the set changed: space no SpyreModel accounts for."""
        before = self.orphans.get((ns, claim)) or {}
        now = dict(result.orphans)
        if now:
            self.orphans[(ns, claim)] = now
        else:
            self.orphans.pop((ns, claim), None)
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
        self._tell_users(models, "Normal", "ArtifactsOrphaned", message)


class GarbageCollector:
    """Artifact GC of the managed cache claims, for the controller (``c``): decides when a
    claim is evaluated or swept and creates its GC Job; what finished GC Jobs said is its
    ``reports``' (:class:`GcReports`). It reads the controller's caches and writes through its
    applier; its state is its own."""

    def __init__(self, controller: ControllerParts) -> None:
        self.c = controller
        #: (namespace, claim) -> when its artifacts were last evaluated for GC (monotonic).
        self._checked: dict[tuple[str, str], float] = {}
        #: Claims a SpyreModel left (deleted, or moved): sweep them for orphans soon.
        self.sweep_requested: set[tuple[str, str]] = set()
        #: (namespace, claim) -> when a requested sweep last ran while a deleted model's
        #: Deployment was still there (monotonic): asked for again an interval later.
        self._lingering: dict[tuple[str, str], float] = {}
        #: (namespace, claim) -> when it was last swept (monotonic; set at the first look,
        #: so a restart makes no burst of sweeps).
        self._swept: dict[tuple[str, str], float] = {}
        #: What finished GC Jobs said, and what is done about it.
        self.reports = GcReports(controller)

    async def collect(self, key: ModelKey, plan: Any) -> None:
        """Act on finished GC Jobs of the model's claim, and start one when artifacts are due.

        Evaluation runs at most every ``policy.gc_interval_seconds`` per claim (any user's
        reconcile may do it), never on every reconcile. Only the claim's oldest user is
        requeued for the next evaluation: one timer per claim, not one per model. Nothing is
        written (Job deleted, GC Job created) while this replica does not hold the lease.
        """
        if not self.c.may_write():
            return
        self._forget_gone_claims()
        ns, claim = plan.namespace, plan.claim
        gc_jobs = self.reports.jobs(ns, claim)
        users = self.c.caches.all("claim_users", (ns, claim))
        oldest = min(users, key=lambda u: (u.created, u.owner.name), default=None)
        models = [m for u in users if (m := self.c.caches.one("models", (ns, u.owner.name)))]
        await self.reports.act_on_finished(ns, claim, gc_jobs, models)
        timer = oldest is not None and oldest.owner.name == key[1]
        if not self._evaluation_due(key, ns, claim, gc_jobs, timer):
            return
        if oldest is None or oldest.volume is None:
            return
        pvc = self.c.caches.one("pvcs", (ns, claim))
        if pvc is None:
            return
        await self._start_job(ns, claim, plan, pvc, users, oldest, models)

    def _forget_gone_claims(self) -> None:
        """Drop what is remembered per claim once its PVC is gone and no model uses it (the
        maps grew with every claim ever seen, issue 31, 12)."""
        known = (set(self._checked) | set(self._swept) | self.reports.claims()
                 | set(self._lingering) | self.sweep_requested)
        for k in known:
            if self.c.caches.one("pvcs", k) is None and not self.c.caches.all("claim_users", k):
                for m in (self._checked, self._swept, self._lingering):
                    m.pop(k, None)
                self.reports.forget_claim(k)
                self.sweep_requested.discard(k)

    def _evaluation_due(
        self, key: ModelKey, ns: str, claim: str, gc_jobs: list[dict[str, Any]], timer: bool
    ) -> bool:
        """Whether to evaluate the claim now (and requeue its timer user for the next time)."""
        clock = time.monotonic()
        checked = self._checked.get((ns, claim))
        interval = self.c.policy.gc_interval_seconds
        if (checked is not None and clock - checked < interval
                and not self._requested(ns, claim, clock, interval)):
            if timer:
                self.c.queue.add_after(key, interval - (clock - checked))
            return False
        if timer:
            self.c.queue.add_after(key, interval)
        if any(not jobs.finished(j) for j in gc_jobs):
            return False  # one GC Job at a time per claim (a requested sweep waits for it)
        self._checked[(ns, claim)] = clock
        return True

    def _requested(self, ns: str, claim: str, clock: float, interval: float) -> bool:
        """A sweep was asked for (a model left the claim) and may run before the claim's next
        evaluation: not while the last one found a deleted model's Deployment still there
        (a finalizer): that one is asked for again every ``interval`` only, not at each GC
        Job's completion (issue 31, 5: a GC Job after another as fast as their pods ran)."""
        if (ns, claim) not in self.sweep_requested:
            return False
        lingered = self._lingering.get((ns, claim))
        return lingered is None or clock - lingered >= interval

    def _uses(
        self, ns: str, models: list[dict[str, Any]], oldest_name: str, plan: Any
    ) -> tuple[list[ClaimUse], Any]:
        """Each user's spec key and status artifacts; the oldest user's plan (for the Job).

        A user whose engine image the allow-list refuses never lends its image to the GC Job:
        the oldest allowed user's plan does (None: no user's image is allowed).
        """
        uses, job_plan, allowed = [], plan, []
        for m in models:
            try:
                spec = SpyreModelSpec.model_validate(m.get("spec") or {})
                m_plan = plan_model(
                    m["metadata"]["name"], ns, m["metadata"].get("uid", ""), spec,
                    self.c.policy.site,
                )
                spec_key = m_plan.key
                if m["metadata"]["name"] == oldest_name:
                    job_plan = m_plan  # the oldest user's image and placement, like its PVC
                if not m_plan.image_refusal:
                    allowed.append((m.get("metadata", {}).get("creationTimestamp") or "", m_plan))
            except Exception:  # noqa: BLE001 - an invalid spec needs nothing
                spec_key = None
            artifacts = ((m.get("status") or {}).get("cache") or {}).get("artifacts") or []
            uses.append(ClaimUse(m["metadata"]["name"], spec_key, list(artifacts)))
        if job_plan.image_refusal:
            job_plan = min(allowed, key=lambda a: (a[0], a[1].name))[1] if allowed else None
        return uses, job_plan

    def _protected(self, ns: str, claim: str) -> set[str]:
        """Keys of the claim in use now, as far as the caches show: written by a precompile
        Job that has not finished, or served by any Deployment of the namespace that mounts
        the claim, not only its users' (a model that moved to another claim, or whose spec
        is invalid now, still serves from this one until its rollout ends). The GC pod checks
        again, with the pods and Jobs of the moment, right before each removal."""
        protected = set()
        for j in self.c.caches.all("claim_jobs", (ns, claim)):
            k = (j["metadata"].get("annotations") or {}).get(names.ARTIFACT_KEY_ANNOTATION)
            if k and not jobs.finished(j):
                protected.add(k)
        for dk in list((self.c.caches.indices.get("deployments") or {}).keys()):
            d = self.c.caches.one("deployments", dk) if dk[0] == ns else None
            k = served_key_of(d)
            if d is not None and k and mounts_claim(d, claim):
                protected.add(k)
        return protected

    async def _start_job(
        self,
        ns: str,
        claim: str,
        plan: Any,
        pvc: dict[str, Any],
        users: list[Any],
        oldest: Any,
        models: list[dict[str, Any]],
    ) -> None:
        """Create the GC Job for the claim's due keys (and a due sweep), if any."""
        clock = time.monotonic()
        protected = self._protected(ns, claim)
        uses, job_plan = self._uses(ns, models, oldest.owner.name, plan)
        if job_plan is None:
            return  # no user's engine image is allowed: nothing may run on the claim
        retention, now = oldest.volume.retention, self.c.clock()
        remove = keys_to_remove(
            claim, (pvc.get("metadata") or {}).get("uid"), uses, protected, retention, now
        )
        # Removed by a finished GC Job, but the users' status may not say so yet.
        removed = await self.reports.collected(ns, claim)
        remove = [k for k in remove if k not in removed]
        due = retention.enabled and self._sweep_due(ns, claim, retention, now, clock)
        if not remove and not due:
            return
        # Every GC Job also sweeps (it runs anyway); only a due sweep is a new decision, named
        # by its time: the same removal alone never makes a second Job.
        keep, lingering = self._known_keys(ns, claim, uses, protected)
        sweep = Sweep(frozenset(keep), retention.unused_for_seconds, now if due else "",
                      keep_models=frozenset(named_models(self._namespace_models(ns))))
        gc_job = build_gc_job(job_plan, remove, [u.owner for u in users], sweep)
        name = gc_job.metadata.name if gc_job.metadata else ""
        if self.c.caches.one("jobs", (ns, name)) is not None:
            return  # this very set was collected already (or is being)
        if not self.c.may_write():
            return
        # The GC pod's own access (list pods, Jobs, Deployments), applied again every time:
        # it may have been removed with the models that needed it last.
        for obj in build_gc_access(ns, [u.owner for u in users]):
            await self.c.applier.apply(obj, None)
        log.info(
            "cache claim %s/%s: removing unused artifacts %s%s (GC pod placed like %s's "
            "precompile)",
            ns,
            claim,
            remove,
            ", sweeping orphans" if due else "",
            job_plan.owner.name,
        )
        await self.c.applier.ensure_job(gc_job, None)
        if due:
            self._swept[(ns, claim)] = clock
            if lingering:  # sweep again (every interval) until the Deployment is gone
                self._lingering[(ns, claim)] = clock
            else:
                self.sweep_requested.discard((ns, claim))
                self._lingering.pop((ns, claim), None)

    def _sweep_due(self, ns: str, claim: str, retention: Any, now: str, clock: float) -> bool:
        """Sweep the claim for orphans: a SpyreModel left it, an orphan the last sweep found
        is due, or none ran for ``unusedForSeconds`` (at least SWEEP_MIN_PERIOD_SECONDS)."""
        if (ns, claim) in self.sweep_requested and not (
            (ns, claim) in self._lingering and self._deleted_models_deployment_lingers(ns)
        ):
            # A sweep that found a deleted model's Deployment still there (a finalizer) kept its
            # key: another would keep it again. It waits for the Deployment to go (issue 47, 2;
            # one GC Job a GC interval, each kept an hour, before).
            return True
        pending = [*(self.reports.orphans.get((ns, claim)) or {}).values()]
        if (ns, claim) in self.reports.models_pending:
            pending.append(self.reports.models_pending[(ns, claim)])
        t = epoch(now)
        if pending and t is not None and t - min(pending) >= retention.unused_for_seconds:
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
        statuses = [m.get("status") or {} for m in self._namespace_models(ns)]
        served, lingering = set(), False
        for d in self._served_deployments(ns):
            served.add(str(served_key_of(d)))
            lingering = lingering or self._of_a_deleted_model(ns, d)
        keys = known_keys(claim, statuses, [u.spec_key for u in uses], protected | served)
        return keys, lingering

    def _namespace_models(self, ns: str) -> list[dict[str, Any]]:
        """Every SpyreModel of the namespace in the caches (users of the claim or not: a
        claim is the namespace's, and what one names may be served from it)."""
        models = self.c.caches.indices.get("models") or {}
        return [m for k in list(models.keys()) if k[0] == ns
                and (m := self.c.caches.one("models", k)) is not None]

    def _served_deployments(self, ns: str) -> list[dict[str, Any]]:
        """The namespace's Deployments that serve an artifact key (the watch cache)."""
        deployments = self.c.caches.indices.get("deployments") or {}
        out = []
        for dk in list(deployments.keys()):
            d = self.c.caches.one("deployments", dk) if dk[0] == ns else None
            if d is not None and served_key_of(d):
                out.append(d)
        return out

    def _of_a_deleted_model(self, ns: str, d: dict[str, Any]) -> bool:
        owners = [r.get("name") for r in d["metadata"].get("ownerReferences") or []
                  if r.get("kind") == "SpyreModel"]  # fmt: skip
        return bool(owners) and not any(self.c.caches.one("models", (ns, o)) for o in owners)

    def _deleted_models_deployment_lingers(self, ns: str) -> bool:
        """A deleted SpyreModel's Deployment is still in the namespace (a finalizer)."""
        return any(self._of_a_deleted_model(ns, d) for d in self._served_deployments(ns))


__all__ = [
    "ClaimUse",
    "GarbageCollector",
    "GcReports",
    "GcResult",
    "epoch",
    "keys_to_remove",
    "mounts_claim",
    "known_keys",
    "named_models",
    "parse_gc_result",
    "removed_record",
    "still_listed",
    "with_removed",
]
