"""spec.serving.canary (issue 30): a new artifact serves on canary pods beside the previous one
for a window, then rolls out; a canary pod that stops with CanaryFailed rolls the model back."""

from __future__ import annotations

import copy
import json
from typing import Any

from spyre_operator.decide import Observed, decide, served_key
from spyre_operator.decide import conditions as C
from spyre_operator.decide.canary_report import CanaryReport, ServedReport
from spyre_operator.decide.observed import RETRY_ANNOTATION
from spyre_operator.desired import names

from .samples import GENERATE
from .test_reconcile import cond, deployment_obj, plan_for
from .test_rollback import _complete, _deployment_key, _with_status, model

T0, T1, T2, T3, T4 = (f"2026-11-21T10:0{i}:00Z" for i in range(5))
CANARY = {"replicas": 1, "durationSeconds": 120, "maxErrorRatio": 0.05, "minRequests": 10}
FAILED = json.dumps({"reason": "CanaryFailed",
                     "message": "6 of its 10 requests failed with a server error (60%, the "
                                "bound is 5%)"})  # fmt: skip


def _spec(max_model_len: int | None = None) -> dict[str, Any]:
    spec = copy.deepcopy(GENERATE)
    spec["serving"] = {**spec.get("serving", {}), "canary": CANARY}
    if max_model_len is not None:
        spec["compile"] = {"maxModelLen": max_model_len}
    return spec


def _canary(d: Any) -> dict[str, Any] | None:
    dep = next((o for o in d.apply if o.kind == "Deployment"
                and o.metadata.name == names.canary_name("m")), None)  # fmt: skip
    return dep.to_dict() if dep is not None else None


def _running(d: Any) -> dict[str, Any]:
    """status.canary without its progress message."""
    return {k: v for k, v in d.status["canary"].items() if k != "message"}


def _main_key(d: Any) -> str | None:
    dep = next((o for o in d.apply if o.kind == "Deployment" and o.metadata.name == "m"), None)
    return served_key(dep.to_dict()) if dep is not None else None


def _available(dep: dict[str, Any], n: int) -> dict[str, Any]:
    dep = copy.deepcopy(dep)
    dep["metadata"]["generation"] = 1
    dep["status"] = {"observedGeneration": 1, "replicas": n, "updatedReplicas": n,
                     "readyReplicas": n, "availableReplicas": n}  # fmt: skip
    return dep


def _a_serves_then_b_compiled() -> tuple[dict[str, Any], dict[str, Any], Observed]:
    """A rolled out (no canary: a model's first artifact has none); the spec edited to B and
    B compiled. Returns (a, b with status, obs with A's Deployment)."""
    a = model("m", _spec())
    d = decide(a, _complete(a), T0)
    assert _canary(d) is None, "the first artifact of a model has no canary"
    dep_a = deployment_obj(d, ready=1)
    obs = _complete(a)
    obs.deployment = dep_a
    d = decide(_with_status(a, d.status), obs, T0)
    b = _with_status(model("m", _spec(3072)), d.status)
    obs = _complete(b)
    obs.deployment = dep_a
    return a, b, obs


def test_a_new_artifact_runs_its_canary_beside_the_previous_one_then_rolls_out() -> None:
    a, b, obs = _a_serves_then_b_compiled()
    key_a, key_b = plan_for(a).key, plan_for(b).key
    d = decide(b, obs, T1)
    assert _main_key(d) == key_a, "the main Deployment keeps A while the canary runs"
    canary = _canary(d)
    assert canary is not None and served_key(canary) == key_b
    assert canary["spec"]["replicas"] == 1
    selector = canary["spec"]["selector"]["matchLabels"]
    assert selector == {**names.server_selector("m"), names.CANARY_LABEL: "true"}
    pod_labels = canary["spec"]["template"]["metadata"]["labels"]
    assert names.server_selector("m").items() <= pod_labels.items(), "the Service reaches it"
    args = canary["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--canary-seconds") + 1] == "120"
    assert args[args.index("--canary-max-error-ratio") + 1] == "0.05"
    progressing = cond(d, C.PROGRESSING)
    assert (progressing["status"], progressing["reason"]) == ("True", C.CANARY_RUNNING)
    assert "starts (0/1 canary pod available)" in progressing["message"]
    ready = cond(d, C.READY)
    assert (ready["status"], ready["reason"]) == ("True", C.SERVING_PREVIOUS_ARTIFACT)
    assert "runs its canary" in ready["message"]
    assert _running(d) == {"artifactKey": key_b, "phase": "Running", "createdTime": T1,
                           "deadlineTime": "2026-11-21T10:33:00Z"}  # fmt: skip

    # Its pod is available: the window starts, and a resync before its end changes nothing.
    obs.canary_deployment = _available(canary, 1)
    obs.server_pods = [_pod(b, T1)]
    obs.canary_reports = {"m-canary-0": CanaryReport(judged=4, errors=0)}
    b = _with_status(b, d.status)
    d = decide(b, obs, T1)
    assert _running(d)["startTime"] == T1
    assert _main_key(d) == key_a and d.requeue_after is not None and d.requeue_after <= 120
    assert "within its bounds (at most 5% server errors" in cond(d, C.PROGRESSING)["message"]
    b = _with_status(b, d.status)
    d = decide(b, obs, T2)  # 60 s in
    assert _main_key(d) == key_a and d.status["canary"]["startTime"] == T1

    assert "pod m-canary-0 judged 4 of the 10 requests needed" in cond(d, C.PROGRESSING)[
        "message"]

    # Issue 44: the window is over, but the canary judged 4 of its 10 requests: no promotion
    # (an idle canary proves nothing); the rollout waits, and says for what.
    d = decide(b, obs, T3)
    assert d.status["canary"]["phase"] == "Running" and _main_key(d) == key_a
    assert (d.status["canary"]["judgedRequests"], d.status["canary"]["minRequests"]) == (4, 10)
    progressing = cond(d, C.PROGRESSING)
    assert progressing["reason"] == C.CANARY_AWAITING_TRAFFIC, progressing
    assert "judged 4 of the 10 requests needed" in progressing["message"]
    assert d.requeue_after is not None and d.requeue_after <= 10
    # A count that cannot be read is no count either.
    obs.canary_reports = {"m-canary-0": "http://10.0.0.9:8000/health/canary: TimeoutError"}
    d = decide(b, obs, T3)
    assert cond(d, C.PROGRESSING)["reason"] == C.CANARY_AWAITING_TRAFFIC
    assert "TimeoutError" in cond(d, C.PROGRESSING)["message"]

    # The requests came: the Deployment rolls out to B; the canary stays until that is done.
    obs.canary_reports = {"m-canary-0": CanaryReport(judged=214, errors=1)}
    d = decide(b, obs, T3)
    assert d.status["canary"]["phase"] == "Passed" and d.status["canary"]["passedTime"] == T3
    assert "pod m-canary-0 judged 214 requests" in d.status["canary"]["message"]
    assert "of 10" not in d.status["canary"]["message"], d.status["canary"]["message"]
    assert _main_key(d) == key_b
    assert (names.canary_name("m")) not in [n for _, n in d.delete]
    dep_b = deployment_obj(d, ready=1, replicas=2)
    dep_b["status"]["updatedReplicas"] = 1  # rolling
    obs.deployment = dep_b
    b = _with_status(b, d.status)
    d = decide(b, obs, T3)
    assert _main_key(d) == key_b and _canary(d) is None
    assert names.canary_name("m") not in [n for _, n in d.delete]
    obs.deployment = deployment_obj(d, ready=1)  # rolled out
    d = decide(_with_status(b, d.status), obs, T4)
    assert names.canary_name("m") in [n for _, n in d.delete], "removed once B rolled out"
    assert d.status["canary"]["phase"] == "Passed"
    assert d.status["lastGoodArtifactKey"] == key_b


def test_a_canary_that_breaks_its_bounds_rolls_back_and_a_retry_runs_it_again() -> None:
    a, b, obs = _a_serves_then_b_compiled()
    key_a, key_b = plan_for(a).key, plan_for(b).key
    d = decide(b, obs, T1)
    obs.canary_deployment = _available(_canary(d) or {}, 1)
    b = _with_status(b, d.status)
    d = decide(b, obs, T1)
    # The canary pod stopped on CanaryFailed (the kubelet may have restarted it already).
    obs.server_pods = [{"name": "m-canary-x", "artifact": plan_for(b).short_key, "canary": True,
                        "terminated": {"exitCode": 1, "message": FAILED}}]  # fmt: skip
    b = _with_status(b, d.status)
    d = decide(b, obs, T2)
    art = d.status["artifact"]
    assert (art["key"], art["phase"], art["reason"]) == (key_b, "Failed", C.CANARY_FAILED)
    assert "6 of its 10 requests failed" in art["message"]
    assert _main_key(d) == key_a and _canary(d) is None
    assert names.canary_name("m") in [n for _, n in d.delete]
    assert plan_for(b).job_name not in [n for _, n in d.delete], "not compiled again"
    assert d.status["canary"]["phase"] == "Failed"
    ready = cond(d, C.READY)
    assert (ready["status"], ready["reason"]) == ("True", C.SERVING_PREVIOUS_ARTIFACT)
    assert "failed its canary" in ready["message"]
    degraded = cond(d, C.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", C.CANARY_FAILED)
    assert any(e[0] == "Warning" and C.CANARY_FAILED in e[2] for e in d.events)
    assert C.event_type(C.CANARY_FAILED) == "Warning"

    # The canary is gone; status remembers the refusal: A keeps serving, no new canary.
    obs.canary_deployment, obs.server_pods = None, []
    b = _with_status(b, d.status)
    d = decide(b, obs, T3)
    assert d.status["artifact"]["phase"] == "Failed" and _canary(d) is None
    assert _main_key(d) == key_a

    # The retry annotation runs the canary again, from a new window.
    b = _with_status(b, d.status)
    b["metadata"].setdefault("annotations", {})[RETRY_ANNOTATION] = "1"
    d = decide(b, obs, T4)
    assert d.status["artifact"]["phase"] == "Ready"
    assert _canary(d) is not None and _main_key(d) == key_a
    assert _running(d) == {"artifactKey": key_b, "phase": "Running", "createdTime": T4,
                           "deadlineTime": "2026-11-21T10:36:00Z"}, "a new window, a new deadline"


def test_without_canary_a_new_artifact_rolls_out_at_once_and_a_leftover_canary_goes() -> None:
    a, b, obs = _a_serves_then_b_compiled()
    plain = copy.deepcopy(b)
    del plain["spec"]["serving"]["canary"]
    d = decide(plain, obs, T1)
    assert _deployment_key(d) == plan_for(b).key and _canary(d) is None
    assert "canary" not in d.status
    # A canary Deployment left from before the setting was removed is deleted.
    obs.canary_deployment = {"metadata": {"name": names.canary_name("m")}}
    d = decide(plain, obs, T1)
    assert names.canary_name("m") in [n for _, n in d.delete]


def test_an_operator_restarted_mid_canary_keeps_its_window() -> None:
    """The window's start is in status, not in memory: a fresh decision with the same
    cluster state and status keeps it (and passes at the same time)."""
    a, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    obs.canary_deployment = _available(_canary(d) or {}, 1)
    obs.server_pods = [_pod(b, T1)]
    obs.canary_reports = {"m-canary-0": CanaryReport(judged=10, errors=0)}
    d = decide(_with_status(b, d.status), obs, T1)
    saved = _with_status(b, d.status)
    again = decide(copy.deepcopy(saved), obs, T2)
    assert again.status["canary"]["startTime"] == T1
    assert decide(copy.deepcopy(saved), obs, T3).status["canary"]["phase"] == "Passed"


def test_the_main_deployment_at_zero_available_promotes_no_unjudged_artifact() -> None:
    """Issue 44: deleting the main pod during a canary switched at once. Every pod of the
    previous artifact down for a moment (a restart, an eviction) is no verdict: the canary
    runs (its pods serve meanwhile) and the Deployment keeps the previous artifact."""
    a, b, obs = _a_serves_then_b_compiled()
    assert obs.deployment is not None
    d = decide(b, obs, T1)
    obs.canary_deployment = _available(_canary(d) or {}, 1)
    b = _with_status(b, d.status)
    obs.deployment["status"]["availableReplicas"] = 0  # the main pod was deleted
    for t in (T1, T2):
        d = decide(b, obs, t)
        assert _main_key(d) == plan_for(a).key and _canary(d) is not None
        assert d.status["canary"]["phase"] == "Running"
        b = _with_status(b, d.status)


def test_no_canary_for_a_model_scaled_to_zero() -> None:
    """Scaled to zero: nothing serves to compare with, and the switch starts no pod."""
    a, b, obs = _a_serves_then_b_compiled()
    b["spec"]["replicas"] = 0
    d = decide(b, obs, T1)
    assert _canary(d) is None and _main_key(d) == plan_for(b).key


def test_a_restarted_canary_pod_still_reports_why_it_stopped() -> None:
    """The kubelet restarts the container that stopped on CanaryFailed: its last state is the
    verdict (a main Deployment's pod running again is history, not a failure)."""
    from spyre_operator.control.common import compact_pod

    def pod(canary: bool) -> dict[str, Any]:
        labels = {names.ARTIFACT_LABEL: "abc", **({names.CANARY_LABEL: "true"} if canary else {})}
        return {"metadata": {"name": "p", "labels": labels}, "status": {"containerStatuses": [
            {"ready": False, "state": {"running": {"startedAt": T4}},
             "lastState": {"terminated": {"exitCode": 1, "message": FAILED}}}]}}  # fmt: skip

    assert compact_pod(pod(canary=True))["terminated"]["message"] == FAILED
    assert "terminated" not in compact_pod(pod(canary=False))


def test_a_canary_pod_that_fails_its_output_check_ends_the_canary() -> None:
    a, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    mismatch = json.dumps({"reason": "OutputMismatch", "message": "prompt 0 position 3: ..."})
    obs.canary_deployment = _canary(d)
    obs.server_pods = [{"name": "m-canary-x", "artifact": plan_for(b).short_key, "canary": True,
                        "terminated": {"exitCode": 1, "message": mismatch}}]  # fmt: skip
    d = decide(_with_status(b, d.status), obs, T2)
    assert d.status["artifact"]["reason"] == C.OUTPUT_MISMATCH
    assert d.status["canary"]["phase"] == "Failed" and "position 3" in d.status["canary"]["message"]
    assert names.canary_name("m") in [n for _, n in d.delete]
    assert _main_key(d) == plan_for(a).key


def test_the_reconcile_lists_the_pods_of_a_canary_that_does_not_come_up() -> None:
    """The canary pod stops with CanaryFailed (or OutputMismatch) and restarts: the pod is not
    watched and the main Deployment is whole, so only the canary Deployment's missing pod says
    to look. (On the real node the refusal never came: pods were listed only when the main
    Deployment was short.) The reconcile lists the pods, refuses the artifact, and looks again
    later while a pod is missing."""
    from .test_controller_failures import controller_with, reconcile_once

    _, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    canary = _canary(d)
    assert canary is not None
    canary["metadata"]["generation"] = 1
    canary["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                        "availableReplicas": 0, "unavailableReplicas": 1}  # fmt: skip
    obs.canary_deployment = canary
    b = _with_status(b, d.status)
    pod = {"name": "m-canary-0", "artifact": plan_for(b).short_key, "canary": True,
           "phase": "Running", "ready": False,
           "terminated": {"exitCode": 1, "reason": "Error", "message": FAILED}}  # fmt: skip
    c, applier = controller_with(b)
    listed: list[Any] = []

    async def server_pods(key: Any) -> list[dict[str, Any]]:
        listed.append(key)
        return [pod]

    async def nothing(*args: Any) -> None:
        return None

    c.observer.observe = lambda *args: obs  # type: ignore[method-assign]
    c.observer.precompile = nothing  # type: ignore[method-assign]
    c.observer.recent_server_pods = server_pods  # type: ignore[method-assign]
    delays = reconcile_once(c)
    assert listed == [("ns", "m")], "the canary's pods were not looked at"
    assert applier.statuses, "nothing written"
    art = applier.statuses[-1]["artifact"]
    assert art["reason"] == C.CANARY_FAILED and "canary pod m-canary-0" in art["message"], art
    assert delays, "no second look while the canary pod is missing"


def test_pods_are_missing_when_fewer_are_available_than_exist_or_are_wanted() -> None:
    """A surge rollout to a new artifact keeps the old pod available (maxUnavailable 0): the
    new pod refusing the artifact shows only as one more pod than are available."""
    from spyre_operator.decide.serving import pods_missing

    def dep(replicas: int, available: int) -> dict[str, Any]:
        return {"status": {"replicas": replicas, "availableReplicas": available}}

    assert pods_missing(dep(2, 1), 1), "a surge rollout whose new pod does not come up"
    assert pods_missing(dep(1, 0)), "a canary whose pod does not come up"
    assert pods_missing(dep(1, 1), 2), "a scale-up not there yet"
    assert not pods_missing(dep(1, 1), 1) and not pods_missing(dep(3, 3), 1)
    assert not pods_missing(dep(0, 0), 1), "no pod yet: nothing to explain"
    assert not pods_missing(None, 1)


def test_the_writer_deletes_no_deployment_but_the_models_own_canary() -> None:
    """The chart lets the operator delete Deployments for the canary's sake; a decision to
    delete any other (the serving Deployment: a bug) is refused before the API is asked, and
    so is the canary's name when no canary of this model was observed."""
    import asyncio

    import pytest
    from lightkube.resources.apps_v1 import Deployment

    from .test_controller_failures import controller_with

    _, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    canary = _canary(d)
    c, applier = controller_with(b)
    for target, seen in (("m", canary), (names.canary_name("m"), None)):
        d.delete = [(Deployment, target)]
        obs.canary_deployment = seen
        with pytest.raises(RuntimeError, match="deletes only the model's own canary"):
            asyncio.run(c.writer.execute(b, obs, d))
    assert not [w for w in applier.writes if w[0] == "delete"], applier.writes
    d.delete, obs.canary_deployment = [(Deployment, names.canary_name("m"))], canary
    asyncio.run(c.writer.execute(b, obs, d))
    assert ("delete", "Deployment") in applier.writes


def _pod(b: dict[str, Any], ready_since: str, name: str = "m-canary-0") -> dict[str, Any]:
    return {"name": name, "artifact": plan_for(b).short_key, "canary": True, "phase": "Running",
            "ready": True, "readySince": ready_since}  # fmt: skip


def test_a_canary_pod_created_again_or_restarted_starts_the_window_again() -> None:
    """Issue 44: a canary Deployment deleted (slot pressure, by hand) or an edit that restarts
    its pods kept status.canary.startTime, and the new pod passed as soon as it was available.
    The window starts when the canary's pods last turned Ready (the pods say it, not memory)."""
    _, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    obs.canary_deployment = _available(_canary(d) or {}, 1)
    obs.server_pods = [_pod(b, T1)]
    b = _with_status(b, d.status)
    d = decide(b, obs, T1)
    assert d.status["canary"]["startTime"] == T1
    # At T3 the window (120 s from T1) would be over; the pod was created again at T2.
    obs.server_pods = [_pod(b, T2, "m-canary-1")]
    b = _with_status(b, d.status)
    d = decide(b, obs, T3)
    assert d.status["canary"]["phase"] == "Running" and d.status["canary"]["startTime"] == T2
    assert _main_key(d) != plan_for(b).key
    # A lagging pod list (the old pod's earlier time) never moves the start back.
    obs.server_pods = [_pod(b, T1)]
    b = _with_status(b, d.status)
    d = decide(b, obs, T3)
    assert d.status["canary"]["startTime"] == T2
    # While a canary pod is not available the window is not running at all.
    obs.canary_deployment = _available(_canary(d) or {}, 0)
    b = _with_status(b, d.status)
    d = decide(b, obs, T3)
    assert "startTime" not in d.status["canary"] and d.status["canary"]["phase"] == "Running"
    obs.canary_deployment = _available(_canary(d) or {}, 1)
    obs.server_pods = [_pod(b, T3)]
    d = decide(_with_status(b, d.status), obs, T3)
    assert d.status["canary"]["startTime"] == T3
    assert d.status["canary"]["createdTime"] == T1, "the deadline still counts from the start"


def test_compact_pod_records_when_a_canary_pod_turned_ready() -> None:
    from spyre_operator.control.common import compact_pod

    def pod(canary: bool) -> dict[str, Any]:
        labels = {names.ARTIFACT_LABEL: "abc", **({names.CANARY_LABEL: "true"} if canary else {})}
        return {"metadata": {"name": "p", "labels": labels}, "status": {
            "containerStatuses": [{"ready": True, "state": {"running": {"startedAt": T1}}}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T2}]}}

    assert compact_pod(pod(canary=True))["readySince"] == T2
    assert "readySince" not in compact_pod(pod(canary=False))


def test_a_canary_that_never_comes_up_fails_by_its_deadline_with_what_it_was_doing() -> None:
    """Issue 44: a canary pod that never turned Ready left Progressing=True CanaryRunning for
    good. Its pod's failure is in Degraded while it runs; by the deadline the artifact is
    refused (CanaryDeadlineExceeded), the canary removed, the previous artifact serving."""
    a, b, obs = _a_serves_then_b_compiled()
    b["spec"]["serving"]["canary"]["deadlineSeconds"] = 180
    d = decide(b, obs, T1)
    assert d.status["canary"]["deadlineTime"] == "2026-11-21T10:04:00Z"
    assert d.requeue_after is not None and d.requeue_after <= 180
    obs.canary_deployment = _available(_canary(d) or {}, 0)
    obs.server_pods = [{"name": "m-canary-0", "artifact": plan_for(b).short_key, "canary": True,
                        "phase": "Pending", "ready": False, "waiting": "ImagePullBackOff",
                        "waitingMessage": "Back-off pulling image \"engine:nope\""}]  # fmt: skip
    b = _with_status(b, d.status)
    d = decide(b, obs, T2)
    degraded = cond(d, C.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", C.IMAGE_PULL_FAILED), degraded
    assert "m-canary-0" in degraded["message"] and "engine:nope" in degraded["message"]
    assert _main_key(d) == plan_for(a).key and d.status["canary"]["phase"] == "Running"
    b = _with_status(b, d.status)
    d = decide(b, obs, T4)  # 180 s after T1
    art = d.status["artifact"]
    assert (art["phase"], art["reason"]) == ("Failed", C.CANARY_DEADLINE_EXCEEDED), art
    assert "deadlineSeconds (180s)" in art["message"] and "ImagePullBackOff" in art["message"]
    assert "fails unless passed by" not in art["message"], art["message"]  # said once, above
    assert d.status["canary"]["phase"] == "Failed"
    assert d.status["canary"]["reason"] == C.CANARY_DEADLINE_EXCEEDED
    assert names.canary_name("m") in [n for _, n in d.delete]
    assert _main_key(d) == plan_for(a).key
    degraded = cond(d, C.DEGRADED)
    assert (degraded["status"], degraded["reason"]) == ("True", C.CANARY_DEADLINE_EXCEEDED)
    assert C.event_type(C.CANARY_DEADLINE_EXCEEDED) == "Warning"
    # Gone and remembered: no new canary until the retry annotation.
    obs.canary_deployment, obs.server_pods = None, []
    d = decide(_with_status(b, d.status), obs, "2026-11-21T10:05:00Z")
    assert _canary(d) is None and d.status["artifact"]["phase"] == "Failed"


def test_a_canary_pod_waiting_for_a_node_says_so() -> None:
    """A canary pod no node has room for (the cards all serving) showed only "starts (0/1
    canary pod available)": the scheduler's word is in Progressing, as for the main rollout."""
    _, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    obs.canary_deployment = _available(_canary(d) or {}, 0)
    obs.server_pods = [{"name": "m-canary-0", "artifact": plan_for(b).short_key, "canary": True,
                        "phase": "Pending", "ready": False,
                        "unschedulable": "0/3 nodes are available: 3 Insufficient "
                                         "ibm.com/spyre_vf."}]  # fmt: skip
    d = decide(_with_status(b, d.status), obs, T2)
    progressing = cond(d, C.PROGRESSING)
    assert progressing["reason"] == C.INSUFFICIENT_CAPACITY, progressing
    assert "Insufficient ibm.com/spyre_vf" in progressing["message"], progressing
    assert "canary of artifact" in progressing["message"], progressing
    assert d.status["canary"]["phase"] == "Running"


def test_the_deadline_must_exceed_the_window() -> None:
    import pytest
    from pydantic import ValidationError
    from spyre_operator.api.v1alpha1 import CanarySpec

    assert CanarySpec.model_validate({"durationSeconds": 600}).deadline == 2400
    with pytest.raises(ValidationError, match="deadlineSeconds must exceed"):
        CanarySpec.model_validate({"durationSeconds": 600, "deadlineSeconds": 600})


def test_the_promote_and_abort_annotations_act_on_the_artifact_they_name_only() -> None:
    from spyre_operator.decide.observed import (
        CANARY_ABORT_ANNOTATION,
        CANARY_PROMOTE_ANNOTATION,
    )

    a, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    obs.canary_deployment = _available(_canary(d) or {}, 1)
    b = _with_status(b, d.status)
    # A value naming another artifact (kept by a GitOps source from an earlier edit): nothing.
    b["metadata"]["annotations"] = {CANARY_PROMOTE_ANNOTATION: plan_for(a).short_key,
                                    CANARY_ABORT_ANNOTATION: "0123456789ab"}  # fmt: skip
    d = decide(b, obs, T1)
    assert d.status["canary"]["phase"] == "Running" and _main_key(d) == plan_for(a).key
    # Promote: passes now, before its window, and says so.
    promoted = copy.deepcopy(_with_status(b, d.status))
    promoted["metadata"]["annotations"][CANARY_PROMOTE_ANNOTATION] = plan_for(b).short_key
    p = decide(promoted, obs, T1)
    assert p.status["canary"]["phase"] == "Passed", p.status["canary"]
    assert p.status["canary"]["reason"] == C.PROMOTED_BY_ANNOTATION
    assert CANARY_PROMOTE_ANNOTATION in p.status["canary"]["message"]
    assert _main_key(p) == plan_for(b).key
    # Abort: refused, the previous artifact keeps serving.
    aborted = copy.deepcopy(_with_status(b, d.status))
    aborted["metadata"]["annotations"][CANARY_ABORT_ANNOTATION] = plan_for(b).short_key
    x = decide(aborted, obs, T2)
    assert x.status["artifact"]["reason"] == C.CANARY_ABORTED
    assert x.status["canary"]["phase"] == "Failed" and _main_key(x) == plan_for(a).key
    assert names.canary_name("m") in [n for _, n in x.delete]


def test_a_switch_that_leaves_no_old_pod_says_what_it_costs_before_it_happens() -> None:
    """Issue 44, 7: with replicas 1 and the default rollout (maxSurge 0, maxUnavailable 1),
    the old pod is gone before the new one has loaded and checked its answers. The switch's
    Progressing says so, and how to avoid it; not with a surge or a canary."""
    a, b, obs = _a_serves_then_b_compiled()
    plain = copy.deepcopy(b)
    del plain["spec"]["serving"]["canary"]
    d = decide(plain, obs, T1)
    assert _main_key(d) == plan_for(b).key
    progressing = cond(d, C.PROGRESSING)
    assert progressing["reason"] == C.ROLLING_OUT, progressing
    assert "serves nothing while the new pods load" in progressing["message"]
    assert "maxSurge: 1" in progressing["message"]
    surge = copy.deepcopy(plain)
    surge["spec"]["serving"]["rollout"] = {"maxSurge": 1, "maxUnavailable": 0}
    d = decide(surge, obs, T1)
    assert "serves nothing" not in cond(d, C.PROGRESSING)["message"]


def test_a_refused_artifact_ends_the_rollout_for_kstatus_and_kubectl_wait() -> None:
    """Once the spec's artifact is refused (its canary's verdict, or OutputMismatch), the
    previous artifact serves and nothing is in progress: Progressing and Reconciling False
    with the refusal's reason, Degraded and Stalled True, so ``kubectl wait
    --for=condition=Progressing=False`` returns and kstatus (Flux) reads Failed. They stayed
    True ``RollingOut`` "rolling out artifact <refused>" for good."""
    for verdict in (FAILED, json.dumps({"reason": "OutputMismatch",
                                        "message": "prompt 0 position 3: ..."})):
        a, b, obs = _a_serves_then_b_compiled()
        d = decide(b, obs, T1)
        obs.canary_deployment = _canary(d)
        obs.server_pods = [{"name": "m-canary-x", "artifact": plan_for(b).short_key,
                            "canary": True, "terminated": {"exitCode": 1, "message": verdict}}]
        d = decide(_with_status(b, d.status), obs, T2)
        reason = json.loads(verdict)["reason"]
        assert d.status["artifact"]["reason"] == reason
        obs.canary_deployment, obs.server_pods = None, []  # the canary went
        b = _with_status(b, d.status)
        for t in (T3, T4):
            d = decide(b, obs, t)
            assert _main_key(d) == plan_for(a).key
            for type_, status in ((C.PROGRESSING, "False"), (C.RECONCILING, "False"),
                                  (C.DEGRADED, "True"), (C.STALLED, "True")):
                c = cond(d, type_)
                assert (c["status"], c["reason"]) == (status, reason), (type_, c)
            assert plan_for(b).short_key in cond(d, C.PROGRESSING)["message"]
            assert cond(d, C.READY)["status"] == "True", "the previous artifact serves"
            b = _with_status(b, d.status)


def _served(judged: int, ttft_mean: float, errors: int = 0, tpot_mean: float = 0.01,
            ttft_base: tuple[float, int] = (0.0, 0)) -> ServedReport:  # fmt: skip
    """A pod's /health/served figures: ``ttft_base`` plus ``judged`` requests at the means."""
    return ServedReport(
        judged + ttft_base[1], errors, 1.0,
        ttft=(ttft_base[0] + judged * ttft_mean, ttft_base[1] + judged),
        tpot=(judged * tpot_mean, judged + ttft_base[1]),
    )  # fmt: skip


def _baseline_pod(a: dict[str, Any], name: str = "m-a-0") -> dict[str, Any]:
    return {"name": name, "artifact": plan_for(a).short_key, "phase": "Running", "ready": True,
            "readySince": T0}  # fmt: skip


def _canary_window_over(ttft_canary: float) -> tuple[dict[str, Any], dict[str, Any], Observed,
                                                     Any]:  # fmt: skip
    """B's canary beside A's pod: the window starts at T1, when A's pod had served 500 slow
    requests (1 s to first token each); in the window A's pod serves 40 at 0.1 s and the
    canary 20 at ``ttft_canary``. Returns (a, b, obs, the decision at the window's end)."""
    a, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    obs.canary_deployment = _available(_canary(d) or {}, 1)
    obs.server_pods = [_pod(b, T1), _baseline_pod(a)]
    obs.canary_reports = {"m-canary-0": CanaryReport(judged=0, errors=0)}
    history = (500.0, 500)
    obs.served_reports = {"m-canary-0": _served(0, 0.0),
                          "m-a-0": _served(0, 0.0, ttft_base=history)}  # fmt: skip
    b = _with_status(b, d.status)
    d = decide(b, obs, T1)
    start = d.status["canary"]["baselineStart"]
    assert start == [{"pod": "m-a-0", "judged": 500, "errors": 0, "ttftSum": 500.0,
                      "ttftCount": 500, "tpotSum": 0.0, "tpotCount": 500}], start
    assert d.status["canary"]["baselineFrom"] == T1
    b = _with_status(b, d.status)
    obs.canary_reports = {"m-canary-0": CanaryReport(judged=20, errors=0)}
    obs.served_reports = {"m-canary-0": _served(20, ttft_canary),
                          "m-a-0": _served(40, 0.1, ttft_base=history)}  # fmt: skip
    return a, b, obs, decide(b, obs, T3)


def test_a_canary_slower_than_the_baseline_over_its_window_fails() -> None:
    """Issue 44, 5: compared with the previous artifact's pods over the same window (their
    slow history before it left out): 0.5 s to first token against 0.1 s is 5x."""
    a, b, obs, d = _canary_window_over(0.5)
    key_a = plan_for(a).key
    st = d.status["canary"]
    assert st["phase"] == "Running" and _main_key(d) == key_a, "not promoted"
    assert "5.0x the baseline's 100.0 ms" in st["baselineVerdict"], st
    comparison = st["comparison"]
    assert comparison["canary"] == {"pods": 1, "requests": 20, "errorRatio": 0.0,
                                    "ttftSeconds": 0.5, "tpotSeconds": 0.01}, comparison
    assert comparison["baseline"]["requests"] == 40 and comparison["baseline"][
        "ttftSeconds"] == 0.1, comparison
    assert "compared worse than artifact" in cond(d, C.PROGRESSING)["message"]
    # the next reconcile refuses the artifact; A keeps serving, the comparison stays in status
    d = decide(_with_status(b, d.status), obs, T3)
    art = d.status["artifact"]
    assert (art["phase"], art["reason"]) == ("Failed", C.CANARY_FAILED), art
    assert "compared with the previous artifact's pods over its window" in art["message"]
    assert _main_key(d) == key_a and names.canary_name("m") in [n for _, n in d.delete]
    assert d.status["canary"]["phase"] == "Failed"
    assert d.status["canary"]["comparison"] == comparison


def test_a_canary_within_the_ratio_of_the_baseline_passes_and_says_so() -> None:
    _, b, _, d = _canary_window_over(0.15)
    st = d.status["canary"]
    assert st["phase"] == "Passed" and _main_key(d) == plan_for(b).key, st
    assert "baselineVerdict" not in st
    assert "within 2x of the baseline" in st["message"], st["message"]


def test_too_few_baseline_requests_or_unread_figures_compare_nothing() -> None:
    a, b, obs = _a_serves_then_b_compiled()
    d = decide(b, obs, T1)
    obs.canary_deployment = _available(_canary(d) or {}, 1)
    obs.server_pods = [_pod(b, T1), _baseline_pod(a)]
    obs.canary_reports = {"m-canary-0": CanaryReport(judged=20, errors=0)}
    # the baseline served 3 in the window; an older engine's pod has no /health/served
    obs.served_reports = {"m-canary-0": _served(0, 0.0), "m-a-0": _served(0, 0.0)}
    b = _with_status(b, d.status)
    b = _with_status(b, decide(b, obs, T1).status)
    obs.served_reports = {"m-canary-0": _served(20, 5.0), "m-a-0": _served(3, 0.1)}
    d = decide(b, obs, T3)
    assert d.status["canary"]["phase"] == "Passed"
    assert "not compared yet: the baseline served 3 of the 10 requests needed" in d.status[
        "canary"]["message"]
    obs.served_reports = {"m-canary-0": _served(20, 5.0),
                          "m-a-0": "http://10.0.0.8:8000/health/served answered HTTP 404"}
    d = decide(b, obs, T3)
    assert d.status["canary"]["phase"] == "Passed"
    assert "unread: m-a-0: http://10.0.0.8:8000/health/served answered HTTP 404" in d.status[
        "canary"]["comparison"]["message"]


def test_a_baseline_pod_restarted_in_the_window_counts_from_its_restart() -> None:
    from spyre_operator.decide.baseline import _since

    start = {"pod": "p", "judged": 500, "errors": 0, "ttftSum": 500.0, "ttftCount": 500}
    assert _since(_served(40, 0.1, ttft_base=(500.0, 500)), start)[:3] == (40, 0, (
        _served(40, 0.1).ttft[0], 40.0))  # type: ignore[index]
    restarted = _served(7, 0.2)
    assert _since(restarted, start)[:3] == (7, 0, (7 * 0.2, 7.0))


def test_the_baseline_pods_are_read_as_the_pod_list_gives_them(monkeypatch: Any) -> None:
    """The real node's run of the comparison: the previous artifact's pod was listed but never
    read ("unread: ... not read yet"), because the pod list kept an address for canary pods
    only. Through compact_pod and the observer's selection, both sides' pods are read."""
    from spyre_operator.control.common import compact_pod

    def pod(name: str, canary: bool, ip: str) -> dict[str, Any]:
        labels = {names.ARTIFACT_LABEL: "abc", **({names.CANARY_LABEL: "true"} if canary else {})}
        return {"metadata": {"name": name, "labels": labels}, "status": {
            "podIP": ip, "containerStatuses": [{"ready": True,
                                                "state": {"running": {"startedAt": T1}}}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": T2}]}}

    listed = [compact_pod(pod("main", False, "10.0.0.1")), compact_pod(pod("c", True, "10.0.0.2"))]
    read: list[str] = []

    async def fake_read(_: Any, ip: str, port: int) -> ServedReport:
        read.append(ip)
        return ServedReport(0, 0, 0.0)

    import asyncio

    from spyre_operator.control import observe

    monkeypatch.setattr(observe, "read_served", fake_read)
    got = asyncio.run(observe.Observer.served_reports(None, listed, 8000))  # type: ignore[arg-type]
    assert sorted(read) == ["10.0.0.1", "10.0.0.2"] and set(got) == {"main", "c"}
