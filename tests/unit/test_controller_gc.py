"""The controller's side of artifact GC: which claims get a GC Job, when, and what follows."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from spyre_operator.api import SpyreModelSpec
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.decide import Policy
from spyre_operator.desired import names
from spyre_operator.desired.gcjob import GC_KEYS_ANNOTATION
from spyre_operator.desired.plan import plan_model
from spyre_operator.handlers import ClaimUser

from .samples import GENERATE

NS, CLAIM = "ns", "spyre-compile-cache"
OFF = {"volume": {"retention": {"keepLast": 0, "unusedForSeconds": 0}}}
OLD = "2026-11-20T00:00:00Z"


class FakeApplier:
    def __init__(self) -> None:
        self.jobs: list[Any] = []
        self.deleted: list[str] = []
        self.events: list[tuple[str, str, str, str]] = []
        self.applied: list[Any] = []
        self.annotated: list[tuple[str, str, str, dict[str, str]]] = []

    async def ensure_job(self, job: Any, live: Any) -> bool:
        self.jobs.append(job)
        return True

    async def apply(self, obj: Any, live: Any) -> bool:
        self.applied.append(obj)
        return True

    async def delete(self, resource: Any, name: str, ns: str) -> None:
        self.deleted.append(name)

    async def annotate(self, resource: Any, name: str, ns: str,
                       annotations: dict[str, str]) -> None:
        self.annotated.append((resource.__name__, name, ns, annotations))

    async def event(self, model: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((model["metadata"]["name"], type_, reason, message))


def _spec(max_len: int) -> SpyreModelSpec:
    return SpyreModelSpec.model_validate({**GENERATE, "compile": {"maxModelLen": max_len},
                                          "cache": OFF})


def _model(name: str, max_len: int, artifacts: list[dict[str, Any]]) -> dict[str, Any]:
    spec = _spec(max_len)
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": spec.model_dump(by_alias=True, exclude_none=True),
            "status": {"cache": {"artifacts": artifacts}}}


def _key(name: str, max_len: int) -> str:
    return plan_model(name, NS, f"uid-{name}", _spec(max_len)).key


def _job(name: str, labels: dict[str, str], annotations: dict[str, str],
         done: bool) -> dict[str, Any]:
    conds = [{"type": "Complete", "status": "True"}] if done else []
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "labels": labels, "annotations": annotations},
            "status": {"conditions": conds}}


def _setup(claim_jobs: list[dict[str, Any]]) -> tuple[Controller, FakeApplier, Any, str]:
    old_key, new_key, b_key = _key("a", 2048), _key("a", 4096), _key("b", 8192)
    a = _model("a", 4096, [
        {"key": new_key, "claim": CLAIM, "inUse": True, "lastUsed": OLD},
        {"key": old_key, "claim": CLAIM, "inUse": False, "lastUsed": OLD},
    ])
    b = _model("b", 8192, [{"key": b_key, "claim": CLAIM, "inUse": True, "lastUsed": OLD}])
    plan_a = plan_model("a", NS, "uid-a", _spec(4096))
    users = [ClaimUser(plan_a.owner, plan_a.volume, "2026-11-01T00:00:00Z"),
             ClaimUser(plan_model("b", NS, "uid-b", _spec(8192)).owner, plan_a.volume,
                       "2026-11-02T00:00:00Z")]
    caches = Caches({
        "models": {(NS, "a"): [a], (NS, "b"): [b]},
        "claim_users": {(NS, CLAIM): users},
        "pvcs": {(NS, CLAIM): [{"metadata": {"name": CLAIM, "uid": "pvc-1"}}]},
        "claim_jobs": {(NS, CLAIM): claim_jobs},
        "jobs": {(NS, j["metadata"]["name"]): [j] for j in claim_jobs},
    })
    c = Controller(client=None, caches=caches, policy=Policy(gc_interval_seconds=300),  # type: ignore[arg-type]
                   clock=lambda: "2026-11-22T00:00:00Z")
    fake = FakeApplier()
    c.applier = fake  # type: ignore[assignment]
    return c, fake, plan_a, old_key


def _precompile(key: str, done: bool) -> dict[str, Any]:
    labels = {names.COMPONENT: names.COMPONENT_PRECOMPILE, names.CLAIM_LABEL: CLAIM}
    return _job(names.precompile_job_name(key, CLAIM), labels,
                {names.ARTIFACT_KEY_ANNOTATION: key}, done)


def test_an_unused_old_key_gets_one_gc_job_and_evaluation_is_throttled() -> None:
    async def run() -> None:
        c, fake, plan_a, old_key = _setup([_precompile(_key("a", 2048), True)])
        await c.gc.collect((NS, "a"), plan_a)
        [job] = fake.jobs
        assert job.metadata.annotations[GC_KEYS_ANNOTATION] == old_key
        assert [r.name for r in job.metadata.ownerReferences] == ["a", "b"]
        # Its pod asks the API server what is in use before each removal: with its own
        # ServiceAccount, which may list pods, Jobs and Deployments and nothing else.
        pod = job.spec.template.spec
        assert pod.serviceAccountName == "spyre-gc" and pod.automountServiceAccountToken
        args = _gc_args(job)
        assert args[args.index("--claim") + 1] == CLAIM
        assert args[args.index("--namespace") + 1] == NS
        assert [(o.kind, o.metadata.name) for o in fake.applied] == [
            ("ServiceAccount", "spyre-gc"), ("Role", "spyre-gc"), ("RoleBinding", "spyre-gc")]
        role = fake.applied[1]
        assert {(r.apiGroups[0], r.resources[0], tuple(r.verbs)) for r in role.rules} == {
            ("", "pods", ("list",)), ("batch", "jobs", ("list",)),
            ("apps", "deployments", ("list",))}
        assert [r.name for r in role.metadata.ownerReferences] == ["a", "b"]
        await c.gc.collect((NS, "b"), plan_a)  # within the interval: not evaluated again
        assert len(fake.jobs) == 1
        assert set(c.queue._timers) == {(NS, "a")}  # one timer per claim: its oldest user
        await c.stop()
    asyncio.run(run())


def test_the_key_of_a_running_precompile_is_never_removed() -> None:
    async def run() -> None:
        c, fake, plan_a, _old = _setup([_precompile(_key("a", 2048), False)])
        await c.gc.collect((NS, "a"), plan_a)
        assert fake.jobs == []
        await c.stop()
    asyncio.run(run())


def test_a_finished_gc_job_is_announced_once_and_its_precompile_jobs_go() -> None:
    async def run() -> None:
        old_key = _key("a", 2048)
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-x", gc_labels, {GC_KEYS_ANNOTATION: old_key}, True)
        c, fake, plan_a, _ = _setup([_precompile(old_key, True), gc])
        summary = {"removed": [{"key": old_key, "sizeBytes": 7}], "skipped": [],
                   "freedBytes": 9, "remainingBytes": 1234}
        c.observer.job_messages[gc["metadata"]["uid"]] = [
            {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
        assert await c.gc.reports.collected(NS, CLAIM) == {old_key: ""}  # (no completionTime here)
        await c.gc.collect((NS, "a"), plan_a)
        await c.gc.collect((NS, "b"), plan_a)
        await asyncio.gather(*c.writer.pending)
        assert sorted(e[0] for e in fake.events) == ["a", "b"]  # once per model, not per call
        assert all(e[1:3] == ("Normal", "ArtifactsCollected") and "freed 9 bytes" in e[3]
                   and "1234 bytes of artifacts left on the claim" in e[3]
                   for e in fake.events)
        assert fake.deleted == [names.precompile_job_name(old_key, CLAIM)]
        assert fake.jobs == []  # the statuses here still list the key: it is not removed twice
        await c.stop()
    asyncio.run(run())


def test_a_failed_gc_job_is_a_warning_on_every_user_once() -> None:
    async def run() -> None:
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-y", gc_labels, {}, False)
        gc["status"]["conditions"] = [{"type": "Failed", "status": "True"}]
        c, fake, plan_a, _ = _setup([gc])
        c.observer.job_messages[gc["metadata"]["uid"]] = [
            {"name": "p", "terminated": {"exitCode": 1,
                                         "message": '{"reason": "CatalogError"}'}}]
        await c.gc.collect((NS, "a"), plan_a)
        await c.gc.collect((NS, "b"), plan_a)
        await asyncio.gather(*c.writer.pending)
        assert sorted(e[0] for e in fake.events) == ["a", "b"]
        assert all(e[1:3] == ("Warning", "ArtifactCollectionFailed") and "CatalogError" in e[3]
                   for e in fake.events)
        await c.stop()
    asyncio.run(run())


def _gc_args(job: Any) -> list[str]:
    return list(job.spec.template.spec.containers[0].args)


def test_a_deleted_model_makes_the_claim_swept_with_every_known_key_kept() -> None:
    """Nothing is due (b's artifact is in use), but a model left the claim: one GC Job sweeps
    it for orphans, keeping every key a status, spec or Deployment still names."""
    async def run() -> None:
        c, fake, plan_a, old_key = _setup([])
        # a's old key in use again (a rollback): nothing is due
        c.caches.indices["models"][(NS, "a")][0]["status"]["cache"]["artifacts"][1][
            "inUse"] = True
        await c.gc.collect((NS, "a"), plan_a)
        assert fake.jobs == []  # nothing due, nobody left: no Job

        gone = plan_model("gone", NS, "uid-gone", _spec(1024))
        c.router._claim_sigs[(NS, "gone")] = (CLAIM, gone.key, "v")
        served = {"metadata": {"name": "gone-server", "namespace": NS, "annotations": {
            names.ARTIFACT_KEY_ANNOTATION: "draining-key"}, "ownerReferences": [
                {"kind": "SpyreModel", "name": "gone"}]}}
        c.caches.indices["deployments"] = {(NS, "gone-server"): [served]}
        # its peers on the claim are reconciled, and one of them will sweep it
        assert c.router.claim_peers_if_changed((NS, "gone"), None) == [(NS, "a"), (NS, "b")]
        await c.gc.collect((NS, "b"), plan_a)  # within the interval, but requested
        [job] = fake.jobs
        args = _gc_args(job)
        keep = set(args[args.index("--keep") + 1].split(","))
        assert keep == {_key("a", 4096), old_key, _key("b", 8192), "draining-key"}
        assert gone.key not in keep  # the deleted model's: an orphan for the engine to time
        assert args[args.index("--orphans-unused-for") + 1] == "0"
        assert args[args.index("--remove") + 1] == ""
        # gone-server's model is gone: the sweep is asked for again until it is deleted.
        assert (NS, CLAIM) in c.gc.sweep_requested
        c.caches.indices["deployments"] = {}
        c.gc._checked.clear()
        c.caches.indices["jobs"] = {(NS, job.metadata.name): [{"metadata": {
            "name": job.metadata.name}}]}
        c.clock = lambda: "2026-11-22T00:00:09Z"
        await c.gc.collect((NS, "a"), plan_a)
        assert len(fake.jobs) == 2 and "draining-key" not in _gc_args(fake.jobs[1])[
            _gc_args(fake.jobs[1]).index("--keep") + 1]
        job = fake.jobs[1]
        # Served once: the request is spent, and the next evaluation makes no other Job.
        c.gc._checked.clear()
        c.caches.indices["jobs"] = {(NS, job.metadata.name): [{"metadata": {
            "name": job.metadata.name}}]}
        await c.gc.collect((NS, "a"), plan_a)
        assert len(fake.jobs) == 2
        await c.stop()
    asyncio.run(run())


def test_pending_orphans_are_announced_once_and_swept_again_when_due() -> None:
    async def run() -> None:
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-z", gc_labels, {}, True)
        c, fake, plan_a, _ = _setup([gc])
        t0 = 1763769600 - 3600  # 2026-11-21T23:00:00Z, an hour before the clock
        summary = {"removed": [], "skipped": [], "freedBytes": 0, "orphanCount": 1,
                   "orphanBytes": 4096, "orphans": [{"key": "orph", "since": t0,
                                                     "sizeBytes": 4096}]}
        c.observer.job_messages[gc["metadata"]["uid"]] = [
            {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
        c.clock = lambda: "2026-11-21T23:30:00Z"  # half an hour after it was found
        await c.gc.collect((NS, "a"), plan_a)
        await asyncio.gather(*c.writer.pending)
        assert sorted(e[0] for e in fake.events) == ["a", "b"]
        assert all(e[2] == "ArtifactsOrphaned" and "orph" in e[3] and "4096 bytes" in e[3]
                   for e in fake.events)
        # The users' retention is 0 s: the orphan is due, so this evaluation swept again.
        [job] = fake.jobs
        assert "--orphans-unused-for" in _gc_args(job)
        fake.events.clear()
        await c.gc.collect((NS, "b"), plan_a)
        await asyncio.gather(*c.writer.pending)
        assert fake.events == []  # the same orphans: not announced twice
        await c.stop()
    asyncio.run(run())


def test_after_a_restart_a_gc_job_the_old_process_announced_is_not_announced_again() -> None:
    """_gc_done is memory: a restarted operator tells a Job that finished before it started
    and whose removed keys no status lists any more (acted upon) from one it never saw."""
    async def run() -> None:
        old_key = _key("a", 2048)
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-r", gc_labels, {GC_KEYS_ANNOTATION: old_key}, True)
        gc["status"]["completionTime"] = "2026-11-21T23:00:00Z"  # before this process
        summary = {"removed": [{"key": old_key, "sizeBytes": 7}], "skipped": [],
                   "freedBytes": 7}
        for listed, expect in ((True, ["a", "b"]), (False, [])):
            c, fake, plan_a, _ = _setup([_precompile(old_key, True), gc])
            if not listed:  # the old process dropped it from a's status already
                arts = c.caches.indices["models"][(NS, "a")][0]["status"]["cache"]["artifacts"]
                arts[:] = [x for x in arts if x["key"] != old_key]
            c.observer.job_messages[gc["metadata"]["uid"]] = [
                {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
            await c.gc.collect((NS, "a"), plan_a)
            await asyncio.gather(*c.writer.pending)
            assert sorted(e[0] for e in fake.events) == expect, listed
            assert fake.deleted == [names.precompile_job_name(old_key, CLAIM)]  # either way
            await c.stop()
    asyncio.run(run())


def test_what_a_gc_job_measured_on_the_volume_counts_towards_the_claims_usage() -> None:
    """Orphans take space no status lists: the claim's usage (ClaimNearlyFull) is the larger
    of the listed artifacts and the newest GC Job's measurement of the volume."""
    async def run() -> None:
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        old = _job("spyre-gc-1", gc_labels, {}, True)
        new = _job("spyre-gc-2", gc_labels, {}, True)
        old["status"]["completionTime"] = "2026-11-22T00:00:01Z"
        new["status"]["completionTime"] = "2026-11-22T00:00:02Z"
        c, fake, plan_a, _ = _setup([new, old])  # a restart reads them in any order
        for job, remaining in ((old, 9_000_000), (new, 5_000_000)):
            c.observer.job_messages[job["metadata"]["uid"]] = [{"name": "p", "terminated": {
                "exitCode": 0, "message": json.dumps({"removed": [], "skipped": [],
                                                      "freedBytes": 0,
                                                      "remainingBytes": remaining})}}]
        users = c.caches.all("claim_users", (NS, CLAIM))
        listed = c.gc.reports.claim_artifact_bytes(NS, CLAIM, users)
        assert listed is not None and listed < 5_000_000  # the samples list no sizes
        await c.gc.collect((NS, "a"), plan_a)
        assert c.gc.reports.claim_artifact_bytes(NS, CLAIM, users) == 5_000_000  # the newest Job's
        assert {(NS, "a"), (NS, "b")} <= set(c.queue._queued)  # their condition follows
        await c.stop()
    asyncio.run(run())


def _gc_done_job(i: int) -> dict[str, Any]:
    gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
    job = _job(f"spyre-gc-h{i}", gc_labels, {}, True)
    job["status"]["completionTime"] = "2026-11-22T00:00:00Z"
    return job


def test_memory_of_finished_jobs_is_bounded_by_the_jobs_that_still_exist() -> None:
    """An hourly sweep adds a GC Job per claim; once a Job is gone (its TTL), neither the
    record that it was acted upon nor its pods' messages are kept."""
    async def run() -> None:
        c, fake, plan_a, _ = _setup([])
        summary = json.dumps({"removed": [], "skipped": [], "freedBytes": 0})

        async def pods(ns: str, selector: dict[str, str]) -> list[dict[str, Any]]:
            return [{"name": "p", "terminated": {"exitCode": 0, "message": summary}}]

        c.observer.pods = pods  # type: ignore[method-assign]
        for i in range(2000):
            job = _gc_done_job(i)
            c.caches.indices["claim_jobs"][(NS, CLAIM)] = [job]
            c.caches.indices["jobs"] = {(NS, job["metadata"]["name"]): [job]}
            await c.gc.collect((NS, "a"), plan_a)
            assert job["metadata"]["uid"] in c.gc.reports._done  # acted upon: not again
            c.caches.indices["claim_jobs"][(NS, CLAIM)] = []
            c.caches.indices["jobs"] = {}  # gone (ttlSecondsAfterFinished)
        assert len(c.gc.reports._done) <= 600
        assert len(c.observer.job_messages) <= 600
        await c.stop()
    asyncio.run(run())


def test_a_replica_that_does_not_hold_the_lease_creates_no_gc_job() -> None:
    async def run() -> None:
        c, fake, plan_a, _ = _setup([_precompile(_key("a", 2048), True)])
        c.may_write = lambda: False
        await c.gc.collect((NS, "a"), plan_a)
        assert fake.jobs == []
        c.may_write = lambda: True
        c.gc._checked.clear()
        await c.gc.collect((NS, "a"), plan_a)
        assert len(fake.jobs) == 1
        await c.stop()
    asyncio.run(run())


def _deployment(model: str, key: str, claim: str) -> dict[str, Any]:
    return {"metadata": {"name": names.server_name(model), "namespace": NS,
                         "annotations": {names.ARTIFACT_KEY_ANNOTATION: key},
                         "ownerReferences": [{"kind": "SpyreModel", "name": model}]},
            "spec": {"template": {"spec": {"volumes": [
                {"name": "cache", "persistentVolumeClaim": {"claimName": claim,
                                                            "readOnly": True}}]}}}}


def test_a_key_a_model_that_left_the_claim_still_serves_from_it_is_not_removed() -> None:
    """Model c moved to another claim (its new compile is slow) or its spec became invalid:
    it is no user of this claim any more, but its Deployment still serves a key from it."""
    async def run() -> None:
        c, fake, plan_a, old_key = _setup([_precompile(_key("a", 2048), True)])
        c.caches.indices["deployments"] = {
            (NS, names.server_name("c")): [_deployment("c", old_key, CLAIM)]}
        await c.gc.collect((NS, "a"), plan_a)
        assert fake.jobs == [] or not fake.jobs[0].metadata.annotations[GC_KEYS_ANNOTATION]
        # Served from another claim, it is no reason to keep this claim's copy.
        c.caches.indices["deployments"] = {
            (NS, names.server_name("c")): [_deployment("c", old_key, "elsewhere")]}
        c.gc._checked.clear()
        fake.jobs.clear()
        await c.gc.collect((NS, "a"), plan_a)
        [job] = fake.jobs
        assert job.metadata.annotations[GC_KEYS_ANNOTATION] == old_key
        await c.stop()
    asyncio.run(run())


def test_a_gc_job_that_kept_a_key_in_use_goes_so_the_decision_can_be_made_again() -> None:
    """The GC pod kept a key a pod still served (e.g. an old replica still draining): the
    same key set names the same Job, so the finished one goes, or nothing retried for 1 h."""
    async def run() -> None:
        old_key = _key("a", 2048)
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-k", gc_labels, {GC_KEYS_ANNOTATION: old_key}, True)
        c, fake, plan_a, _ = _setup([gc])
        summary = {"removed": [], "skipped": [{"key": old_key, "reason": "in use by pod/a-1"}],
                   "freedBytes": 0}
        c.observer.job_messages[gc["metadata"]["uid"]] = [
            {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
        await c.gc.collect((NS, "a"), plan_a)
        assert "spyre-gc-k" in fake.deleted
        await c.stop()
    asyncio.run(run())


def test_a_key_the_gc_pod_kept_because_a_pod_uses_it_is_an_event_on_every_user() -> None:
    """The Job that kept it goes at once (above), and with it the pod's termination message:
    the Event is what is left to say why the space was not freed."""
    async def run() -> None:
        old_key = _key("a", 2048)
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-k", gc_labels, {GC_KEYS_ANNOTATION: old_key}, True)
        c, fake, plan_a, _ = _setup([gc])
        summary = {"removed": [], "freedBytes": 0, "skipped": [
            {"key": old_key, "reason": "in use by deployment/a (pod a-1)"}]}
        c.observer.job_messages[gc["metadata"]["uid"]] = [
            {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
        await c.gc.collect((NS, "a"), plan_a)
        await asyncio.sleep(0)  # events are sent in the background
        kept = [e for e in fake.events if e[2] == "ArtifactsKept"]
        assert sorted(e[0] for e in kept) == ["a", "b"], fake.events
        assert all(e[1] == "Normal" and old_key[:12] in e[3] and CLAIM in e[3]
                   and "in use by deployment/a" in e[3] for e in kept), kept
        await c.stop()
    asyncio.run(run())


def test_a_gc_job_never_runs_an_engine_image_the_allow_list_refuses() -> None:
    """The GC Job runs the oldest user's image; a refused model's image is not lent to it."""
    from dataclasses import replace

    from spyre_operator.desired.site import SiteDefaults

    async def run(allowed: tuple[str, ...]) -> list[Any]:
        c, fake, plan_a, _old = _setup([_precompile(_key("a", 2048), True)])
        c.policy = replace(c.policy, site=SiteDefaults(allowed_engine_images=allowed))
        a = c.caches.one("models", (NS, "a"))
        a["spec"]["engine"]["image"] = "docker.io/evil/miner:1"  # the oldest user's
        await c.gc.collect((NS, "a"), plan_a)
        await c.stop()
        return [j.spec.template.spec.containers[0].image for j in fake.jobs]

    default = SiteDefaults().engine_image
    assert asyncio.run(run(())) == ["docker.io/evil/miner:1"], "no allow-list: as before"
    assert asyncio.run(run(("ghcr.io/*",))) == [default], "the oldest allowed user's image"
    assert asyncio.run(run(("quay.io/*",))) == [], "no user's image allowed: no GC Job"


def test_what_gc_removed_is_recorded_on_the_claim_and_outlives_the_job() -> None:
    """Issue 31, 3: what a GC Job removed was known only while the Job existed (its TTL); a
    model still listing the key and reverted to it afterwards was told the artifact was there.
    The removed keys, and those the engine found already absent (they stayed listed and got a
    GC Job every hour), are written onto the PVC, which lives as long as the volume."""
    async def run() -> None:
        old_key, absent = _key("a", 2048), _key("a", 1024)
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-x", gc_labels, {GC_KEYS_ANNOTATION: f"{old_key},{absent}"}, True)
        gc["status"]["completionTime"] = "2026-11-21T23:00:00Z"
        c, fake, plan_a, _ = _setup([gc])
        summary = {"removed": [{"key": old_key, "sizeBytes": 7}],
                   "skipped": [{"key": absent, "reason": "absent"}], "freedBytes": 7}
        c.observer.job_messages[gc["metadata"]["uid"]] = [
            {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
        when = "2026-11-21T23:00:00Z"
        assert await c.gc.reports.collected(NS, CLAIM) == {old_key: when, absent: when}
        await c.gc.collect((NS, "a"), plan_a)
        await asyncio.gather(*c.writer.pending)
        [(kind, name, ns, annotations)] = fake.annotated
        assert (kind, name, ns) == ("PersistentVolumeClaim", CLAIM, NS)
        record = json.loads(annotations[names.REMOVED_ARTIFACTS_ANNOTATION])
        assert record == {old_key: when, absent: when}
        # the watch shows the PVC with it; the GC Job goes (TTL): still known
        pvc = c.caches.indices["pvcs"][(NS, CLAIM)][0]
        pvc["metadata"]["annotations"] = annotations
        c.caches.indices["claim_jobs"][(NS, CLAIM)] = []
        c.caches.indices["jobs"].clear()
        assert await c.gc.reports.collected(NS, CLAIM) == {old_key: when, absent: when}
        # a restarted operator acting on the same Job again writes nothing new
        c2, fake2, _, _ = _setup([gc])
        c2.caches.indices["pvcs"][(NS, CLAIM)][0]["metadata"]["annotations"] = annotations
        uid = gc["metadata"]["uid"]
        c2.observer.job_messages[uid] = c.observer.job_messages[uid]
        await c2.gc.collect((NS, "a"), plan_a)
        await asyncio.gather(*c2.writer.pending)
        assert fake2.annotated == []
        await c.stop()
        await c2.stop()
    asyncio.run(run())


def test_a_removal_whose_job_went_unread_is_learned_from_the_next_gc_job() -> None:
    """Issue 47, 2: a GC Job that removed a key went before the operator read it (its TTL
    while the operator was down, a cleanup of finished Jobs). The engine keeps its own record
    on the volume and every later GC Job reports it (``removedRecord``): the next one's
    summary puts the lost removal on the PVC with its own time, and a model listing the key no
    longer trusts it. Only keys with times are read from what the pod wrote."""
    async def run() -> None:
        lost, now_removed = _key("a", 2048), _key("a", 1024)
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-y", gc_labels, {GC_KEYS_ANNOTATION: now_removed}, True)
        gc["status"]["completionTime"] = "2026-11-22T10:00:00Z"
        c, fake, plan_a, _ = _setup([gc])
        summary = {"removed": [{"key": now_removed, "sizeBytes": 7}], "skipped": [],
                   "freedBytes": 7,
                   "removedRecord": {now_removed: "2026-11-22T09:59:58Z",
                                     lost: "2026-11-21T23:00:00Z",
                                     "../x": "2026-11-21T23:00:00Z", "bad": "yesterday"}}
        c.observer.job_messages[gc["metadata"]["uid"]] = [
            {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
        expected = {now_removed: "2026-11-22T10:00:00Z", lost: "2026-11-21T23:00:00Z"}
        assert await c.gc.reports.collected(NS, CLAIM) == expected
        await c.gc.collect((NS, "a"), plan_a)
        await asyncio.gather(*c.writer.pending)
        [(_, _, _, annotations)] = fake.annotated
        assert json.loads(annotations[names.REMOVED_ARTIFACTS_ANNOTATION]) == expected
        await c.stop()
    asyncio.run(run())


def test_the_claims_record_of_removed_keys_is_bounded_and_keeps_the_newest() -> None:
    from spyre_operator.decide.gc import removed_record, with_removed

    record = with_removed({}, [f"k{i:03d}" for i in range(70)], "2026-11-21T00:00:00Z")
    record = with_removed(record, ["late"], "2026-11-22T00:00:00Z")
    assert len(record) == names.REMOVED_ARTIFACTS_KEPT and "late" in record
    # the later removal wins; a garbled annotation reads as no record
    assert with_removed({"k": "2026-11-22T00:00:00Z"}, ["k"], "2026-11-21T00:00:00Z") == {
        "k": "2026-11-22T00:00:00Z"}
    garbled = {"metadata": {"annotations": {names.REMOVED_ARTIFACTS_ANNOTATION: "{not json"}}}
    assert removed_record(garbled) == {} and removed_record(None) == {}


def test_a_recompile_of_a_removed_key_is_not_killed_when_the_gc_job_finishes() -> None:
    """Issue 31, 11: GC dropped the removed keys' precompile Jobs by name, so a recompile of
    the key (a revert), started under the same name while the GC Job ran, was killed once.
    Only a Job that finished before the removal goes."""
    async def run() -> None:
        old_key = _key("a", 2048)
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        summary = {"removed": [{"key": old_key, "sizeBytes": 7}], "skipped": [],
                   "freedBytes": 7}
        removed_at = "2026-11-21T23:00:00Z"
        for state, kept in (("running", True), ("finished after", True),
                            ("finished before", False)):
            gc = _job("spyre-gc-x", gc_labels, {GC_KEYS_ANNOTATION: old_key}, True)
            gc["status"]["completionTime"] = removed_at
            pre = _precompile(old_key, state != "running")
            if state != "running":
                pre["status"]["completionTime"] = (
                    "2026-11-21T23:05:00Z" if state == "finished after" else
                    "2026-11-21T22:00:00Z")
            c, fake, plan_a, _ = _setup([pre, gc])
            c.observer.job_messages[gc["metadata"]["uid"]] = [
                {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
            await c.gc.collect((NS, "a"), plan_a)
            await asyncio.gather(*c.writer.pending)
            gone = names.precompile_job_name(old_key, CLAIM) in fake.deleted
            assert gone is not kept, state
            await c.stop()
    asyncio.run(run())


def _a_deleted_models_deployment_lingers(c: Controller) -> None:
    """Model ``gone`` left the claim (a sweep is asked for) and was deleted, but its Deployment,
    serving ``draining-key``, is still there (a finalizer)."""
    c.router._claim_sigs[(NS, "gone")] = (CLAIM, _key("gone", 1024), "v")
    served = {"metadata": {"name": "gone-server", "namespace": NS, "annotations": {
        names.ARTIFACT_KEY_ANNOTATION: "draining-key"}, "ownerReferences": [
            {"kind": "SpyreModel", "name": "gone"}]}}
    c.caches.indices["deployments"] = {(NS, "gone-server"): [served]}
    c.router.claim_peers_if_changed((NS, "gone"), None)


def test_a_lingering_deployment_of_a_deleted_model_does_not_make_gc_jobs_back_to_back() -> None:
    """Issue 31, 5: while a deleted model's Deployment lingers (a finalizer), the requested
    sweep stays requested; each GC Job's completion (which reconciles the claim's users) made
    the next one at once. It is asked for again once per evaluation interval."""
    async def run() -> None:
        c, fake, plan_a, _ = _setup([])
        _a_deleted_models_deployment_lingers(c)
        for i in range(3):  # the GC Job finishes; its users are reconciled
            c.clock = lambda i=i: f"2026-11-22T00:00:{10 + i:02d}Z"
            await c.gc.collect((NS, "a"), plan_a)
            c.caches.indices["jobs"] = {(NS, j.metadata.name): [
                {"metadata": {"name": j.metadata.name}, "status": {"conditions": [
                    {"type": "Complete", "status": "True"}]}}] for j in fake.jobs}
            c.caches.indices["claim_jobs"][(NS, CLAIM)] = [
                {"metadata": {"name": j.metadata.name, "uid": f"u-{j.metadata.name}",
                              "labels": {names.COMPONENT: "gc"}},
                 "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
                for j in fake.jobs]
            for j in fake.jobs:  # what each GC pod said: nothing removed
                c.observer.job_messages[f"u-{j.metadata.name}"] = [{"name": "p", "terminated": {
                    "exitCode": 0, "message": json.dumps({"removed": [], "skipped": []})}}]
        assert len(fake.jobs) == 1, [j.metadata.name for j in fake.jobs]
        assert (NS, CLAIM) in c.gc.sweep_requested  # still asked for ...
        c.gc._checked.clear()
        c.gc._lingering = {k: v - 3600 for k, v in c.gc._lingering.items()}  # an interval on
        c.clock = lambda: "2026-11-22T00:05:10Z"
        await c.gc.collect((NS, "a"), plan_a)
        assert len(fake.jobs) == 2  # ... once per interval
        await c.stop()
    asyncio.run(run())


def test_a_sweep_blocked_by_a_lingering_deployment_waits_for_it_to_go() -> None:
    """Issue 47, 2: a sweep that found a deleted model's Deployment still there (a finalizer)
    kept its key; another sweep every GC interval would keep it again (10 Jobs in 182 s at a
    20 s interval, each kept an hour). No GC Job while it lingers, however many intervals
    pass; the one after it is gone sweeps."""
    async def run() -> None:
        c, fake, plan_a, _ = _setup([])
        new_key = _key("a", 4096)  # a's old key gone from its status: nothing else is due
        c.caches.indices["models"][(NS, "a")] = [_model("a", 4096, [
            {"key": new_key, "claim": CLAIM, "inUse": True, "lastUsed": OLD}])]
        _a_deleted_models_deployment_lingers(c)
        await c.gc.collect((NS, "a"), plan_a)
        [first] = fake.jobs
        keep = first.spec.template.spec.containers[0].args
        assert "draining-key" in keep[keep.index("--keep") + 1]
        for minute in range(1, 6):  # five GC intervals on, the Deployment still there
            c.gc._checked.clear()
            c.gc._lingering = {k: v - 3600 for k, v in c.gc._lingering.items()}
            c.clock = lambda m=minute: f"2026-11-22T00:{m:02d}:00Z"
            await c.gc.collect((NS, "a"), plan_a)
        assert len(fake.jobs) == 1, [j.metadata.name for j in fake.jobs]
        assert (NS, CLAIM) in c.gc.sweep_requested
        c.caches.indices["deployments"] = {}  # the finalizer done: it goes
        c.gc._checked.clear()
        c.clock = lambda: "2026-11-22T00:07:00Z"
        await c.gc.collect((NS, "a"), plan_a)
        assert len(fake.jobs) == 2
        assert (NS, CLAIM) not in c.gc.sweep_requested
        await c.stop()
    asyncio.run(run())


def test_what_is_remembered_per_claim_goes_with_the_claim() -> None:
    """Issue 31, 12: the per-claim maps grew with every claim ever seen."""
    async def run() -> None:
        c, fake, plan_a, _ = _setup([])
        await c.gc.collect((NS, "a"), plan_a)
        gone = (NS, "old-claim")
        c.gc._checked[gone] = 1.0
        c.gc._swept[gone] = 1.0
        c.gc.reports.orphans[gone] = {"k": 1}
        c.gc.sweep_requested.add(gone)
        await c.gc.collect((NS, "a"), plan_a)
        assert gone not in c.gc._checked and gone not in c.gc._swept
        assert gone not in c.gc.reports.orphans and gone not in c.gc.sweep_requested
        assert (NS, CLAIM) in c.gc._checked  # the live claim's stays
        await c.stop()
    asyncio.run(run())


def _env(job: Any) -> dict[str, str]:
    return {e.name: e.value for e in job.spec.template.spec.containers[0].env or []}


def test_the_gc_job_keeps_every_model_the_namespaces_spyremodels_name() -> None:
    """Issue 47, 1: the sweep of downloaded models keeps what any SpyreModel of the namespace
    names: its spec, the spec it serves and the one it last served well (a rollback target),
    in the engine's variable (an older engine image ignores it, where a flag would fail)."""
    from spyre_engine.settings import env_name
    from spyre_operator.desired.gcjob import KEEP_MODELS_ENV

    assert KEEP_MODELS_ENV == env_name("keep_models")

    async def run() -> None:
        c, fake, plan_a, _ = _setup([])
        a = c.caches.indices["models"][(NS, "a")][0]
        a["status"]["servedSpec"] = json.dumps({"model": {"uri": "hf://org/old@v1"}})
        a["status"]["lastGoodServedSpec"] = "not json"  # read as hostile: nothing
        other = {"metadata": {"name": "elsewhere", "namespace": "other-ns"},
                 "spec": {"model": {"uri": "hf://org/not-this-namespace"}}}
        pvc_model = {"metadata": {"name": "p", "namespace": NS},
                     "spec": {"model": {"uri": "pvc://models/tiny"}}}
        c.caches.indices["models"][("other-ns", "elsewhere")] = [other]
        c.caches.indices["models"][(NS, "p")] = [pvc_model]
        await c.gc.collect((NS, "a"), plan_a)
        [job] = fake.jobs
        kept = json.loads(_env(job)[KEEP_MODELS_ENV])
        assert kept == sorted({GENERATE["model"]["uri"][len("hf://"):], "org/old@v1"}), kept
        assert "--keep-models" not in _gc_args(job)
        await c.stop()
    asyncio.run(run())


def test_removed_downloads_are_an_event_and_pending_ones_make_the_next_sweep_due() -> None:
    async def run(pending: bool) -> None:
        gc_labels = {names.COMPONENT: "gc", names.CLAIM_LABEL: CLAIM}
        gc = _job("spyre-gc-m", gc_labels, {}, True)
        c, fake, plan_a, _ = _setup([gc])
        # a's old key in use again (a rollback): no artifact is due
        c.caches.indices["models"][(NS, "a")][0]["status"]["cache"]["artifacts"][1][
            "inUse"] = True
        t0 = 1763769600 - 3600
        summary = {"removed": [], "skipped": [], "freedBytes": 0,
                   "modelsRemoved": [{"model": "models--org--gone", "sizeBytes": 5000},
                                     {"model": "../../etc", "sizeBytes": 1}],
                   "modelsFreedBytes": 5000,
                   "modelsPending": [{"model": f"models--org--m/snapshots/{'a' * 40}",
                                      "since": t0}] if pending else []}
        c.observer.job_messages[gc["metadata"]["uid"]] = [
            {"name": "p", "terminated": {"exitCode": 0, "message": json.dumps(summary)}}]
        c.clock = lambda: "2026-11-21T23:30:00Z"
        await c.gc.collect((NS, "a"), plan_a)
        await asyncio.gather(*c.writer.pending)
        told = [e for e in fake.events if e[2] == "ModelsCollected"]
        assert sorted(e[0] for e in told) == ["a", "b"]
        assert all("org/gone" in e[3] and "5000 bytes" in e[3] and "etc" not in e[3]
                   for e in told)  # fmt: skip
        # the users' retention is 0 s: a pending revision is due, so a sweep runs again;
        # with none, nothing is due and no Job is made
        assert len(fake.jobs) == (1 if pending else 0)
        await c.stop()
    asyncio.run(run(True))
    asyncio.run(run(False))
