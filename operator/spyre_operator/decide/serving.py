"""The serving decision: which artifact the Deployment serves (:func:`decide_serving`), and
what its rollout and serving pods report (pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.v1alpha1 import SpyreModelSpec
from ..desired import names
from ..desired.plan import ModelPlan, plan_model
from . import conditions as C
from . import pods as P
from .artifact import ArtifactOutcome
from .observed import (
    READY,
    Observed,
    parse_served_spec,
    remembered_serving,
    served_key,
)
from .summary import EngineFailure, parse_termination_message


@dataclass
class ServingOutcome:
    """What the Deployment serves: the spec's artifact once ready, else the previous one."""

    plan: ModelPlan | None = None
    key: str | None = None
    #: The spec's artifact is ready, but the Deployment keeps the previous one: every slot
    #: of the rollout budget is in use (the budget's message).
    waiting: str | None = None

    def current(self, plan: ModelPlan) -> bool:
        return self.plan is not None and self.key == plan.key and self.plan.claim == plan.claim


def decide_serving(
    plan: ModelPlan,
    obs: Observed,
    artifact: ArtifactOutcome,
    old_status: dict[str, Any] | None = None,
) -> ServingOutcome:
    """Switch to the spec's artifact only once it is ready on the spec's claim.

    Until then the Deployment is rebuilt from the spec it was made from (its annotation):
    its shape, compile-time env and cache claim match the artifact it runs. A Deployment
    that is gone (deleted by hand or by a cleanup script) is rebuilt from what status
    remembers (servingArtifactKey, servedSpec): the old artifact serves again while the new
    one compiles. A ready artifact waits too while the rollout budget has no free slot
    (``obs.rollout_slot``), if the live Deployment serves another artifact to users.
    """
    if artifact.phase == READY:
        new = ServingOutcome(plan, plan.key)
        available = ((obs.deployment or {}).get("status") or {}).get("availableReplicas") or 0
        if obs.rollout_slot.free or obs.deployment is None or available == 0:
            # A first Deployment (or one deleted by hand), or one serving nothing (scaled to
            # zero, crashing): switching it takes nothing away from users.
            return new
        previous = previous_serving(plan, obs, old_status)
        if previous.plan is None or previous.current(plan):
            return new  # nothing else serves: not a switch to a new artifact
        previous.waiting = (
            f"{obs.rollout_slot.message('rollout', 'max-concurrent-rollouts')}; the "
            f"Deployment switches to artifact {plan.short_key} when a slot frees"
        )
        return previous
    if artifact.answers_refused:
        # OutputMismatch: the artifact the Deployment last rolled out (status remembers it:
        # the live Deployment may already be the refused one's) serves again.
        last = last_good_serving(plan, old_status or {})
        if last.plan is not None and last.key != plan.key:
            return last
    return previous_serving(plan, obs, old_status)


def last_good_serving(plan: ModelPlan, status: dict[str, Any]) -> ServingOutcome:
    """status.lastGoodArtifactKey and the spec it was served from, at the spec's replicas."""
    return _serving(plan, *remembered_serving(status, "lastGoodArtifactKey", "lastGoodServedSpec"))


def last_good(deployment: dict[str, Any] | None, status: dict[str, Any]) -> tuple[Any, Any]:
    """(lastGoodArtifactKey, lastGoodServedSpec): the live Deployment's artifact once its
    rollout is done with every replica available (each passed its output check before Ready,
    where the engine checks), else what status remembers."""
    if deployment is not None:
        spec = deployment.get("spec") or {}
        replicas = int(spec.get("replicas", 1) or 0)
        key = served_key(deployment)
        raw = _trusted_served_spec(deployment, key, status)
        if replicas > 0 and key and raw and rollout_of(deployment, replicas, key).done:
            return key, raw
    return status.get("lastGoodArtifactKey"), status.get("lastGoodServedSpec")


def _trusted_served_spec(
    deployment: dict[str, Any], key: str | None, status: dict[str, Any]
) -> str | None:
    """The spec the live Deployment serves ``key`` from, as the operator recorded it: status'
    ``servedSpec`` when status names that artifact (only the operator writes status; anyone
    who may edit Deployments may edit their annotation, issue 45), else the Deployment's
    annotation (status lost, or written by an operator from before the field)."""
    if key and status.get("servingArtifactKey") == key and status.get("servedSpec"):
        return str(status["servedSpec"])
    raw = (deployment.get("metadata", {}).get("annotations") or {}).get(
        names.SERVED_SPEC_ANNOTATION)
    return str(raw) if raw else None


def verified_key(good_key: str | None, good_spec: str | None) -> str | None:
    """The last good artifact, if its rollout ran under ``outputCheck: Enforce`` (under Warn a
    pod that failed the check still turned Ready; under Off none was asked): the one the
    output-check ConfigMap names (desired/verified.py)."""
    spec = parse_served_spec(good_spec)
    if not good_key or spec is None:
        return None
    return good_key if spec.serving.output_check == "Enforce" else None


def previous_serving(
    plan: ModelPlan, obs: Observed, old_status: dict[str, Any] | None
) -> ServingOutcome:
    """What the live Deployment serves (else what status remembers), at the spec's replicas;
    its spec from the operator's record when status has it (:func:`_trusted_served_spec`),
    and never one whose engine image the allow-list refuses."""
    live_key = served_key(obs.deployment)
    old_spec = parse_served_spec(
        _trusted_served_spec(obs.deployment, live_key, old_status or {})
    ) if obs.deployment is not None else None
    if old_spec is not None and old_spec.engine.image and not plan.site.allows(
            old_spec.engine.image):
        old_spec = None
    if not live_key or old_spec is None:
        live_key, old_spec = remembered_serving(old_status or {})
    return _serving(plan, live_key, old_spec)


def _serving(plan: ModelPlan, key: str | None, spec: SpyreModelSpec | None) -> ServingOutcome:
    """Artifact ``key`` served from an earlier ``spec``, at the current spec's replicas."""
    if not key or spec is None:
        return ServingOutcome()
    spec = spec.model_copy(update={"replicas": plan.spec.replicas})
    return ServingOutcome(
        plan_model(plan.name, plan.namespace, plan.uid, spec, plan.site.for_served_spec()), key
    )


@dataclass(frozen=True)
class Rollout:
    """The Deployment's progress."""

    done: bool = False
    total: int = 0
    available: int = 0
    stall: str | None = None


def rollout_of(deployment: dict[str, Any] | None, replicas: int, key: str | None) -> Rollout:
    if not deployment:
        return Rollout()
    st = deployment.get("status") or {}
    gen = deployment.get("metadata", {}).get("generation", 0)
    available = st.get("availableReplicas") or 0
    total = st.get("replicas") or 0
    done = (
        served_key(deployment) == key  # else what we just applied has not been observed yet
        and st.get("observedGeneration", 0) >= gen
        and (st.get("updatedReplicas") or 0) == replicas
        and available == replicas
        and total == replicas
    )
    stall = None
    for c in st.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            stall = c.get("message") or "rollout exceeded its progress deadline"
    return Rollout(done, total, available, stall)


def pods_missing(deployment: dict[str, Any] | None, wanted: int = 0) -> bool:
    """Whether a Deployment has fewer available pods than it has, or than ``wanted``: a pod
    that does not come up, whose container status (unwatched) says why. That is a crash loop,
    a pod waiting for a node, or a new artifact's pod refusing it (OutputMismatch,
    CanaryFailed) while the previous pods stay available (a surge rollout, or a canary
    Deployment beside the main one)."""
    if not deployment:
        return False
    st = deployment.get("status") or {}
    total = st.get("replicas") or 0
    return total > 0 and (st.get("availableReplicas") or 0) < max(total, wanted)


#: ``pod.status.reason`` of pods the kubelet ended itself.
NODE_ENDED_POD_REASONS = frozenset({"Evicted", "Preempting", "NodeShutdown", "Terminated"})


def engine_failure_of(pods: list[dict[str, Any]]) -> tuple[str, str] | None:
    """A serving container that exited non-zero (e.g. refusing a mismatched artifact): the
    condition reason (the engine's own when it names the artifact's problem, else EngineFailed)
    and the message.

    A container the kubelet cannot start (its image cannot be pulled, a Secret or ConfigMap
    it references is missing) is reported the same way, with the kubelet's reason and
    message, rather than as a rollout in progress until the progress deadline.

    Not a pod the node ended (evicted under disk or memory pressure, node shutdown,
    preemption): its container was killed, not failed, and the Deployment replaces it; the
    failed pod object stays until garbage-collected and must not mark the model failed.
    """
    for p in pods:
        if p.get("reason") in NODE_ENDED_POD_REASONS:
            continue
        term = p.get("terminated")
        if term and term.get("exitCode") not in (None, 0):
            parsed = parse_termination_message(term.get("message"))
            if isinstance(parsed, EngineFailure):
                reason = (
                    parsed.reason if parsed.reason in C.ENGINE_SERVE_REASONS else C.ENGINE_FAILED
                )
                return reason, f"pod {p['name']}: {parsed.reason}: {parsed.message}"
            code = term.get("exitCode")
            return C.ENGINE_FAILED, f"pod {p['name']}: engine exited with code {code}"
        if p.get("waiting") == "CrashLoopBackOff":
            return C.ENGINE_FAILED, f"pod {p['name']}: CrashLoopBackOff"
        cannot = P.cannot_start(p)  # the one answer for serving and precompile pods
        if cannot is not None:
            return cannot
    return None


def unschedulable_of(pods: list[dict[str, Any]]) -> str | None:
    """Why serving pods wait for a node (the scheduler's message), if some do."""
    stuck = [p for p in pods if p.get("unschedulable")]
    if not stuck:
        return None
    first = stuck[0]
    return (
        f"{len(stuck)} pod{'s' if len(stuck) > 1 else ''} cannot be scheduled "
        f"({first['name']}: {first['unschedulable']})"
    )[:1024]
