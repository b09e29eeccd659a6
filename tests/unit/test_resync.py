"""Ghosts after a watch gap (issue 31, 1): kopf's indices keep what was deleted while the
watches were broken; the operator's re-list (resync.py) finds them, every cache read skips
them, and what they concern is decided again as a fresh operator would."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from spyre_operator.control.controller import Caches, Controller
from spyre_operator.control.resync import Resync
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names

from .samples import model
from .test_budget import Cluster, drain, reason, spec
from .test_precompile_lifecycle import PodsAndEvents, live_job
from .test_reconcile import NOW, plan_for
from .test_reconcile_correctness import bound


class Lister(PodsAndEvents):
    """The API server's answer to the re-list: these objects exist, nothing else."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        super().__init__([], [])
        self.objects = objects
        self.listed: list[tuple[str, str | None]] = []

    def list(self, resource: type, namespace: str | None = None, **selectors: Any) -> Any:
        name = resource.__name__
        if name not in {"Pod", "Event"}:
            self.listed.append((name, namespace))
            items = self.objects.get(name, [])

            async def gen() -> Any:
                for item in items:
                    yield SimpleNamespace(metadata=SimpleNamespace(**item["metadata"]))
            return gen()
        return super().list(resource, namespace, **selectors)


def test_a_model_and_its_job_deleted_during_a_watch_gap_hold_no_compile_slot() -> None:
    """A deleted precompile Job counted against the compile budget for good ("1 of 1
    precompile slots in use" cluster-wide) and the deleted model was reconciled again."""
    gone, waiting = model("gone", spec(1)), model("waits", spec(2))
    gone["metadata"]["uid"], waiting["metadata"]["uid"] = "uid-gone", "uid-waits"
    job = live_job(gone)  # running: it holds the one slot (its model's status names it)
    gone["status"] = {"artifact": {"key": plan_for(gone).key, "phase": "Compiling",
                                   "jobName": job["metadata"]["name"]}}
    claim = plan_for(waiting).claim
    pvc = {**bound(), "metadata": {**bound()["metadata"], "name": claim, "namespace": "ns",
                                   "uid": "pvc-1"}}
    caches = Caches({
        "models": {("ns", "gone"): [gone], ("ns", "waits"): [waiting]},
        "jobs": {("ns", job["metadata"]["name"]): [job]},
        "claim_jobs": {("ns", claim): [job]},
        "deployments": {},
        "pvcs": {("ns", claim): [pvc]},
    })
    lister = Lister({"SpyreModel": [waiting], "Job": [], "PersistentVolumeClaim": [pvc]})
    c = Controller(client=lister, caches=caches, workers=1,  # type: ignore[arg-type]
                   clock=lambda: NOW, max_concurrent_compiles=1)
    applier = Cluster(caches)
    c.applier = applier  # type: ignore[assignment]

    async def run() -> None:
        c.enqueue([("ns", "waits")])
        await drain(c)
        assert reason(c, "waits") == C.WAITING_FOR_COMPILE_SLOT
        assert c.budgets.compiles_in_use() == 1
        # the watches break; "gone" and its Job are deleted; kopf re-lists: both stay
        found = await Resync(c, lister, None, period=0).once()  # type: ignore[arg-type]
        assert {g.index for g in found} >= {"models", "jobs", "claim_jobs"}
        assert caches.one("models", ("ns", "gone")) is None
        assert caches.keys("models") == [("ns", "waits")]
        assert c.budgets.compiles_in_use() == 0
        queued = list(c.queue._queued)
        assert ("ns", "gone") in queued and ("ns", "waits") in queued, queued
        await drain(c)
        # the waiting model compiles; nothing is written for the deleted one
        assert reason(c, "waits") != C.WAITING_FOR_COMPILE_SLOT, reason(c, "waits")
        assert applier.created == [plan_for(waiting).job_name], applier.created
        # a second round finds the same ghosts (recomputed, not new): nothing more to do
        assert await Resync(c, lister, None, period=0).once() != []  # a fresh one: new
        r = Resync(c, lister, None, period=0)  # type: ignore[arg-type]
        await r.once()
        assert await r.once() == []
        await c.stop()

    asyncio.run(run())


def test_an_object_the_list_still_has_is_no_ghost_and_a_failed_list_keeps_the_last_answer(
) -> None:
    m = model("m", spec(1))
    m["metadata"]["uid"] = "uid-m"
    caches = Caches({"models": {("ns", "m"): [m]}})
    ok = Lister({"SpyreModel": [m]})
    c = Controller(client=ok, caches=caches, workers=1,  # type: ignore[arg-type]
                   clock=lambda: NOW)

    class Broken(Lister):
        def list(self, resource: type, namespace: str | None = None, **selectors: Any) -> Any:
            raise ConnectionError("the API server is restarting")

    async def run() -> None:
        r = Resync(c, ok, ["ns", "other"], period=0)  # type: ignore[arg-type]
        assert await r.once() == []
        assert caches.one("models", ("ns", "m")) is not None
        assert ("SpyreModel", "ns") in ok.listed and ("SpyreModel",
                                                              "other") in ok.listed
        r.client = Lister({"SpyreModel": []})  # type: ignore[assignment]
        assert [g.key for g in await r.once()] == [("ns", "m")]
        r.client = Broken({})  # type: ignore[assignment]
        await r.once()
        assert caches.ghosts == frozenset({"uid-m"})  # kept while the list fails
        # created again under the same name: another UID, not a ghost
        again = {**m, "metadata": {**m["metadata"], "uid": "uid-m2"}}
        caches.indices["models"][("ns", "m")] = [again]  # type: ignore[index]
        r.client = Lister({"SpyreModel": [again]})  # type: ignore[assignment]
        await r.once()
        assert caches.ghosts == frozenset() and caches.one("models", ("ns", "m")) is again
        await c.stop()

    asyncio.run(run())


def test_the_names_of_the_managed_label_match_the_handlers() -> None:
    from spyre_operator import handlers
    from spyre_operator.control import resync

    assert resync.MANAGED == handlers.MANAGED
    assert names.MANAGED_BY in resync.MANAGED


def test_a_model_deleted_during_a_watch_gap_gets_nothing_created_before_the_resync_runs(
) -> None:
    """Between the watches' return and the re-list's next round, events (a child re-listed,
    then deleted by the garbage collector) reconcile the deleted model from the caches: each
    created its Service again, and its Job took the only compile slot (CI of e455f07). A
    create asks the API server first; nothing is created for a model it does not have, and
    the model waiting behind it compiles."""
    gone, waiting = model("gone", spec(1)), model("waits", spec(2))
    gone["metadata"]["uid"], waiting["metadata"]["uid"] = "uid-gone", "uid-waits"
    claim = plan_for(waiting).claim
    pvc = {**bound(), "metadata": {**bound()["metadata"], "name": claim, "namespace": "ns",
                                   "uid": "pvc-1"}}
    caches = Caches({
        "models": {("ns", "gone"): [gone], ("ns", "waits"): [waiting]},
        "jobs": {}, "claim_jobs": {}, "deployments": {},
        "pvcs": {("ns", claim): [pvc]},
    })
    c = Controller(client=Lister({}), caches=caches, workers=1,  # type: ignore[arg-type]
                   clock=lambda: NOW, max_concurrent_compiles=1)
    applier = Cluster(caches)
    applier.gone = {"uid-gone"}  # deleted while the watches were broken; the caches kept it
    c.applier = applier  # type: ignore[assignment]

    async def run() -> None:
        c.enqueue([("ns", "gone"), ("ns", "waits")])
        await drain(c)
        assert applier.created == [plan_for(waiting).job_name], applier.created
        assert reason(c, "waits") != C.WAITING_FOR_COMPILE_SLOT, reason(c, "waits")
        assert c.budgets.compiles_in_use() == 1  # the waiting model's, not the ghost's
        await c.stop()

    asyncio.run(run())
