"""The canary decision (spec.serving.canary): a new artifact serves on canary pods beside the
previous artifact's for a window before the Deployment rolls out to it (pure, no I/O).

The canary pods judge their own requests (``spyre-engine serve --canary-seconds``,
engine/spyre_engine/canary.py) and stop with ``CanaryFailed`` when they break the bounds; the
artifact decision then refuses the artifact as it does on ``OutputMismatch``
(decide/artifact.py), the serving decision keeps the artifact rolled out last, and this one
removes the canary. A canary passes only with evidence: its window over (from when its pods
last turned Ready) and every canary pod's own count of judged requests (read from the pod,
Observed.canary_reports) at ``minRequests``. Everything it decides from is in the cluster: the
canary Deployment's status, its pods, their counts and status.canary (its start and deadline),
so a restarted operator decides the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from lightkube.resources.apps_v1 import Deployment

from ..desired import names
from ..desired.deployment import build_canary_deployment
from ..desired.plan import ModelPlan
from ..desired.verified import reads_verified
from . import conditions as C
from .artifact import ArtifactOutcome
from .baseline import compare
from .canary_report import CanaryReport
from .devices import unschedulable_reason
from .observed import (
    CANARY_PROMOTE_ANNOTATION,
    READY,
    Observed,
    fmt_time,
    parse_time,
    seconds_between,
    served_key,
)
from .serving import (
    ServingOutcome,
    engine_failure_of,
    previous_serving,
    rollout_of,
    unschedulable_of,
)

RUNNING, PASSED, FAILED = "Running", "Passed", "Failed"


@dataclass
class CanaryOutcome:
    """What the canary adds to the reconcile."""

    #: While it runs: what the main Deployment keeps serving (the previous artifact).
    hold: ServingOutcome | None = None
    #: The canary Deployment to apply, or to delete.
    deployment: Deployment | None = None
    delete: bool = False
    #: status.canary (None: not written).
    status: dict[str, Any] | None = None
    #: Progressing while it runs (or cannot start).
    cond: C.Cond | None = None
    #: A canary pod's engine failure (reason, message): Degraded says it.
    problem: tuple[str, str] | None = None
    requeue_after: float | None = None


def decide_canary(
    plan: ModelPlan,
    obs: Observed,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    old_status: dict[str, Any],
    now: str,
    annotations: dict[str, Any] | None = None,
) -> CanaryOutcome:
    """Run, pass, or remove the canary of the spec's artifact.

    A canary runs when serving.canary is set, the spec's artifact is ready and the Deployment
    would switch to it from another artifact (the first artifact of a model has none, nor a
    model at zero replicas: nothing to compare with). A main Deployment with no pod available
    (a restart, an eviction) is no reason to skip it: the canary's pods serve meanwhile. It
    passes once every canary pod has been Ready for durationSeconds without breaking the
    bounds (a canary pod created again, or restarted, starts the window again), or when the
    promote annotation names its artifact; the Deployment then rolls out and the canary is
    removed when that rollout is done. It fails when a canary pod stops with CanaryFailed (or
    OutputMismatch), when it is not passed by its deadline, or when the abort annotation names
    its artifact (decide/artifact.py refuses the artifact; the retry annotation runs the
    canary again).
    """
    spec = plan.spec.serving.canary
    old = old_status.get("canary") or {}
    mine = old.get("artifactKey") == plan.key
    live = obs.canary_deployment
    out = CanaryOutcome(delete=live is not None)
    if artifact.answers_refused:
        # CanaryFailed, its deadline, an abort, or a canary pod's OutputMismatch: the canary
        # is over.
        if mine or artifact.status.get("reason") in C.CANARY_REFUSED_REASONS:
            out.status = {
                **{k: old[k] for k in ("createdTime", "startTime", "comparison")
                   if mine and k in old},
                "artifactKey": plan.key,
                "phase": FAILED,
                "reason": artifact.status.get("reason"),
                "message": str(artifact.status.get("message") or "")[:1024],
            }
        return out
    if mine:
        out.status = old
    if spec is None or artifact.phase != READY or not serving.current(plan):
        return out  # none asked; the artifact is not ready, refused, or waits for a slot
    previous = previous_serving(plan, obs, old_status)
    if plan.spec.replicas == 0:
        return out  # scaled to zero: nothing to compare with, nothing serves to switch from
    if previous.plan is None or previous.key == plan.key:
        # A first rollout, or the Deployment serves this artifact already: a canary that
        # passed stays until that rollout is done (it still takes its share meanwhile).
        rolled = rollout_of(obs.deployment, plan.spec.replicas, plan.key).done
        out.delete = live is not None and (previous.plan is None or rolled)
        return out
    if mine and old.get("phase") == PASSED:
        out.delete = False
        return out  # the Deployment rolls out to it now
    out.delete = False
    out.hold = previous
    running = mine and old.get("phase") == RUNNING
    created = str(old.get("createdTime") or now) if running else now
    deadline = _deadline(created, spec.deadline)
    out.status = {
        "artifactKey": plan.key, "phase": RUNNING, "createdTime": created,
        **({"deadlineTime": deadline} if deadline else {}),
    }  # fmt: skip
    if obs.canary_foreign:
        out.cond = C.Cond(
            C.PROGRESSING, C.TRUE, C.NAME_CONFLICT,
            f"the canary of artifact {plan.short_key} cannot start: {obs.canary_foreign}",
        )  # fmt: skip
        out.status["message"] = out.cond.message
        return out
    out.deployment = build_canary_deployment(plan, plan.key, reads_verified(obs, live, plan.key))
    available = _available(live, plan.key)
    pods = [p for p in obs.server_pods if p.get("canary") and p.get("artifact") == plan.short_key]
    started = _window_start(old.get("startTime") if running else None, pods)
    if available < spec.replicas:
        started = None
    elif started is None:
        started = now  # available, but the pod cache does not show its pods yet
    previous_key = names.short_key(previous.key or "")
    count = f"{available}/{spec.replicas} canary pod{'s' if spec.replicas > 1 else ''}"
    promote = str((annotations or {}).get(CANARY_PROMOTE_ANNOTATION) or "")
    if promote and promote == plan.short_key:
        out.status = {
            **out.status, "phase": PASSED, "passedTime": now,
            "reason": C.PROMOTED_BY_ANNOTATION,
            "message": f"promoted by the annotation {CANARY_PROMOTE_ANNOTATION}={promote} "
                       f"({count} available then)",
        }  # fmt: skip
        if started is not None:
            out.status["startTime"] = started
        out.hold = None
        return out
    # A pod that is down now (a canary pod keeps its last termination once restarted, for
    # its verdict: one that serves again is no problem).
    out.problem = engine_failure_of([p for p in pods if not p.get("ready")])
    # In the condition only: status.canary has deadlineTime, and its message is what the
    # deadline's own message quotes (decide/artifact.py).
    until = f"; it fails unless passed by {deadline}" if deadline else ""
    if started is None:
        waits = unschedulable_of(pods)
        doing = (
            f"the canary of artifact {plan.short_key} starts ({count} available); artifact "
            f"{previous_key} serves meanwhile" + (f"; {out.problem[1]}" if out.problem else "")
            + (f"; {waits}" if waits else "")
        )  # fmt: skip
        reason = unschedulable_reason(plan, obs) if waits and not out.problem else C.CANARY_RUNNING
        out.cond = C.Cond(C.PROGRESSING, C.TRUE, reason, doing + until)
        out.status["message"] = doing[:1024]
        out.requeue_after = _seconds_until(now, deadline)
        return out
    out.status["startTime"] = started
    elapsed = seconds_between(started, now) or 0.0
    left = spec.duration_seconds - elapsed
    evidence = _evidence(obs, pods, spec.replicas, spec.min_requests)
    if evidence.least is not None:
        out.status["judgedRequests"] = evidence.least
    out.status["minRequests"] = spec.min_requests
    baseline = compare(
        obs, pods,
        [p for p in obs.server_pods if not p.get("canary") and p.get("artifact") == previous_key],
        old if running else {}, started, spec.min_requests, spec.max_latency_ratio, previous_key,
    )  # fmt: skip
    out.status.update(baseline.status)
    if left <= 0 and evidence.enough and baseline.worse:
        # decide/artifact.py refuses the artifact (CanaryFailed) on this record next.
        out.status["baselineVerdict"] = baseline.worse[:1024]
        out.requeue_after = 1.0
        doing = (
            f"artifact {plan.short_key}'s canary compared worse than artifact {previous_key}'s "
            f"pods over its window: {baseline.worse}; it fails"
        )
        out.cond = C.Cond(C.PROGRESSING, C.TRUE, C.CANARY_RUNNING, doing)
        out.status["message"] = doing[:1024]
        return out
    if left <= 0 and evidence.enough:
        out.status = {
            **out.status, "phase": PASSED, "passedTime": now, "reason": C.WINDOW_PASSED,
            "message": f"{count} served {spec.duration_seconds}s within the bounds "
                       f"({_bounds(plan)}), each judging at least {spec.min_requests} "
                       f"requests ({evidence.detail}); compared with artifact "
                       f"{previous_key}'s pods: {baseline.conclusion}",
        }  # fmt: skip
        out.hold = None  # the Deployment rolls out to the new artifact
        return out
    if left <= 0:
        # An idle canary proves nothing: the rollout waits for its requests (no watch says
        # when they come: look again), or its deadline.
        out.requeue_after = min(EVIDENCE_RECHECK_SECONDS, _seconds_until(now, deadline) or 1e9)
        doing = (
            f"artifact {plan.short_key}'s canary window of {spec.duration_seconds}s is over, "
            f"but it judged too few requests to promote it ({evidence.detail}; minRequests "
            f"{spec.min_requests} on every canary pod); artifact {previous_key} serves until "
            "it has"
        )  # fmt: skip
        out.cond = C.Cond(C.PROGRESSING, C.TRUE, C.CANARY_AWAITING_TRAFFIC, doing + until)
        out.status["message"] = doing[:1024]
        return out
    out.requeue_after = min(max(left, 1.0), _seconds_until(now, deadline) or left)
    doing = (
        f"artifact {plan.short_key} serves on {count} beside artifact {previous_key} "
        f"since {started} ({evidence.detail}); the Deployment rolls out to it after "
        f"{spec.duration_seconds}s within its bounds ({_bounds(plan)})"
    )  # fmt: skip
    out.cond = C.Cond(C.PROGRESSING, C.TRUE, C.CANARY_RUNNING, doing + until)
    out.status["message"] = doing[:1024]
    return out


#: A canary past its window without enough judged requests is looked at again this often.
EVIDENCE_RECHECK_SECONDS = 10.0


@dataclass(frozen=True)
class _Evidence:
    enough: bool
    #: the fewest requests a canary pod judged (None: none read)
    least: int | None
    detail: str


def _evidence(
    obs: Observed, pods: list[dict[str, Any]], replicas: int, min_requests: int
) -> _Evidence:
    """What the canary's Ready pods say they judged (obs.canary_reports, read from each pod):
    enough when every one of ``replicas`` pods judged ``min_requests``."""
    ready = sorted((p for p in pods if p.get("ready")), key=lambda p: str(p.get("name")))
    counts: list[int] = []
    parts: list[str] = []
    for p in ready:
        name = str(p.get("name"))
        got = obs.canary_reports.get(name)
        if isinstance(got, CanaryReport):
            counts.append(got.judged)
            parts.append(
                f"pod {name} judged {got.judged} of the {min_requests} requests needed"
                if got.judged < min_requests
                else f"pod {name} judged {got.judged} request{'s' if got.judged != 1 else ''} "
                     f"({min_requests} needed)")
        else:
            parts.append(f"pod {name}'s count unread ({got or 'not read yet'})")
    if not ready:
        parts.append("no Ready canary pod listed yet")
    enough = len(counts) == len(ready) >= replicas and all(n >= min_requests for n in counts)
    return _Evidence(enough, min(counts) if counts else None, "; ".join(parts)[:600])


def _window_start(recorded: str | None, pods: list[dict[str, Any]]) -> str | None:
    """The window's start: the latest time a canary pod of the artifact turned Ready (a pod
    created again, or restarted, is Ready again later), and never before what status recorded
    (a pod cache that lags behind shows an earlier one)."""
    times = [str(p["readySince"]) for p in pods if p.get("ready") and p.get("readySince")]
    candidates = [t for t in (recorded, max(times, default=None)) if parse_time(t)]
    return max(candidates, key=lambda t: parse_time(t)) if candidates else None  # type: ignore


def _deadline(created: str, seconds: int) -> str | None:
    t = parse_time(created)
    return fmt_time(t + timedelta(seconds=seconds)) if t is not None else None


def _seconds_until(now: str, then: str | None) -> float | None:
    left = seconds_between(now, then)
    return None if left is None else max(left, 1.0)


def _available(deployment: dict[str, Any] | None, key: str) -> int:
    """Available pods of the canary Deployment once it serves ``key`` (0 before)."""
    if not deployment or served_key(deployment) != key:
        return 0
    st = deployment.get("status") or {}
    if st.get("observedGeneration", 0) < deployment.get("metadata", {}).get("generation", 0):
        return 0
    return int(st.get("availableReplicas") or 0)


def _bounds(plan: ModelPlan) -> str:
    spec = plan.spec.serving.canary
    assert spec is not None
    text = (
        f"at most {spec.max_error_ratio:.0%} server errors once {spec.min_requests} requests "
        "are answered"
    )
    if spec.max_mean_latency_seconds is not None:
        text += f", a mean latency of at most {spec.max_mean_latency_seconds:g}s"
    return text
