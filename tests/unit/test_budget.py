"""Cluster-wide budgets of precompile Jobs and serving rollouts (control/budgets.py): decide()
with the budget's answer in Observed, and the controller counting slots from its caches, keeping the
waiting models in order and waking them when a slot frees (pure of any cluster: a recording
applier stands in for the API, the test moves Jobs and Deployments along)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from spyre_operator.cli import main as cli_main
from spyre_operator.control import budgets as B
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.decide import Observed, decide, served_key
from spyre_operator.decide import conditions as C
from spyre_operator.decide.rollout import deployment_rolling, record
from spyre_operator.desired import names
from spyre_operator.kube.apply import is_subset, with_applied_hash

from .samples import GENERATE, model
from .test_controller_failures import RecordingApplier
from .test_precompile_lifecycle import PodsAndEvents, live_job
from .test_reconcile import NOW, cond, deployment_obj, plan_for
from .test_reconcile_correctness import bound

FULL = B.Slot(free=False, in_use=3, limit=3, position=5)


def spec(i: int, image: str = "registry.local/engine:1") -> dict[str, Any]:
    """A model of its own shape (its own artifact key) on the shared default claim."""
    return {"model": {"uri": f"hf://ibm-granite/granite-3.3-8b-instruct@{i:06x}"},
            "engine": {"image": image}}


def served(m: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``m`` serving its artifact (compiled, Job gone), and its Deployment."""
    obs = Observed(cache_pvc=bound(), job=live_job(m, "Complete"))
    first = decide(m, obs, NOW)
    obs.deployment = deployment_obj(first, ready=1)
    m = {**m, "status": decide(m, obs, NOW).status}
    return m, obs.deployment


def edited(m: dict[str, Any], image: str) -> dict[str, Any]:
    out = copy.deepcopy(m)
    out["spec"]["engine"] = {"image": image}
    out["metadata"]["generation"] = m["metadata"]["generation"] + 1
    return out


# ---------------------------------------------------------------- decide() with the answer


def test_a_full_compile_budget_creates_no_job_and_says_why() -> None:
    m = model("m", GENERATE)
    d = decide(m, Observed(cache_pvc=bound(), compile_slot=FULL), NOW)
    assert d.job is None
    art = cond(d, C.ARTIFACT_READY)
    assert (art["status"], art["reason"]) == (C.FALSE, C.WAITING_FOR_COMPILE_SLOT)
    assert art["message"].startswith(
        "3 of 3 precompile slots in use (max-concurrent-compiles); queued 5th")
    prog = cond(d, C.PROGRESSING)
    assert (prog["status"], prog["reason"]) == (C.TRUE, C.WAITING_FOR_COMPILE_SLOT)
    # a first-time model serves nothing yet: Ready says it waits its turn
    assert cond(d, C.READY)["reason"] == C.WAITING_FOR_COMPILE_SLOT
    assert d.status["artifact"]["phase"] == "Pending"
    assert d.status["artifact"]["waitingSince"] == NOW
    assert d.requeue_after == B.WAITING_RECHECK_SECONDS
    # a Normal Event: waiting is not a fault
    assert [t for t, _, _ in d.events] == ["Normal"]
    assert f"ArtifactReady=False {C.WAITING_FOR_COMPILE_SLOT}" in d.events[0][2]
    # waiting keeps the time it started waiting; a free slot creates the Job and forgets it
    m["status"] = d.status
    later = "2026-11-21T10:07:00Z"
    assert decide(m, Observed(cache_pvc=bound(), compile_slot=FULL), later).status[
        "artifact"]["waitingSince"] == NOW
    go = decide(m, Observed(cache_pvc=bound()), later)
    assert go.job is not None and "waitingSince" not in go.status["artifact"]
    assert cond(go, C.ARTIFACT_READY)["reason"] == C.COMPILING


def test_a_model_whose_job_exists_keeps_it_whatever_the_budget() -> None:
    m = model("m", GENERATE)
    d = decide(m, Observed(cache_pvc=bound(), job=live_job(m, ready=1), compile_slot=FULL), NOW)
    assert d.job is not None and not d.delete
    assert cond(d, C.ARTIFACT_READY)["reason"] == C.COMPILING


def test_a_model_waiting_for_a_compile_slot_keeps_serving_the_old_artifact() -> None:
    m, dep = served(model("m", spec(0)))
    old_key = plan_for(m).key
    new = edited(m, "registry.local/engine:2")
    d = decide(new, Observed(cache_pvc=bound(), deployment=dep, compile_slot=FULL), NOW)
    assert d.job is None
    dep_out = next(o for o in d.apply if o.kind == "Deployment")
    assert served_key(dep_out.to_dict()) == old_key
    ready = cond(d, C.READY)
    assert (ready["status"], ready["reason"]) == (C.TRUE, C.SERVING_PREVIOUS_ARTIFACT)
    assert C.WAITING_FOR_COMPILE_SLOT in ready["message"]


def test_an_edit_reverted_while_waiting_never_creates_a_job() -> None:
    m, dep = served(model("m", spec(0)))
    new = edited(m, "registry.local/engine:2")
    waiting = decide(new, Observed(cache_pvc=bound(), deployment=dep, compile_slot=FULL), NOW)
    assert waiting.job is None
    back = edited({**new, "status": waiting.status}, "registry.local/engine:1")
    d = decide(back, Observed(cache_pvc=bound(), deployment=dep, compile_slot=FULL), NOW)
    assert d.job is None
    art = cond(d, C.ARTIFACT_READY)
    assert (art["status"], art["reason"]) == (C.TRUE, C.ARTIFACT_AVAILABLE)
    assert "waitingSince" not in d.status["artifact"]
    assert cond(d, C.PROGRESSING)["status"] == C.FALSE


def test_a_full_rollout_budget_keeps_the_old_artifact_serving() -> None:
    m, dep = served(model("m", spec(0)))
    old_key = plan_for(m).key
    new = edited(m, "registry.local/engine:2")
    full = B.Slot(free=False, in_use=2, limit=2, position=1)
    obs = Observed(cache_pvc=bound(), deployment=dep, job=live_job(new, "Complete"),
                   rollout_slot=full)
    d = decide(new, obs, NOW)
    dep_out = next(o for o in d.apply if o.kind == "Deployment")
    assert served_key(dep_out.to_dict()) == old_key, "switched while no rollout slot was free"
    assert d.status["servingArtifactKey"] == old_key
    assert cond(d, C.ARTIFACT_READY)["status"] == C.TRUE
    prog = cond(d, C.PROGRESSING)
    assert (prog["status"], prog["reason"]) == (C.TRUE, C.WAITING_FOR_ROLLOUT_SLOT)
    assert prog["message"].startswith(
        "2 of 2 rollout slots in use (max-concurrent-rollouts); queued 1st")
    ready = cond(d, C.READY)
    assert (ready["status"], ready["reason"]) == (C.TRUE, C.SERVING_PREVIOUS_ARTIFACT)
    assert d.requeue_after == B.WAITING_RECHECK_SECONDS
    # a free slot switches it
    obs.rollout_slot = B.FREE
    d = decide(new, obs, NOW)
    dep_out = next(o for o in d.apply if o.kind == "Deployment")
    assert served_key(dep_out.to_dict()) == plan_for(new).key


def test_the_rollout_budget_never_holds_a_first_deployment_or_one_serving_nothing() -> None:
    m = model("m", GENERATE)
    full = B.Slot(free=False, in_use=1, limit=1, position=1)
    d = decide(m, Observed(cache_pvc=bound(), job=live_job(m, "Complete"), rollout_slot=full),
               NOW)
    assert any(o.kind == "Deployment" for o in d.apply)
    m, dep = served(model("m", spec(0)))
    dep["status"]["availableReplicas"] = 0  # crashing: switching takes nothing from users
    new = edited(m, "registry.local/engine:2")
    d = decide(new, Observed(cache_pvc=bound(), deployment=dep, job=live_job(new, "Complete"),
                             rollout_slot=full), NOW)
    dep_out = next(o for o in d.apply if o.kind == "Deployment")
    assert served_key(dep_out.to_dict()) == plan_for(new).key


def test_waiting_order_is_oldest_first_then_by_name() -> None:
    w = B.Waiting()
    w.add(("ns", "b"), "2026-11-21T10:01:00Z")
    w.add(("ns", "a"), "2026-11-21T10:02:00Z")
    w.add(("ns", "c"), "2026-11-21T10:01:00Z")
    assert B.fair_first(0, {}, w) == [("ns", "b"), ("ns", "c"), ("ns", "a")]
    assert B.fair_slot(3, {"ns": 1}, w, ("ns", "c"), "2026-11-21T10:01:00Z") == B.Slot(
        True, 1, 3, 2, ns_in_use=1)
    assert B.fair_slot(3, {"ns": 2}, w, ("ns", "c"), "2026-11-21T10:01:00Z") == B.Slot(
        False, 2, 3, 2, ns_in_use=2)
    assert B.fair_slot(0, {"ns": 99}, w, ("ns", "z"), NOW).free  # 0: no limit
    assert [B.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"]


# ---------------------------------------------------------------- the controller counts


class Cluster(RecordingApplier):
    """A recording applier that also lands the writes in the controller's caches, as the
    watch would deliver them (Jobs running, status written, Deployments as applied)."""

    def __init__(self, caches: Caches) -> None:
        super().__init__()
        self.caches = caches
        self.created: list[str] = []
        #: Jobs do not reach the cache (the watch lags behind the writes).
        self.lag = False

    async def ensure_job(self, job: Any, live: Any) -> bool:
        await super().ensure_job(job, live)
        if live is None:
            body = job.to_dict()
            body["metadata"].update(uid=f"uid-{body['metadata']['name']}", resourceVersion="1")
            body["status"] = {"active": 1, "ready": 1}
            self.created.append(body["metadata"]["name"])
            if self.lag:
                return True
            self.caches.indices["jobs"][(body["metadata"]["namespace"],
                                         body["metadata"]["name"])] = [body]
        return True

    async def apply(self, obj: Any, live: Any) -> bool:
        await super().apply(obj, live)
        if obj.kind == "Deployment":
            body = obj.to_dict()
            k = (body["metadata"]["namespace"], body["metadata"]["name"])
            old = self.caches.one("deployments", k)
            if old is None or served_key(old) != served_key(body):
                gen = ((old or {}).get("metadata") or {}).get("generation", 0) + 1
                body["metadata"]["generation"] = gen
                body["status"] = {"observedGeneration": gen, "replicas": 2,
                                  "updatedReplicas": 1, "availableReplicas": 1}  # rolling
                self.caches.indices["deployments"][k] = [body]
        return True

    async def apply_status(self, name: str, ns: str, status: dict[str, Any],
                           current: dict[str, Any] | None) -> str | None:
        rv = await super().apply_status(name, ns, status, current)
        m = self.caches.one("models", (ns, name))
        if m is not None and rv is not None:
            self.caches.indices["models"][(ns, name)] = [
                {**m, "status": status, "metadata": {**m["metadata"], "resourceVersion": rv}}]
        return rv


def cluster(models: list[dict[str, Any]], compiles: int = 3, rollouts: int = 0,
            deployments: dict[str, dict[str, Any]] | None = None) -> tuple[Controller, Cluster]:
    claim = plan_for(models[0]).claim
    caches = Caches({
        "models": {(m["metadata"]["namespace"], m["metadata"]["name"]): [m] for m in models},
        "jobs": {},
        "deployments": {("ns", names.server_name(n)): [d]
                        for n, d in (deployments or {}).items()},
        "pvcs": {("ns", claim): [{**bound(), "metadata": {
            **bound()["metadata"], "name": claim, "namespace": "ns"}}]},
    })
    c = Controller(client=PodsAndEvents([], []), caches=caches,  # type: ignore[arg-type]
                   workers=1, clock=lambda: NOW, max_concurrent_compiles=compiles,
                   max_concurrent_rollouts=rollouts)
    applier = Cluster(caches)
    c.applier = applier  # type: ignore[assignment]
    return c, applier


async def drain(c: Controller) -> list[tuple[str, str]]:
    """Reconcile every queued model (in queue order) until the queue is empty."""
    done = []
    while c.queue._queued:
        key = await c.queue.get()
        await c.reconcile_key(key)
        c.queue.done(key)
        done.append(key)
    return done


def running(c: Controller) -> list[dict[str, Any]]:
    return [j for (j,) in c.caches.indices["jobs"].values()
            if not (j.get("status") or {}).get("conditions")]


async def event(c: Controller, body: dict[str, Any], type_: str = "MODIFIED") -> None:
    """The watch event on a child, through the kopf layer's handler."""
    from spyre_operator.handlers import on_child

    await on_child(type=type_, namespace="ns", body=body,  # type: ignore[arg-type]
                   memo={"controller": c})  # type: ignore[arg-type]


async def finish(c: Controller, job: dict[str, Any], state: str = "Complete") -> None:
    """The Job ends (its watch event goes through handlers.on_child)."""
    job["status"] = {"conditions": [{"type": state, "status": "True",
                                     "lastTransitionTime": NOW}],
                     "startTime": NOW, "completionTime": NOW if state == "Complete" else None}
    await event(c, job)


def reason(c: Controller, name: str, type_: str = C.ARTIFACT_READY) -> str:
    m = c.caches.one("models", ("ns", name)) or {}
    return str((C.find((m.get("status") or {}).get("conditions"), type_) or {}).get("reason"))


def test_a_freed_slot_goes_to_the_model_that_waited_longest() -> None:
    models = [model(f"m{i}", spec(i)) for i in range(3)]
    models.append(model("late", spec(7)))
    models.append(model("early", spec(8)))
    c, cl = cluster(models, compiles=3)

    async def run() -> None:
        c.enqueue([("ns", f"m{i}") for i in range(3)])
        await drain(c)
        assert len(running(c)) == 3
        c.clock = lambda: "2026-11-21T10:01:00Z"
        c.enqueue([("ns", "early")])
        await drain(c)
        c.clock = lambda: "2026-11-21T10:02:00Z"
        c.enqueue([("ns", "late")])
        await drain(c)
        assert reason(c, "early") == reason(c, "late") == C.WAITING_FOR_COMPILE_SLOT
        assert "queued 1st" in (C.find(c.caches.one("models", ("ns", "early"))["status"][
            "conditions"], C.ARTIFACT_READY) or {})["message"]
        assert "queued 2nd" in (C.find(c.caches.one("models", ("ns", "late"))["status"][
            "conditions"], C.ARTIFACT_READY) or {})["message"]
        assert len(cl.created) == 3
        # a Job fails: its slot frees, and only the model that waited longest is woken
        await finish(c, running(c)[0], "Failed")
        assert ("ns", "early") in c.queue._queued and ("ns", "late") not in c.queue._queued
        # even if both reconcile, only the oldest gets the slot
        c.enqueue([("ns", "late")])
        await drain(c)
        assert cl.created[-1] == plan_for(models[4]).job_name and len(cl.created) == 4
        assert reason(c, "early") == C.COMPILING
        assert reason(c, "late") == C.WAITING_FOR_COMPILE_SLOT

    asyncio.run(run())


def test_ten_models_upgraded_under_a_budget_of_three_compile_three_at_a_time() -> None:
    """An engine-image change on 10 serving models: at most 3 precompile Jobs at any moment,
    the old artifacts serve until each new one is ready, and all 10 end on the new image."""
    before = [served(model(f"m{i}", spec(i))) for i in range(10)]
    models = [edited(m, "registry.local/engine:2") for m, _ in before]
    deps = {m["metadata"]["name"]: d for (m, _), (_, d) in zip(before, before, strict=True)}
    c, cl = cluster(models, compiles=3, rollouts=0, deployments=deps)
    peak = 0

    async def run() -> None:
        nonlocal peak
        c.enqueue([("ns", f"m{i}") for i in reversed(range(10))])
        for _ in range(40):
            await drain(c)
            jobs = running(c)
            peak = max(peak, len(jobs))
            assert len(jobs) <= 3, f"{len(jobs)} precompile Jobs at once"
            for i, (m, _) in enumerate(before):
                key = served_key(c.caches.one("deployments", ("ns", names.server_name(
                    f"m{i}"))))
                assert key in (plan_for(m).key, plan_for(models[i]).key)
            if not jobs:
                break
            await finish(c, jobs[0])
        # the first three reconciled found free slots; then the waiting ones went oldest
        # first (they all started waiting at once: by name)
        order = [9, 8, 7, 0, 1, 2, 3, 4, 5, 6]
        assert cl.created == [plan_for(models[i]).job_name for i in order]
        for i, m in enumerate(models):
            dep = c.caches.one("deployments", ("ns", names.server_name(f"m{i}")))
            assert served_key(dep) == plan_for(m).key
            assert reason(c, f"m{i}") == C.ARTIFACT_AVAILABLE

    asyncio.run(run())
    assert peak == 3


def test_models_sharing_a_key_take_one_slot_and_one_job() -> None:
    a, b = model("a", spec(0)), model("b", spec(0))
    other = model("o", spec(1))
    c, cl = cluster([a, b, other], compiles=2)

    async def run() -> None:
        c.enqueue([("ns", "a"), ("ns", "b"), ("ns", "o")])
        await drain(c)

    asyncio.run(run())
    assert cl.created == [plan_for(a).job_name, plan_for(other).job_name]
    assert c.budgets.compiles_in_use() == 2
    assert reason(c, "b") == C.COMPILING


def test_a_restarted_operator_keeps_the_waiting_order_and_counts_from_its_caches() -> None:
    models = [model(f"m{i}", spec(i)) for i in range(4)]
    c, cl = cluster(models, compiles=1)

    async def first_run() -> None:
        c.enqueue([("ns", "m0")])
        await drain(c)
        c.clock = lambda: "2026-11-21T10:03:00Z"
        c.enqueue([("ns", "m3")])
        await drain(c)
        c.clock = lambda: "2026-11-21T10:04:00Z"
        c.enqueue([("ns", "m1"), ("ns", "m2")])
        await drain(c)

    asyncio.run(first_run())
    assert reason(c, "m3") == C.WAITING_FOR_COMPILE_SLOT
    # m0's Job finishes while the operator is down; a new process (or a new leader) starts
    # from the same caches with nothing in memory, and reconciles m1 before m3
    running(c)[0]["status"] = {"conditions": [{"type": "Complete", "status": "True"}],
                               "completionTime": NOW}
    fresh = Controller(client=PodsAndEvents([], []), caches=c.caches,  # type: ignore[arg-type]
                       workers=1, clock=lambda: "2026-11-21T10:09:00Z",
                       max_concurrent_compiles=1)
    fresh.applier = cl  # type: ignore[assignment]
    fresh.set_leader(True)  # enqueues every model: m0, m1, m2, m3
    assert fresh.budgets.compiles_in_use() == 0

    asyncio.run(drain(fresh))
    assert cl.created[1:] == [plan_for(models[3]).job_name], "m3 waited longest"
    assert reason(c, "m1") == reason(c, "m2") == C.WAITING_FOR_COMPILE_SLOT


def test_a_replica_that_loses_the_lease_forgets_its_reservations_and_waiting_list() -> None:
    """The next leader (maybe this replica again) counts from the caches and rebuilds the
    waiting list from status: nothing the old leader held in memory can block a slot."""
    models = [model(f"m{i}", spec(i)) for i in range(3)]
    c, cl = cluster(models, compiles=1)
    cl.lag = True  # the Job m0 created never reaches the cache (it was refused after all)

    async def run() -> None:
        c.enqueue([("ns", "m0"), ("ns", "m1")])
        await drain(c)

    asyncio.run(run())
    assert c.budgets.compiles_in_use() == 1 and ("ns", "m1") in c.budgets.compile_waiting
    c.set_leader(False)
    assert c.budgets.compiles_in_use() == 0
    c.clock = lambda: "2026-11-21T10:05:00Z"  # m0 asks again now; m1 has waited since NOW
    c.set_leader(True)
    asyncio.run(drain(c))
    assert cl.created[1:] == [plan_for(models[1]).job_name], "m1 waited: it goes first"


def test_jobs_the_cache_does_not_show_yet_hold_their_slot() -> None:
    """Concurrent reconciles decide before the watch brings the Job one of them created."""
    a, b, other = model("a", spec(0)), model("b", spec(0)), model("o", spec(1))
    c, cl = cluster([a, b, other], compiles=1)
    cl.lag = True

    async def run() -> None:
        c.enqueue([("ns", "a"), ("ns", "o"), ("ns", "b")])
        await drain(c)

    asyncio.run(run())
    assert c.caches.indices["jobs"] == {}, "the watch has not delivered"
    # o waits; b shares a's Job (the same one, created twice is a 409 the apply layer takes)
    assert cl.created == [plan_for(a).job_name, plan_for(b).job_name]
    assert plan_for(a).job_name == plan_for(b).job_name
    assert reason(c, "o") == C.WAITING_FOR_COMPILE_SLOT
    assert c.budgets.compiles_in_use() == 1


def _squatter(kind: str, ns: str, name: str, owner: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    """A Job or Deployment a namespace editor made with the operator's labels (issue 45, 1):
    running for good, or rolling for good."""
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                            "labels": {names.MANAGED_BY: names.MANAGED_BY_VALUE,
                                       names.COMPONENT: names.COMPONENT_PRECOMPILE
                                       if kind == "Job" else "server"}}  # fmt: skip
    if owner is not None:
        meta["ownerReferences"] = [owner]
    if kind == "Job":
        return {"metadata": meta, "spec": {"suspend": True}, "status": {}}
    return {"metadata": {**meta, "generation": 1}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                       "availableReplicas": 0}}  # fmt: skip


def test_labelled_objects_the_operator_did_not_make_hold_no_slot() -> None:
    """Issue 45, 1: the budgets counted every unfinished Job and every rolling Deployment with
    the operator's labels, in any namespace: a namespace editor's suspended Jobs and
    never-scheduled Deployments stalled every compile and switch in the cluster. A slot is
    held only by what a SpyreModel of the object's namespace owns (by name and UID) and names
    as its own: its status' Job, its Deployments by their derived names."""
    m, tenant = model("m", spec(0)), model("t", spec(1), ns="team-b")
    c, cl = cluster([m, tenant], compiles=1, rollouts=1)
    forged = {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel", "name": "t",
              "uid": "not-its-uid", "controller": True}  # fmt: skip
    real = {**forged, "uid": "uid-t"}
    squat = [("team-b", "free-for-all", None), ("team-b", "forged", forged),
             ("team-b", "owned-not-named", real)]
    for ns, name, owner in squat:
        c.caches.indices["jobs"][(ns, name)] = [_squatter("Job", ns, name, owner)]
        c.caches.indices["deployments"][(ns, name)] = [_squatter("Deployment", ns, name, owner)]
    assert c.budgets.compiles_in_use() == 0 and c.budgets.rollouts_in_use() == 0

    async def run() -> None:
        c.enqueue([("ns", "m")])
        await drain(c)

    asyncio.run(run())
    assert cl.created == [plan_for(m).job_name], "m compiled: the squatters hold no slot"
    assert reason(c, "m") == C.COMPILING
    assert c.budgets.compiles_in_use() == 1, "the operator's own Job holds its slot"


def test_a_retry_under_the_same_job_name_holds_its_slot_until_the_cache_shows_it() -> None:
    """A failed Job is deleted for its retry; the new one has the same name, and the cache
    still holds the deleted one when the retry is created."""
    a, o = model("a", spec(0)), model("o", spec(1))
    c, cl = cluster([a, o], compiles=1)
    cl.lag = True
    old = live_job(a, "Failed")
    c.caches.indices["jobs"][("ns", old["metadata"]["name"])] = [old]
    c.writer.deleted_jobs[old["metadata"]["uid"]] = 0.0
    c.writer._expire_deleted_jobs = lambda: None  # type: ignore[method-assign]

    async def run() -> None:
        c.enqueue([("ns", "a")])
        await drain(c)
        assert cl.created == [old["metadata"]["name"]]
        c.enqueue([("ns", "o")])
        await drain(c)

    asyncio.run(run())
    assert reason(c, "o") == C.WAITING_FOR_COMPILE_SLOT
    assert c.budgets.compiles_in_use() == 1


def test_a_job_the_api_server_refused_frees_its_slot() -> None:
    """A's Job is refused (a quota): the reconcile fails with the API server's message (the
    worker backs off and retries), the slot it reserved is freed, and the next model's Job is
    created in it."""
    from lightkube import ApiError
    from lightkube.models.meta_v1 import Status
    from spyre_operator.control.common import RejectedWrites

    a, b = model("a", spec(0)), model("b", spec(1))
    c, cl = cluster([a, b], compiles=1)
    ensure_job = cl.ensure_job

    async def refuse(job: Any, live: Any) -> bool:
        raise ApiError(status=Status(code=403, message="exceeded quota: count/jobs.batch"))

    cl.ensure_job = refuse  # type: ignore[method-assign]

    async def run() -> None:
        with pytest.raises(RejectedWrites, match="rejected Job .*exceeded quota"):
            await c.reconcile_key(("ns", "a"))
        assert c.budgets.compiles_in_use() == 0
        assert cl.created == []
        cl.ensure_job = ensure_job  # type: ignore[method-assign]  # the quota is raised
        c.enqueue([("ns", "b")])
        await drain(c)
        assert cl.created == [plan_for(b).job_name]
        assert c.budgets.compiles_in_use() == 1

    asyncio.run(run())


def test_a_model_that_stops_waiting_lets_the_next_one_go() -> None:
    models = [model(f"m{i}", spec(i)) for i in range(3)]
    c, cl = cluster(models, compiles=1)

    async def run() -> None:
        c.enqueue([("ns", "m0")])
        await drain(c)
        c.enqueue([("ns", "m1")])
        await drain(c)
        c.clock = lambda: "2026-11-21T10:01:00Z"
        c.enqueue([("ns", "m2")])
        await drain(c)
        assert len(cl.created) == 1
        # m1 is deleted while waiting: no Job is ever made for it
        del c.caches.indices["models"][("ns", "m1")]
        c.enqueue([("ns", "m1")])
        await drain(c)
        assert ("ns", "m1") not in c.budgets.compile_waiting
        await finish(c, running(c)[0])
        await drain(c)

    asyncio.run(run())
    assert cl.created == [plan_for(models[0]).job_name, plan_for(models[2]).job_name]


def test_rollouts_wait_for_a_slot_and_go_when_one_completes() -> None:
    before = [served(model(f"m{i}", spec(i))) for i in range(3)]
    models = [edited(m, "registry.local/engine:2") for m, _ in before]
    deps = {m["metadata"]["name"]: d for m, d in before}
    c, cl = cluster(models, compiles=0, rollouts=1, deployments=deps)
    for m in models:  # every new artifact compiled already
        job = live_job(m, "Complete")
        c.caches.indices["jobs"][("ns", job["metadata"]["name"])] = [job]

    def serving(i: int) -> str | None:
        return served_key(c.caches.one("deployments", ("ns", names.server_name(f"m{i}"))))

    async def run() -> None:
        c.enqueue([("ns", f"m{i}") for i in range(3)])
        await drain(c)
        switched = [i for i in range(3) if serving(i) == plan_for(models[i]).key]
        assert switched == [0], switched
        assert reason(c, "m1", C.PROGRESSING) == C.WAITING_FOR_ROLLOUT_SLOT
        assert serving(1) == plan_for(before[1][0]).key  # the old artifact keeps serving
        # m0's rollout completes: the watch event wakes the next model
        dep = c.caches.one("deployments", ("ns", names.server_name("m0")))
        dep["status"].update(replicas=1, updatedReplicas=1, availableReplicas=1)
        assert not deployment_rolling(dep)
        await event(c, {**dep, "kind": "Deployment"})
        assert list(c.queue._queued) == [("ns", "m0"), ("ns", "m1")]  # its owner, the waiter
        await drain(c)
        assert serving(1) == plan_for(models[1]).key
        assert serving(2) == plan_for(before[2][0]).key

    asyncio.run(run())


def _rolled_out(m: dict[str, Any], dep: dict[str, Any]) -> dict[str, Any]:
    """``m``'s Deployment after the reconcile that saw its rollout complete."""
    obs = Observed(cache_pvc=bound(), job=live_job(m, "Complete"), deployment=dep)
    return deployment_obj(decide(m, obs, NOW), ready=1)


def _scaled(dep: dict[str, Any], replicas: int, available: int) -> dict[str, Any]:
    """``dep`` scaled (by an HPA, KEDA or a user) to ``replicas``, ``available`` of them up:
    every pod of its template; the Deployment controller leaves ``Progressing`` at
    NewReplicaSetAvailable and never applies the progress deadline to a scale-up."""
    out = copy.deepcopy(dep)
    gen = out["metadata"]["generation"] + 1
    out["metadata"]["generation"] = gen
    out["spec"]["replicas"] = replicas
    out["status"] = {"observedGeneration": gen, "replicas": replicas, "updatedReplicas": replicas,
                     "readyReplicas": available, "availableReplicas": available,
                     "conditions": [{"type": "Progressing", "status": "True",
                                     "reason": "NewReplicaSetAvailable"}]}
    return out


def test_a_scale_up_waiting_for_cards_holds_no_rollout_slot() -> None:
    """Issue 31, 2: a completed rollout scaled past the cluster's cards (an HPA at capacity)
    counted as rolling for good, and with the budget full no model could switch artifacts."""
    m, dep = served(model("m0", spec(0)))
    assert names.ROLLED_OUT_LABEL not in dep["metadata"]["labels"]  # not up yet
    done = _rolled_out(m, dep)
    ident = record(f"{plan_for(m).key}/{plan_for(m).claim}")
    assert done["metadata"]["labels"][names.ROLLED_OUT_LABEL] == ident
    assert not deployment_rolling(_scaled(done, replicas=4, available=1))
    # kept by the next reconciles, whatever the availability
    again = _rolled_out(m, _scaled(done, replicas=4, available=1))
    assert again["metadata"]["labels"][names.ROLLED_OUT_LABEL] == ident
    # without the record (before the fix) the same Deployment held a slot
    bare = _scaled(done, replicas=4, available=1)
    del bare["metadata"]["labels"][names.ROLLED_OUT_LABEL]
    assert deployment_rolling(bare)
    # the record of an earlier build (the identity as an annotation) still counts
    legacy = copy.deepcopy(bare)
    legacy["metadata"]["annotations"][names.ROLLED_OUT_ANNOTATION] = (
        f"{plan_for(m).key}/{plan_for(m).claim}")
    assert not deployment_rolling(legacy)


def test_recording_a_rollout_changes_no_annotation() -> None:
    """The record of a completed rollout is left out of the applied hash: the apply that writes
    it changes no annotation, so the API server starts no new generation of the Deployment
    (with one, the rollout read as not done until the controller observed it, and
    Reconciling flapped back to True after `kubectl wait` had seen it False)."""
    m, dep = served(model("m0", spec(0)))
    starting = copy.deepcopy(dep)
    starting["status"]["availableReplicas"] = 0
    obs = Observed(cache_pvc=bound(), job=live_job(m, "Complete"), deployment=starting)
    before = with_applied_hash(next(o for o in decide(m, obs, NOW).apply
                                    if o.kind == "Deployment").to_dict())
    done = _rolled_out(m, dep)
    obs = Observed(cache_pvc=bound(), job=live_job(m, "Complete"), deployment=done)
    after = with_applied_hash(next(o for o in decide(m, obs, NOW).apply
                                   if o.kind == "Deployment").to_dict())
    assert names.ROLLED_OUT_LABEL in after["metadata"]["labels"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert not is_subset(after, before)  # the label is still written


def test_a_switch_holds_its_slot_until_its_new_pods_are_available() -> None:
    """The apply that switches the artifact drops the record: the new template's pods not yet
    available hold the slot even once the old pods are gone (maxUnavailable > 0)."""
    m, dep = served(model("m0", spec(0)))
    done = _rolled_out(m, dep)
    new = edited(m, "registry.local/engine:2")
    obs = Observed(cache_pvc=bound(), job=live_job(new, "Complete"), deployment=done)
    switched = next(o for o in decide(new, obs, NOW).apply if o.kind == "Deployment").to_dict()
    assert served_key(switched) == plan_for(new).key
    assert names.ROLLED_OUT_LABEL not in switched["metadata"]["labels"]
    live = {**switched, "metadata": {**switched["metadata"], "generation": 2},
            "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                       "availableReplicas": 0}}
    assert deployment_rolling(live)
    # old pods left: rolling whatever the record says
    assert deployment_rolling({**done, "status": {**done["status"], "replicas": 2}})


def test_a_switch_goes_while_another_model_waits_for_cards_to_scale_up() -> None:
    """Under a budget of one, a model scaled past the cluster's capacity does not stop
    another model's artifact switch."""
    m0, dep0 = served(model("m0", spec(0)))
    m1, dep1 = served(model("m1", spec(1)))
    scaled = _scaled(_rolled_out(m0, dep0), replicas=4, available=1)
    new = edited(m1, "registry.local/engine:2")
    c, _ = cluster([m0, new], compiles=0, rollouts=1,
                   deployments={"m0": scaled, "m1": _rolled_out(m1, dep1)})
    job = live_job(new, "Complete")
    c.caches.indices["jobs"][("ns", job["metadata"]["name"])] = [job]

    async def run() -> None:
        c.enqueue([("ns", "m1")])
        await drain(c)

    asyncio.run(run())
    dep = c.caches.one("deployments", ("ns", names.server_name("m1")))
    assert served_key(dep) == plan_for(new).key, reason(c, "m1", C.PROGRESSING)


def test_the_model_whose_artifact_was_ready_first_rolls_first() -> None:
    (x0, xd), (y0, yd), (other, busy) = (served(model(n, spec(i)))
                                        for i, n in enumerate(["x", "y", "busy"]))
    x, y = edited(x0, "registry.local/engine:2"), edited(y0, "registry.local/engine:2")
    busy["status"].update(updatedReplicas=0)  # another model's rollout holds the one slot
    c, cl = cluster([x, y, other], compiles=0, rollouts=1,
                    deployments={"x": xd, "y": yd, "busy": busy})
    for m, done in ((x, "2026-11-21T10:05:00Z"), (y, "2026-11-21T10:02:00Z")):
        job = live_job(m, "Complete")
        job["status"]["completionTime"] = done
        c.caches.indices["jobs"][("ns", job["metadata"]["name"])] = [job]

    async def run() -> None:
        c.enqueue([("ns", "x"), ("ns", "y")])
        await drain(c)
        assert reason(c, "x", C.PROGRESSING) == reason(c, "y", C.PROGRESSING) == (
            C.WAITING_FOR_ROLLOUT_SLOT)
        busy["status"].update(updatedReplicas=1)
        await event(c, {**busy, "kind": "Deployment"})
        assert ("ns", "y") in c.queue._queued and ("ns", "x") not in c.queue._queued
        c.enqueue([("ns", "x")], urgent=True)  # x even reconciles first: it still waits
        await drain(c)

    asyncio.run(run())
    dep = c.caches.one("deployments", ("ns", names.server_name("y")))
    assert served_key(dep) == plan_for(y).key
    assert reason(c, "x", C.PROGRESSING) == C.WAITING_FOR_ROLLOUT_SLOT


def test_a_running_canary_holds_its_models_rollout_slot() -> None:
    """Issue 44: a canary held no rollout slot while it ran (the main Deployment does not
    switch until it passes), so under a budget of one every model ran its canary at once;
    and a model waiting for a slot had its canary deleted. Now the canary Deployment holds
    its model's slot (one slot, also once the main Deployment rolls), and its model keeps
    it."""
    before = [served(model(f"m{i}", spec(i))) for i in range(2)]
    models = []
    for m, _ in before:
        new = edited(m, "registry.local/engine:2")
        new["spec"]["serving"] = {"canary": {"replicas": 1, "durationSeconds": 600}}
        models.append(new)
    deps = {m["metadata"]["name"]: d for m, d in before}
    c, _ = cluster(models, compiles=0, rollouts=1, deployments=deps)
    for m in models:
        job = live_job(m, "Complete")
        c.caches.indices["jobs"][("ns", job["metadata"]["name"])] = [job]

    def canary(i: int) -> dict[str, Any] | None:
        return c.caches.one("deployments", ("ns", names.canary_name(f"m{i}")))

    async def run() -> None:
        c.enqueue([("ns", "m0")])
        await drain(c)
        live = canary(0)
        assert live is not None
        # Its pod is up: the canary Deployment itself is no rollout in progress any more.
        live["status"].update(replicas=1, updatedReplicas=1, readyReplicas=1,
                              availableReplicas=1)
        assert not deployment_rolling(live)
        c.enqueue([("ns", "m1")])
        await drain(c)
        assert canary(1) is None, "two canaries under one slot"
        assert reason(c, "m1", C.PROGRESSING) == C.WAITING_FOR_ROLLOUT_SLOT
        assert c.budgets.rollouts_in_use() == 1
        # Another rollout takes the budget meanwhile (a lowered limit, a restart's count):
        # the running canary keeps its slot, it is not deleted for want of one.
        c.caches.indices["deployments"][("ns", "busy")] = [{
            **before[1][1], "metadata": {**before[1][1]["metadata"], "name": "busy"},
            "status": {**before[1][1]["status"], "updatedReplicas": 0}}]
        c.enqueue([("ns", "m0")])
        await drain(c)
        assert canary(0) is not None, "its own canary was deleted for want of a slot"
        assert reason(c, "m0", C.PROGRESSING) == C.CANARY_RUNNING

    asyncio.run(run())


# ---------------------------------------------------------------- settings


def test_budget_flags_reach_the_operator_settings(monkeypatch: Any) -> None:
    import spyre_operator.cli as cli
    from spyre_operator.handlers import OperatorConfig

    for attr in ("max_concurrent_compiles", "max_concurrent_rollouts", "workers", "namespaces",
                 "metrics_port", "leader_election", "leader_election_namespace",
                 "leader_election_lease", "identity"):
        monkeypatch.setattr(OperatorConfig, attr, getattr(OperatorConfig, attr))
    monkeypatch.setattr(cli, "configure_logging", lambda *a: None)
    monkeypatch.setattr(cli.asyncio, "run", lambda coro: coro.close())  # no kopf.operator

    def settings() -> tuple[int, int]:
        return OperatorConfig.max_concurrent_compiles, OperatorConfig.max_concurrent_rollouts

    assert cli_main(["run", "-A"]) == 0
    assert settings() == (4, 4) == (
        B.DEFAULT_MAX_CONCURRENT_COMPILES, B.DEFAULT_MAX_CONCURRENT_ROLLOUTS)
    cli_main(["run", "-A", "--max-concurrent-compiles", "0", "--max-concurrent-rollouts=2"])
    assert settings() == (0, 2)
    monkeypatch.setenv("SPYRE_MAX_CONCURRENT_COMPILES", "7")
    cli_main(["run", "-A"])
    assert settings() == (7, 4)
    with pytest.raises(SystemExit):
        cli_main(["run", "-A", "--max-concurrent-rollouts=-1"])


def test_a_waiting_model_whose_namespace_is_going_away_leaves_the_queue() -> None:
    """Seen in a full run: an API-server restart while a test namespace was being deleted left
    that namespace's 16 waiting models in the operator's caches. Each reconcile failed with
    "namespace is being deleted; not retrying" and the models stayed at the head of the
    compile queue. Every model created after them waited for good, at 0 of 4 slots in use."""
    from lightkube import ApiError
    from lightkube.models.meta_v1 import Status

    models = [model(f"m{i}", spec(i)) for i in range(3)]
    c, cl = cluster(models, compiles=1)
    ensure_job = cl.ensure_job

    async def refuse_m1(job: Any, live: Any) -> bool:
        if job.metadata.name == plan_for(models[1]).job_name:
            raise ApiError(status=Status(code=403, message=(
                'jobs "x" is forbidden: unable to create new content in namespace ns because '
                'it is being terminated')))
        return await ensure_job(job, live)

    cl.ensure_job = refuse_m1  # type: ignore[method-assign]

    async def run() -> None:
        c.enqueue([("ns", "m0")])
        await drain(c)
        c.clock = lambda: "2026-11-21T10:01:00Z"
        c.enqueue([("ns", "m1")])
        await drain(c)
        c.clock = lambda: "2026-11-21T10:02:00Z"
        c.enqueue([("ns", "m2")])
        await drain(c)
        assert reason(c, "m1") == reason(c, "m2") == C.WAITING_FOR_COMPILE_SLOT
        await finish(c, running(c)[0])  # the slot frees: m1, first in line, is woken
        worker = asyncio.create_task(c._worker())
        try:
            for _ in range(200):
                if len(cl.created) == 2:
                    break
                await asyncio.sleep(0.01)
        finally:
            worker.cancel()
        assert ("ns", "m1") not in c.budgets.compile_waiting
        assert cl.created == [plan_for(models[0]).job_name, plan_for(models[2]).job_name]

    asyncio.run(run())


# ---------------------------------------------------------------- a fair share per namespace


def _waiting(*entries: tuple[str, str, str]) -> B.Waiting:
    w = B.Waiting()
    for ns, name, since in entries:
        w.add((ns, name), since)
    return w


T = [f"2026-12-06T10:0{i}:00Z" for i in range(10)]


def test_a_freed_slot_goes_to_the_namespace_holding_the_fewest() -> None:
    """Issue 45: team-a's many models (3 of the 4 slots, 5 more waiting since earlier) cannot
    take the slot that frees while team-b waits: it holds none, so its model goes first."""
    held = {"team-a": 3}
    waiting = _waiting(*(("team-a", f"a{i}", T[i]) for i in range(5)), ("team-b", "b0", T[7]))
    assert B.fair_first(4, held, waiting) == [("team-b", "b0")]
    b = B.fair_slot(4, held, waiting, ("team-b", "b0"), T[7])
    assert (b.free, b.position) == (True, 1)
    a = B.fair_slot(4, held, waiting, ("team-a", "a0"), T[0])
    assert (a.free, a.position) == (False, 2)
    assert a.message("precompile", "max-concurrent-compiles") == (
        "3 of 4 precompile slots in use (max-concurrent-compiles); queued 2nd")
    # one namespace alone: oldest first, every slot usable (as before)
    alone = _waiting(*(("team-a", f"a{i}", T[i]) for i in range(5)))
    assert B.fair_first(4, {"team-a": 1}, alone) == [("team-a", f"a{i}") for i in range(3)]
    # two namespaces holding as much: the oldest waiting model of either
    both = _waiting(("team-a", "a0", T[2]), ("team-b", "b0", T[1]))
    assert B.fair_first(3, {"team-a": 1, "team-b": 1}, both) == [("team-b", "b0")]


def test_a_namespace_at_its_cap_waits_while_slots_are_free_for_others() -> None:
    held = {"team-a": 2}
    waiting = _waiting(("team-a", "a0", T[0]), ("team-a", "a1", T[1]), ("team-b", "b0", T[5]))
    assert B.fair_first(8, held, waiting, ns_limit=2) == [("team-b", "b0")]
    a = B.fair_slot(8, held, waiting, ("team-a", "a0"), T[0], ns_limit=2)
    assert not a.free and a.namespace_full
    assert a.message("precompile", "max-concurrent-compiles") == (
        "2 of 2 precompile slots of this namespace in use "
        "(max-concurrent-compiles-per-namespace); queued 2nd")
    # no cluster-wide budget, a per-namespace cap only
    assert B.fair_first(0, held, waiting, ns_limit=3) == [("team-b", "b0"), ("team-a", "a0")]
    assert B.fair_slot(0, {}, B.Waiting(), ("team-c", "c0"), T[0]) == B.FREE


def test_per_namespace_caps_reach_the_operator(monkeypatch: Any) -> None:
    import spyre_operator.cli as cli
    from spyre_operator.handlers import OperatorConfig

    for attr in ("max_concurrent_compiles", "max_concurrent_rollouts", "compiles_per_namespace",
                 "rollouts_per_namespace", "workers", "namespaces", "metrics_port",
                 "leader_election", "leader_election_namespace", "leader_election_lease",
                 "identity"):  # fmt: skip
        monkeypatch.setattr(OperatorConfig, attr, getattr(OperatorConfig, attr))
    monkeypatch.setattr(cli, "configure_logging", lambda *a: None)
    monkeypatch.setattr(cli.asyncio, "run", lambda coro: coro.close())
    cli_main(["run", "-A"])
    assert (OperatorConfig.compiles_per_namespace, OperatorConfig.rollouts_per_namespace) == (0, 0)
    cli_main(["run", "-A", "--max-concurrent-compiles-per-namespace=2",
              "--max-concurrent-rollouts-per-namespace", "1"])  # fmt: skip
    assert (OperatorConfig.compiles_per_namespace, OperatorConfig.rollouts_per_namespace) == (2, 1)
