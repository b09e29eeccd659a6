"""The canary decision (spec.serving.canary): a new artifact serves on canary pods beside the
previous artifact's for a window before the Deployment rolls out to it (pure, no I/O).

The canary pods judge their own requests (``spyre-engine serve --canary-seconds``,
engine/spyre_engine/canary.py) and stop with ``CanaryFailed`` when they break the bounds; the
artifact decision then refuses the artifact as it does on ``OutputMismatch``
(decide/artifact.py), the serving decision keeps the artifact rolled out last, and this one
removes the canary. Everything it decides from is in the cluster: the canary Deployment's
status and status.canary (the window's start), so a restarted operator decides the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightkube.resources.apps_v1 import Deployment

from .. import conditions as C
from ..desired import names
from ..desired.deployment import build_canary_deployment
from ..desired.plan import ModelPlan
from ..desired.verified import wants_verified_env
from .artifact import ArtifactOutcome
from .observed import READY, Observed, _parse_time, served_key
from .serving import ServingOutcome, _engine_failure, _previous_serving, _rollout

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
    requeue_after: float | None = None


def decide_canary(
    plan: ModelPlan,
    obs: Observed,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    old_status: dict[str, Any],
    now: str,
) -> CanaryOutcome:
    """Run, pass, or remove the canary of the spec's artifact.

    A canary runs when serving.canary is set, the spec's artifact is ready and the Deployment
    would switch to it from another artifact that serves (the first artifact of a model has
    none, nor a model at zero replicas or whose pods all fail: nothing to compare with). It
    passes once every canary pod has been available for durationSeconds without breaking the
    bounds; the Deployment then rolls out and the canary is removed when that rollout is done.
    It fails when a canary pod stops with CanaryFailed (or OutputMismatch): the artifact is
    refused (status.artifact says why; the retry annotation runs the canary again).
    """
    spec = plan.spec.serving.canary
    old = old_status.get("canary") or {}
    mine = old.get("artifactKey") == plan.key
    live = obs.canary_deployment
    out = CanaryOutcome(delete=live is not None)
    if artifact.answers_refused:
        # CanaryFailed, or a canary pod's OutputMismatch: either way the canary is over.
        if mine or artifact.status.get("reason") == C.CANARY_FAILED:
            out.status = {
                "artifactKey": plan.key,
                "phase": FAILED,
                "message": str(artifact.status.get("message") or "")[:1024],
            }
        return out
    if mine:
        out.status = old
    if spec is None or artifact.phase != READY or not serving.current(plan):
        return out  # none asked; the artifact is not ready, refused, or waits for a slot
    previous = _previous_serving(plan, obs, old_status)
    serves = int(((obs.deployment or {}).get("status") or {}).get("availableReplicas") or 0)
    if serves == 0 or plan.spec.replicas == 0:
        return out  # nothing serves the previous artifact (scaled to zero, crashing): switch
    if previous.plan is None or previous.key == plan.key:
        # A first rollout, or the Deployment serves this artifact already: a canary that
        # passed stays until that rollout is done (it still takes its share meanwhile).
        rolled = _rollout(obs.deployment, plan.spec.replicas, plan.key).done
        out.delete = live is not None and (previous.plan is None or rolled)
        return out
    if mine and old.get("phase") == PASSED:
        out.delete = False
        return out  # the Deployment rolls out to it now
    out.delete = False
    out.hold = previous
    if obs.canary_foreign:
        out.cond = C.Cond(
            C.PROGRESSING, C.TRUE, C.NAME_CONFLICT,
            f"the canary of artifact {plan.short_key} cannot start: {obs.canary_foreign}",
        )  # fmt: skip
        return out
    out.deployment = build_canary_deployment(plan, plan.key, wants_verified_env(live, plan.key))
    available = _available(live, plan.key)
    started = old.get("startTime") if mine and old.get("phase") == RUNNING else None
    if started is None and available >= spec.replicas:
        started = now
    out.status = {"artifactKey": plan.key, "phase": RUNNING}
    previous_key = names.short_key(previous.key or "")
    pods = f"{available}/{spec.replicas} canary pod{'s' if spec.replicas > 1 else ''}"
    if started is None:
        failure = _engine_failure(
            [p for p in obs.server_pods if p.get("canary") and p.get("artifact") == plan.short_key]
        )
        out.cond = C.Cond(
            C.PROGRESSING, C.TRUE, C.CANARY_RUNNING,
            f"the canary of artifact {plan.short_key} starts ({pods} available); artifact "
            f"{previous_key} serves meanwhile" + (f"; {failure[1]}" if failure else ""),
        )  # fmt: skip
        return out
    out.status["startTime"] = started
    t0, t = _parse_time(started), _parse_time(now)
    elapsed = (t - t0).total_seconds() if t0 is not None and t is not None else 0.0
    left = spec.duration_seconds - elapsed
    if left <= 0 and available >= spec.replicas:
        out.status = {**out.status, "phase": PASSED, "passedTime": now}
        out.hold = None  # the Deployment rolls out to the new artifact
        return out
    out.requeue_after = max(left, 1.0)
    out.cond = C.Cond(
        C.PROGRESSING, C.TRUE, C.CANARY_RUNNING,
        f"artifact {plan.short_key} serves on {pods} beside artifact {previous_key} "
        f"since {started}; the Deployment rolls out to it after {spec.duration_seconds}s "
        f"within its bounds ({_bounds(plan)})",
    )  # fmt: skip
    return out


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
