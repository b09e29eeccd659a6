"""The precompile Job over its whole life (pure decide() cases): a pod that cannot start shows
in status with its own reason, a stuck Job is replaced once its model fixes it, superseded
Jobs are stopped, finished ones expire while status keeps what they said, models sharing a key
share one retry budget, and a deleted Deployment serves the old artifact again while a new
one compiles. tests/integration/test_precompile_lifecycle.py repeats the user-visible cases on
the real control plane.
"""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from spyre_operator.decide import RETRY_ANNOTATION, Observed, Policy, decide, served_key
from spyre_operator.decide import conditions as C
from spyre_operator.desired import names
from spyre_operator.desired.job import PRECOMPILE_JOB_TTL_SECONDS, build_precompile_job
from spyre_operator.desired.plan import OwnerRef

from .samples import GENERATE, model
from .test_reconcile import NOW, cond, deployment_obj, job_obj, plan_for
from .test_reconcile_correctness import bound

PLACED = {**GENERATE, "precompile": {"nodeSelector": {"pool": "cpu-big"}}}


def live_job(m: dict[str, Any], state: str | None = None, attempt: int | None = None,
             owners: list[OwnerRef] | None = None, ready: int = 0) -> dict[str, Any]:
    """The precompile Job of ``m`` as the API server returns it (the operator built it)."""
    plan = plan_for(m)
    job = build_precompile_job(plan, owners or [plan.owner], attempt or 1).to_dict()
    job["metadata"].update(uid=f"job-{plan.short_key}", resourceVersion="5")
    job["status"] = job_obj(m, state)["status"]
    if state is None:
        job["status"]["ready"] = ready
    return job


def pending_pod(**extra: Any) -> dict[str, Any]:
    """A compact precompile pod (controller.compact_pod) that has not started."""
    return {"name": "spyre-compile-x-abcde", "phase": "Pending", "ready": False, **extra}


def stuck(m: dict[str, Any], pod: dict[str, Any] | None, events: list[Any] | None = None,
          job: dict[str, Any] | None = None) -> Observed:
    obs = Observed(cache_pvc=bound(), job=job or live_job(m))
    obs.job_pods = [pod] if pod else []
    obs.job_events = events or []
    return obs


# ---------------------------------------------------------------- a pod that cannot start

UNSCHEDULABLE = ("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
                 "preemption: 0/3 nodes are available")
CASES = {
    "unschedulable": (pending_pod(unschedulable=UNSCHEDULABLE), C.PRECOMPILE_UNSCHEDULABLE,
                      "didn't match Pod's node affinity", False),
    "image": (pending_pod(waiting="ErrImagePull", waitingMessage=(
        'failed to pull image "registry.local/engine:nope": not found')),
        C.IMAGE_PULL_FAILED, 'ErrImagePull: failed to pull image "registry.local/engine:nope"',
        True),
    "backoff": (pending_pod(waiting="ImagePullBackOff", waitingMessage="Back-off pulling image"),
                C.IMAGE_PULL_FAILED, "ImagePullBackOff: Back-off pulling image", True),
    "secret": (pending_pod(waiting="CreateContainerConfigError",
                           waitingMessage='secret "hf-token" not found'),
               C.CONTAINER_CONFIG_ERROR, 'secret "hf-token" not found', True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_precompile_pod_that_cannot_start_shows_its_own_reason(case: str) -> None:
    pod, reason, words, degraded = CASES[case]
    m = model("m", GENERATE)
    d = decide(m, stuck(m, pod), NOW)
    art = cond(d, C.ARTIFACT_READY)
    assert (art["status"], art["reason"]) == ("False", reason), art
    assert words in art["message"] and words in d.status["artifact"]["message"]
    assert "is running" not in d.status["artifact"]["message"]
    ready = cond(d, C.READY)
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert cond(d, C.PROGRESSING)["reason"] == reason
    deg = cond(d, C.DEGRADED)
    if degraded:  # only a fix lets it start
        assert (deg["status"], deg["reason"]) == ("True", reason) and words in deg["message"]
        assert C.event_type(reason) == "Warning"
    else:  # a node may free up: waiting, not degraded
        assert deg["status"] == "False"
    assert d.job is not None and (Any, plan_for(m).job_name) not in d.delete
    assert not d.delete, "a stuck Job of an unchanged spec is left alone"


UNBOUND = ("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
           "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")


def test_a_pod_refused_for_a_claim_that_was_not_bound_yet_is_starting_once_it_is() -> None:
    """The scheduler's first try can precede the claim's binding (Immediate binding, a new
    PVC): its verdict stays on the pod until it tries again. Once the claim is Bound, that
    verdict is stale; while it is not, the pod does wait for it (CI saw the stale one)."""
    m = model("m", GENERATE)
    d = decide(m, stuck(m, pending_pod(unschedulable=UNBOUND)), NOW)
    art = cond(d, C.ARTIFACT_READY)
    assert art["reason"] == C.COMPILING, art
    assert cond(d, C.DEGRADED)["status"] == "False"
    obs = stuck(m, pending_pod(unschedulable=UNBOUND))
    obs.cache_pvc = {**bound(), "status": {"phase": "Pending"}}
    art = cond(decide(m, obs, NOW), C.ARTIFACT_READY)
    assert art["reason"] == C.PRECOMPILE_UNSCHEDULABLE and "unbound immediate" in art["message"]


def test_a_refused_pod_shows_the_job_controllers_failed_create() -> None:
    m = model("m", GENERATE)
    event = {"reason": "FailedCreate", "lastTimestamp": "2026-11-21T10:00:05Z", "message": (
        'Error creating: pods "spyre-compile-x-abcde" is forbidden: exceeded quota: no-pods, '
        "requested: pods=1, used: pods=0, limited: pods=0")}
    d = decide(m, stuck(m, None, [event]), NOW)
    art = cond(d, C.ARTIFACT_READY)
    assert art["reason"] == C.PRECOMPILE_POD_REJECTED and "exceeded quota" in art["message"]
    assert cond(d, C.DEGRADED)["reason"] == C.PRECOMPILE_POD_REJECTED
    # No pod and no such Event: the Job controller has not created it yet; nothing to say.
    d = decide(m, stuck(m, None, []), NOW)
    assert cond(d, C.ARTIFACT_READY)["reason"] == C.COMPILING


def test_a_running_precompile_pod_is_compiling() -> None:
    m = model("m", GENERATE)
    obs = stuck(m, {"name": "p", "phase": "Running", "ready": True}, job=live_job(m, ready=1))
    d = decide(m, obs, NOW)
    assert cond(d, C.ARTIFACT_READY)["reason"] == C.COMPILING
    assert cond(d, C.DEGRADED)["status"] == "False"


# ---------------------------------------------------------------- replacing a stuck Job


def _job_deleted(d: Any, m: dict[str, Any]) -> bool:
    return any(kind.__name__ == "Job" and n == plan_for(m).job_name for kind, n in d.delete)


@pytest.mark.parametrize("fix", [
    {"precompile": {"nodeSelector": {"pool": "cpu"}}},
    {"precompile": {"nodeSelector": {"pool": "cpu-big"}, "tolerations": [
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]}},
    {"precompile": {"nodeSelector": {"pool": "cpu-big"},
                    "resources": {"requests": {"memory": "8Gi"}}}},
])
def test_fixing_a_field_outside_the_key_replaces_the_stuck_job(fix: dict[str, Any]) -> None:
    before = model("m", PLACED)
    job = live_job(before)
    after = model("m", {**PLACED, **fix}, generation=2)
    assert plan_for(after).key == plan_for(before).key, "the fix does not change the key"
    d = decide(after, stuck(after, pending_pod(unschedulable=UNSCHEDULABLE), job=job), NOW)
    assert _job_deleted(d, after), d.status["artifact"]
    assert d.job is None  # created again by the next reconcile, from the fixed spec
    assert "replacing precompile Job" in d.status["artifact"]["message"]
    # the next reconcile (the Job is gone) creates it from the new template
    d = decide(after, Observed(cache_pvc=bound()), NOW)
    assert d.job is not None
    assert d.job.spec.template.spec.nodeSelector == fix["precompile"]["nodeSelector"]


def test_a_missing_token_secret_fixed_by_naming_another_replaces_the_stuck_job() -> None:
    spec = {**GENERATE, "model": {**GENERATE["model"], "tokenSecret": {"name": "hf", "key": "t"}}}
    before = model("m", spec)
    job = live_job(before)
    fixed = copy.deepcopy(spec)
    fixed["model"]["tokenSecret"] = {"name": "hf-token", "key": "token"}
    after = model("m", fixed, generation=2)
    if plan_for(after).key != plan_for(before).key:
        pytest.skip("the token Secret is part of the key here")
    pod = pending_pod(waiting="CreateContainerConfigError", waitingMessage='secret "hf" not found')
    assert _job_deleted(decide(after, stuck(after, pod, job=job), NOW), after)


def test_a_job_that_makes_progress_or_is_not_stuck_is_never_replaced() -> None:
    before = model("m", PLACED)
    after = model("m", {**PLACED, "precompile": {"nodeSelector": {"pool": "cpu"}}}, generation=2)
    running = live_job(before, ready=1)
    pod = {"name": "p", "phase": "Running", "ready": True}
    assert not _job_deleted(decide(after, stuck(after, pod, job=running), NOW), after)
    pulling = pending_pod(waiting="ContainerCreating")  # pulling a large image is progress
    assert not _job_deleted(decide(after, stuck(after, pulling, job=live_job(before)), NOW), after)
    done = live_job(before, "Complete")
    assert not _job_deleted(decide(after, Observed(cache_pvc=bound(), job=done), NOW), after)


def test_models_sharing_a_job_never_replace_each_others_template() -> None:
    a = model("a", PLACED)
    b = model("b", {**PLACED, "precompile": {"nodeSelector": {"pool": "cpu"}}})
    assert plan_for(a).key == plan_for(b).key
    owners = [plan_for(a).owner, plan_for(b).owner]
    job = live_job(a, owners=owners)  # a's template
    obs = stuck(b, pending_pod(unschedulable=UNSCHEDULABLE), job=job)
    obs.job_owners = owners
    assert not _job_deleted(decide(b, obs, NOW), b), "b would replace a's Job, then a b's"
    obs.job_owners = [plan_for(b).owner]  # a left the key: b's template may replace it
    assert _job_deleted(decide(b, obs, NOW), b)


def test_fixing_the_template_retries_a_failed_compile_at_once() -> None:
    before = model("m", PLACED)
    failed = live_job(before, "Failed")
    failed["status"]["conditions"][0]["lastTransitionTime"] = NOW
    after = model("m", {**PLACED, "precompile": {"nodeSelector": {"pool": "cpu"}}}, generation=2)
    d = decide(after, Observed(cache_pvc=bound(), job=failed), NOW)
    assert _job_deleted(d, after) and "template changed" in d.status["artifact"]["message"]
    d = decide(before, Observed(cache_pvc=bound(), job=failed), NOW)
    assert not _job_deleted(d, before) and d.status["artifact"]["phase"] == "Failed"


# ---------------------------------------------------------------- superseded and finished Jobs


def test_finished_precompile_jobs_expire() -> None:
    job = build_precompile_job(plan_for(model("m", GENERATE)), [])
    assert job.spec.ttlSecondsAfterFinished == PRECOMPILE_JOB_TTL_SECONDS


def _edited(m: dict[str, Any], max_model_len: int, gen: int) -> dict[str, Any]:
    out = model("m", {**GENERATE, "compile": {"maxModelLen": max_model_len, "maxNumSeqs": 16}},
                generation=gen)
    out["status"] = m.get("status")
    return out


def test_an_edit_stops_the_job_of_the_spec_it_replaced() -> None:
    first = model("m", GENERATE)
    old_job = live_job(first)
    edited = _edited(first, 3072, 2)
    obs = Observed(cache_pvc=bound(), owned_jobs=[old_job])
    d = decide(edited, obs, NOW)
    assert (old_job["metadata"]["name"]) in [n for k, n in d.delete if k.__name__ == "Job"]
    assert d.job is not None and d.job.metadata.name != old_job["metadata"]["name"]
    # another model still needs that artifact: the Job stays (its owners are that model's)
    obs.needed_jobs = {(plan_for(first).claim, plan_for(first).key)}
    d = decide(edited, obs, NOW)
    assert old_job["metadata"]["name"] not in [n for _, n in d.delete]


def test_an_edit_and_its_revert_stop_the_job_of_the_edit() -> None:
    first = model("m", GENERATE)
    edit_job = live_job(_edited(first, 3072, 2))
    reverted = model("m", GENERATE, generation=3)
    obs = Observed(cache_pvc=bound(), job=live_job(first, "Complete"), owned_jobs=[edit_job])
    d = decide(reverted, obs, NOW)
    assert edit_job["metadata"]["name"] in [n for _, n in d.delete]
    assert plan_for(first).job_name not in [n for _, n in d.delete]


def _failed_status(m: dict[str, Any], due: str, attempts: int = 2) -> dict[str, Any]:
    plan = plan_for(m)
    return {"artifact": {
        "key": plan.key, "claim": plan.claim, "path": plan.artifact_dir(), "phase": "Failed",
        "jobName": plan.job_name, "attempts": attempts, "nextRetryAt": due,
        "reason": C.MODEL_NOT_FOUND, "message": "ModelNotFound: no such repository"}}


def test_a_failed_job_removed_by_its_ttl_keeps_its_reason_and_retry_time() -> None:
    m = model("m", GENERATE)
    later = "2026-11-21T10:30:00Z"
    m["status"] = _failed_status(m, later)
    d = decide(m, Observed(cache_pvc=bound()), NOW)
    assert d.job is None, "the failed Job is gone: no compile before the retry is due"
    art = cond(d, C.ARTIFACT_READY)
    assert art["reason"] == C.MODEL_NOT_FOUND and "no such repository" in art["message"]
    assert d.status["artifact"]["phase"] == "Failed"
    assert d.status["artifact"]["nextRetryAt"] == later
    assert d.status["artifact"]["reason"] == C.MODEL_NOT_FOUND
    assert cond(d, C.DEGRADED)["reason"] == C.MODEL_NOT_FOUND
    assert d.requeue_after == 30 * 60
    # due: the next attempt's Job
    d = decide(m, Observed(cache_pvc=bound()), later)
    assert d.job is not None and d.status["artifact"]["attempts"] == 3
    assert d.job.metadata.annotations[names.ATTEMPT_ANNOTATION] == "3"
    # or asked for at once
    m["metadata"]["annotations"] = {RETRY_ANNOTATION: "1"}
    assert decide(m, Observed(cache_pvc=bound()), NOW).job is not None


def test_a_failed_compile_records_its_reason() -> None:
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=bound(), job=live_job(m, "Failed"))
    obs.job_pods = [{"name": "p", "terminated": {"exitCode": 1, "message": json.dumps(
        {"reason": "ModelNotFound", "message": "no such repository"})}}]
    st = decide(m, obs, NOW).status["artifact"]
    assert st["reason"] == C.MODEL_NOT_FOUND and "no such repository" in st["message"]


def test_a_new_model_of_a_key_another_compiled_does_not_compile_once_the_job_expired() -> None:
    a, obs = model("a", GENERATE), Observed(cache_pvc=bound())
    obs.job = live_job(a, "Complete")
    a_status = decide(a, obs, NOW).status
    b = model("b", GENERATE)
    peers = Observed(cache_pvc=bound(), claim_artifacts=a_status["cache"]["artifacts"])
    d = decide(b, peers, NOW)
    assert d.job is None and d.status["artifact"]["phase"] == "Ready", d.status["artifact"]
    # not on a claim created again since (another UID), nor once a GC Job removed it
    assert decide(b, Observed(cache_pvc=bound(uid="pvc-2"),
                              claim_artifacts=peers.claim_artifacts), NOW).job is not None
    compiled = a_status["artifact"]["completedAt"]  # 10:02:30
    peers.collected = {plan_for(b).key: "2026-11-21T10:05:00Z"}  # removed after it was compiled
    assert decide(b, peers, NOW).job is not None
    # a removal the claim recorded before the peer compiled it again is stale (the record
    # outlives GC Jobs: issue 31, 3)
    peers.collected = {plan_for(b).key: "2026-11-01T00:00:00Z"}
    assert compiled > "2026-11-01T00:00:00Z"
    d = decide(b, peers, NOW)
    assert d.job is None and d.status["artifact"]["phase"] == "Ready", d.status["artifact"]


# ---------------------------------------------------------------- one retry budget per key


def test_models_sharing_a_key_share_one_retry_budget() -> None:
    """Each model kept its own attempt count: N models retried a shared compile N times as
    often. The attempt is the Job's: every sharer waits for the same retry time."""
    policy = Policy(retry_base_seconds=60, retry_cap_seconds=3600)
    failed_at = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    a, b = model("a", GENERATE), model("b", GENERATE)
    job = live_job(a, "Failed", attempt=3)
    job["status"]["conditions"][0]["lastTransitionTime"] = NOW
    due = (failed_at + timedelta(seconds=policy.retry_delay(3))).strftime("%Y-%m-%dT%H:%M:%SZ")
    b["status"] = {"artifact": {"key": plan_for(b).key, "claim": plan_for(b).claim,
                                "attempts": 1}}  # b saw only the first attempt
    at_two_minutes = "2026-11-21T10:02:00Z"
    for m in (a, b):
        d = decide(m, Observed(cache_pvc=bound(), job=job), at_two_minutes, policy)
        assert not _job_deleted(d, m), "retried before the Job's own backoff"
        assert d.status["artifact"]["nextRetryAt"] == due
        assert d.status["artifact"]["attempts"] == 3
    d = decide(b, Observed(cache_pvc=bound(), job=job), due, policy)
    assert _job_deleted(d, b) and d.status["artifact"]["attempts"] == 4


# ---------------------------------------------------------------- a deleted Deployment


def test_a_deleted_deployment_serves_the_old_artifact_while_the_new_one_compiles() -> None:
    m = model("m", GENERATE)
    obs = Observed(cache_pvc=bound(), job=live_job(m, "Complete"))
    obs.deployment = deployment_obj(decide(m, obs, NOW), ready=1)
    m["status"] = decide(m, obs, NOW).status
    old_key = plan_for(m).key
    edited = _edited(m, 3072, 2)
    obs = Observed(cache_pvc=bound(), job=live_job(edited), deployment=obs.deployment)
    st = decide(edited, obs, NOW).status
    edited["status"] = st
    # the Deployment is deleted while the new key compiles
    d = decide(edited, Observed(cache_pvc=bound(), job=live_job(edited)), NOW)
    dep = next((o for o in d.apply if o.kind == "Deployment"), None)
    assert dep is not None, "not recreated until the compile ends"
    assert served_key(dep.to_dict()) == old_key
    assert d.status["servingArtifactKey"] == old_key
    args = dep.spec.template.spec.containers[0].args
    assert "--max-model-len" in args and "3072" not in args  # the old shape


# ---------------------------------------------------------------- the controller reads the pod


class PodsAndEvents:
    """A client whose lists return the given pods and Events (as the API server would)."""

    def __init__(self, pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
        self.pods, self.events = pods, events
        self.lists: list[str] = []

    def list(self, resource: type, namespace: str | None = None, **selectors: Any) -> Any:
        self.lists.append(resource.__name__)
        items = self.pods if resource.__name__ == "Pod" else [
            e for e in self.events if e["involvedObject"]["uid"] == selectors["fields"][
                "involvedObject.uid"]]

        async def gen() -> Any:
            for item in items:
                yield type("Obj", (), {"to_dict": lambda self, item=item: item})()

        return gen()


def _controller(m: dict[str, Any], job: dict[str, Any], client: PodsAndEvents) -> Any:
    """A controller whose caches hold ``m`` and its live ``job``; a recording applier."""
    from spyre_operator.control.controller import Caches, Controller

    from .test_controller_failures import RecordingApplier

    key = (m["metadata"]["namespace"], m["metadata"]["name"])
    caches = Caches({"models": {key: [m]}, "jobs": {(key[0], job["metadata"]["name"]): [job]}})
    c = Controller(client=client, caches=caches, workers=1, clock=lambda: NOW)  # type: ignore[arg-type]
    c.applier = RecordingApplier()  # type: ignore[assignment]
    return c


def _reconcile(m: dict[str, Any], job: dict[str, Any], client: PodsAndEvents) -> Any:
    key = (m["metadata"]["namespace"], m["metadata"]["name"])
    c = _controller(m, job, client)

    async def run() -> Any:
        d = await c.reconcile_key(key)
        return d, key in c.queue._timers

    return asyncio.run(run())


def test_the_controller_reads_the_pod_of_a_running_job_and_looks_again() -> None:
    m = model("m", GENERATE)
    pod = {"metadata": {"name": "spyre-compile-x-abcde"}, "status": {
        "phase": "Pending", "containerStatuses": [{"name": "precompile", "ready": False, "state": {
            "waiting": {"reason": "ErrImagePull", "message": 'pull "engine:nope": not found'}}}]}}
    client = PodsAndEvents([pod], [])
    d, again = _reconcile(m, live_job(m), client)
    art = cond(d, C.ARTIFACT_READY)
    assert art["reason"] == C.IMAGE_PULL_FAILED and 'pull "engine:nope"' in art["message"]
    assert again, "nothing else announces a change of the pod: look again soon"
    # its pod runs (the Job counts it ready): not read, compiling
    client = PodsAndEvents([pod], [])
    d, again = _reconcile(m, live_job(m, ready=1), client)
    assert client.lists == [] and cond(d, C.ARTIFACT_READY)["reason"] == C.COMPILING


def test_a_job_gone_before_its_owners_patch_is_looked_at_again_not_failed() -> None:
    """The Job the caches show was deleted an instant ago (its namespace being deleted, a TTL):
    the API server's 404 on the patch of its owners says the cache is behind, as a 409 would.
    The model is looked at again in a second (the watch brings the DELETED event), with no error
    and no "failed (retry in ...)" warning (seen in CI: the routing test, which asserts that its
    operator logs no failed reconcile, read the one of another test's namespace being
    deleted)."""
    from lightkube import ApiError
    from lightkube.models.meta_v1 import Status

    m = model("m", GENERATE)
    job = live_job(m)
    job_name = job["metadata"]["name"]
    key = (m["metadata"]["namespace"], m["metadata"]["name"])
    c = _controller(m, job, PodsAndEvents([], []))
    applier = c.applier
    patched: list[Any] = []

    async def gone(job: Any, live: Any) -> bool:
        patched.append(live)
        raise ApiError(status=Status(code=404, reason="NotFound",
                                     message=f'jobs.batch "{job_name}" not found'))

    applier.ensure_job = gone  # type: ignore[method-assign]
    delays: list[float] = []
    c.queue.add_after = lambda k, delay: delays.append(delay)  # type: ignore[method-assign]
    asyncio.run(c.reconcile_key(key))
    assert patched and patched[0] is not None, "the Job was not in the caches"
    assert c.stats.errors == 0
    assert 1.0 in delays, delays


def test_the_controller_reads_the_failed_create_events_of_a_job_without_pods() -> None:
    m = model("m", GENERATE)
    job = live_job(m)
    event = {"involvedObject": {"uid": job["metadata"]["uid"]}, "reason": "FailedCreate",
             "type": "Warning", "lastTimestamp": NOW,
             "message": 'Error creating: pods "x" is forbidden: exceeded quota: no-pods'}
    other = {**event, "involvedObject": {"uid": "another-job"}, "message": "not this one"}
    client = PodsAndEvents([], [other, event])
    d, _ = _reconcile(m, job, client)
    deg = cond(d, C.DEGRADED)
    assert deg["reason"] == C.PRECOMPILE_POD_REJECTED and "exceeded quota" in deg["message"]
    assert client.lists == ["Pod", "Event"]


def test_fixing_the_download_env_replaces_the_stuck_job() -> None:
    before = model("m", GENERATE)
    after = model("m", {**GENERATE, "model": {**GENERATE["model"], "downloadEnv": [
        {"name": "HF_ENDPOINT", "value": "http://hf-mirror.local"}]}}, generation=2)
    assert plan_for(after).key == plan_for(before).key
    pod = pending_pod(waiting="CreateContainerConfigError",
                      waitingMessage='configmap "ca-bundle" not found')
    assert _job_deleted(decide(after, stuck(after, pod, job=live_job(before)), NOW), after)
