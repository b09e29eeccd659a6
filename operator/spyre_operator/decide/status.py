"""The status decision: Ready, Progressing, Degraded and Autoscaling from the other
decisions' outcomes (:func:`decide_status`; pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..desired import names
from ..desired.autoscaling import wants_hpa
from ..desired.networkpolicy import wants_network_policy
from ..desired.plan import ModelPlan
from ..desired.scaletozero import wants_scale_to_zero
from ..desired.service import wants_pdb
from . import conditions as C
from .artifact import ArtifactOutcome
from .cache import CacheOutcome
from .devices import device_class_problem, unschedulable_reason
from .observed import (
    COMPILING,
    DEFAULT_POLICY,
    FAILED,
    PENDING,
    RETRY_ANNOTATION,
    Observed,
    WriteError,
    parse_time,
    served_key,
)
from .scaletozero import ScaleToZeroOutcome
from .serving import Rollout, ServingOutcome, engine_failure_of, rollout_of, unschedulable_of


@dataclass(frozen=True)
class _StatusFacts:
    """What Ready, Progressing and Degraded are decided from, read once."""

    roll: Rollout
    #: The Deployment serves the spec's artifact on the spec's claim.
    current: bool
    #: (reason, message) of a serving pod that failed or cannot start.
    engine_failure: tuple[str, str] | None
    #: The API server rejected a write of this reconcile (its message).
    write_error: str | None
    #: Same-named objects the model wants that are not the operator's (why).
    conflict: str | None
    #: A scale-to-zero model: why it would not answer at zero (None: it would, or not one).
    zero_problem: str | None = None
    #: Progressing while the spec's artifact runs its canary (decide/canary.py), if it does.
    canary: C.Cond | None = None
    #: Serving pods no scheduler has looked at for SCHEDULER_SILENCE_SECONDS (why), if any.
    no_scheduler: str | None = None
    #: (reason, message) of a canary pod that failed or cannot start.
    canary_problem: tuple[str, str] | None = None
    #: The model's Service name is taken by an object that is not the operator's (why): the
    #: endpoint status gives reaches someone else's Service, whatever the pods do.
    foreign_service: str | None = None


def _conflict(plan: ModelPlan, obs: Observed) -> str | None:
    """The same-named objects that are not the operator's, among those the model wants.

    A foreign PodDisruptionBudget or HorizontalPodAutoscaler is in the way only when the
    model asks for one (more than one replica, spec.autoscaling): otherwise it is left alone
    and is no reason to mark the model Degraded (GitOps health would fail for nothing).
    """
    unwanted = set()
    if not wants_pdb(plan):
        unwanted.add("PodDisruptionBudget")
    if not wants_hpa(plan) or wants_scale_to_zero(plan):
        unwanted.add("HorizontalPodAutoscaler")
    if not wants_network_policy(plan):
        unwanted.add("NetworkPolicy")
    return "; ".join(v for k, v in obs.foreign.items() if k not in unwanted) or None


def decide_status(
    plan: ModelPlan,
    obs: Observed,
    cache: CacheOutcome,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    zero: ScaleToZeroOutcome | None = None,
    no_scheduler: str | None = None,
    canary: C.Cond | None = None,
    canary_problem: tuple[str, str] | None = None,
) -> list[C.Cond]:
    """Ready, Progressing and Degraded (CacheVolumeReady and ArtifactReady come as they are).

    Ready means the endpoint serves: at least one replica is available (or the model is
    scaled to zero). Fewer replicas than asked is reported by Progressing, and by Degraded
    once the rollout stalls; it never turns Ready False while pods serve.
    """
    facts = _StatusFacts(
        roll=rollout_of(obs.deployment, plan.spec.replicas, serving.key),
        current=serving.current(plan),
        engine_failure=engine_failure_of(
            [p for p in obs.server_pods if p.get("artifact") == names.short_key(serving.key or "")]
        ),
        write_error=write_error_message(obs.write_errors),
        conflict=_conflict(plan, obs),
        zero_problem=_zero_problem(zero),
        no_scheduler=no_scheduler,
        canary=canary,
        canary_problem=canary_problem,
        foreign_service=obs.foreign.get("Service"),
    )
    conds = [
        _ready(plan, cache, artifact, serving, facts),
        cache.cond,
        artifact.cond,
        _progressing(plan, obs, cache, artifact, serving, facts),
        _degraded(plan, obs, cache, artifact, facts),
    ]
    if zero is not None and zero.cond is not None:
        conds.append(zero.cond)
    elif plan.spec.autoscaling is not None and plan.spec.replicas == 0:
        conds.append(
            C.Cond(
                C.AUTOSCALING,
                C.FALSE,
                C.REPLICAS_AT_ZERO,
                "spec.replicas is 0 and the HorizontalPodAutoscaler does not scale from zero "
                f"(minReplicas {plan.spec.autoscaling.min_replicas}): set spec.replicas to "
                "start the model, or allow zero again (minReplicas: 0)",
            )
        )
    elif plan.spec.autoscaling is not None:
        conds.append(_autoscaling_condition(obs.hpa))
    return conds


def _zero_problem(zero: ScaleToZeroOutcome | None) -> str | None:
    """Why a scale-to-zero model would not answer at zero (its requests would find nothing).

    It answers when its Service points at the interceptor and KEDA reports the ScaledObject
    Ready: then a request wakes it. Until then, at zero, it is not Ready.
    """
    if zero is None or zero.cond is None:
        return None
    if zero.via_interceptor and zero.cond.status == C.TRUE:
        return None
    return zero.cond.message or "KEDA's ScaledObject is not Ready yet"


def _degraded(
    plan: ModelPlan, obs: Observed, cache: CacheOutcome, artifact: ArtifactOutcome, f: _StatusFacts
) -> C.Cond:
    """Degraded: the first problem users must act on."""
    claim_problem = cache.cond if cache.cond.reason in C.CLAIM_PROBLEMS else cache.problem
    for reason, message in (
        (C.NAME_CONFLICT, f.conflict),
        (C.RECONCILE_ERROR, f.write_error),
        (artifact.cond.reason, artifact.problem),
        (claim_problem.reason if claim_problem else "", claim_problem and claim_problem.message),
        (
            C.CLAIM_NOT_FOUND,
            None
            if obs.model_pvc_exists
            else f"model claim {plan.model_claim} not found in namespace {plan.namespace}",
        ),
        f.engine_failure or ("", None),
        f.canary_problem or ("", None),
        (C.ROLLOUT_STALLED, f.roll.stall),
        (C.DEVICE_CLASS_NOT_FOUND, device_class_problem(plan, obs)),
    ):
        if message:
            return C.Cond(C.DEGRADED, C.TRUE, reason, message)
    return C.Cond(C.DEGRADED, C.FALSE, C.AS_EXPECTED, "")


def _ready(
    plan: ModelPlan,
    cache: CacheOutcome,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    f: _StatusFacts,
) -> C.Cond:
    """Ready: does the endpoint serve?"""
    replicas, roll = plan.spec.replicas, f.roll
    if serving.key is None or serving.plan is None:
        if f.conflict:
            return C.Cond(C.READY, C.FALSE, C.NAME_CONFLICT, f.conflict)
        if f.write_error:
            return C.Cond(C.READY, C.FALSE, C.RECONCILE_ERROR, f.write_error)
        if artifact.phase == FAILED or artifact.stuck is not None:
            return C.Cond(C.READY, C.FALSE, artifact.cond.reason, artifact.cond.message)
        if cache.missing:
            return C.Cond(C.READY, C.FALSE, C.CLAIM_NOT_FOUND, cache.cond.message)
        if artifact.waiting:
            return C.Cond(C.READY, C.FALSE, C.WAITING_FOR_COMPILE_SLOT, artifact.cond.message)
        return C.Cond(C.READY, C.FALSE, C.COMPILING, f"compiling artifact {plan.short_key}")
    if f.foreign_service:
        return C.Cond(
            C.READY, C.FALSE, C.NAME_CONFLICT,
            f"the model's endpoint {plan.endpoint} is not its Service: {f.foreign_service}; "
            "its pods serve, but clients of that endpoint do not reach them"[:1024],
        )  # fmt: skip
    if replicas == 0 and f.zero_problem is not None:
        return C.Cond(
            C.READY, C.FALSE, C.SCALE_TO_ZERO_UNAVAILABLE,
            f"scaled to zero and nothing wakes the model: {f.zero_problem}"[:1024],
        )  # fmt: skip
    auto = plan.spec.autoscaling
    if replicas == 0 and auto is not None and auto.min_replicas == 0:
        return C.Cond(
            C.READY, C.TRUE, C.SCALED_TO_ZERO,
            "scaled to zero replicas; a request wakes the model (it is held until a replica "
            "is Ready)",
        )  # fmt: skip
    if replicas == 0:
        return C.Cond(C.READY, C.TRUE, C.SCALED_TO_ZERO, "scaled to zero replicas")
    if roll.available > 0 and not f.current:
        what = (
            f"artifact {names.short_key(serving.key)}"
            if serving.key != plan.key
            else f"artifact {plan.short_key} from PVC {serving.plan.claim}"
        )
        return C.Cond(
            C.READY,
            C.TRUE,
            C.SERVING_PREVIOUS_ARTIFACT,
            (
                f"serving {what} while {plan.short_key} on PVC {plan.claim} "
                + (
                    f"failed its canary ({artifact.status.get('message')})"
                    if artifact.answers_refused
                    and artifact.status.get("reason") in C.CANARY_REFUSED_REASONS
                    else f"failed its output check ({artifact.status.get('message')})"
                    if artifact.answers_refused
                    else "runs its canary"
                    if f.canary is not None
                    else "failed to compile"
                    if artifact.phase == FAILED
                    else f"cannot compile yet ({artifact.stuck.reason})"
                    if artifact.stuck is not None
                    else f"waits for a rollout slot ({C.WAITING_FOR_ROLLOUT_SLOT})"
                    if serving.waiting
                    else f"waits for a precompile slot ({C.WAITING_FOR_COMPILE_SLOT})"
                    if artifact.waiting
                    else "compiles"
                )
            )[:1024],
        )
    if roll.available > 0:
        return C.Cond(
            C.READY,
            C.TRUE,
            C.SERVING,
            f"{roll.available}/{replicas} replicas serving artifact {plan.short_key}",
        )
    if f.conflict:
        return C.Cond(C.READY, C.FALSE, C.NAME_CONFLICT, f.conflict)
    if f.write_error:
        return C.Cond(C.READY, C.FALSE, C.RECONCILE_ERROR, f.write_error)
    if f.engine_failure:
        return C.Cond(C.READY, C.FALSE, *f.engine_failure)
    return C.Cond(
        C.READY,
        C.FALSE,
        C.ROLLING_OUT if roll.total else C.PODS_NOT_READY,
        f"0/{replicas} replicas available",
    )


def _progressing(
    plan: ModelPlan,
    obs: Observed,
    cache: CacheOutcome,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    f: _StatusFacts,
) -> C.Cond:
    """Progressing: compiling, or rolling out (with why replicas wait for a node)."""
    roll = f.roll
    if artifact.phase in (PENDING, COMPILING) and not cache.missing:
        reason = artifact.stuck.reason if artifact.stuck is not None else C.COMPILING
        if artifact.waiting:
            reason = C.WAITING_FOR_COMPILE_SLOT
        return C.Cond(C.PROGRESSING, C.TRUE, reason, artifact.cond.message)
    if serving.waiting:
        return C.Cond(C.PROGRESSING, C.TRUE, C.WAITING_FOR_ROLLOUT_SLOT, serving.waiting)
    if f.canary is not None:
        return f.canary
    if artifact.phase == FAILED and serving.key is not None and not f.current:
        # The spec's artifact failed (its compile, or its pods' or canary's verdict) and the
        # previous one serves: nothing is in progress until an edit or a retry. True here kept
        # Reconciling True for good: kstatus read InProgress, `kubectl wait` never returned.
        reason = str(artifact.status.get("reason") or artifact.cond.reason)
        return C.Cond(
            C.PROGRESSING,
            C.FALSE,
            reason,
            f"artifact {plan.short_key} failed ({reason}); the previous artifact serves until "
            f"the spec changes or the annotation {RETRY_ANNOTATION} is set",
        )
    if serving.key is None or (f.current and roll.done) or roll.stall:
        return C.Cond(C.PROGRESSING, C.FALSE, C.RECONCILED, "nothing to do")
    available = f"{roll.available}/{plan.spec.replicas} replicas available"
    if f.no_scheduler:
        return C.Cond(
            C.PROGRESSING, C.TRUE, C.SCHEDULER_NOT_RUNNING, f"{available}; {f.no_scheduler}"
        )
    unschedulable = unschedulable_of(obs.server_pods)
    if unschedulable:
        return C.Cond(
            C.PROGRESSING, C.TRUE, unschedulable_reason(plan, obs), f"{available}; {unschedulable}"
        )
    return C.Cond(
        C.PROGRESSING,
        C.TRUE,
        C.ROLLING_OUT,
        f"rolling out artifact {plan.short_key}: {available}{_gap(plan, obs, serving)}",
    )


def _gap(plan: ModelPlan, obs: Observed, serving: ServingOutcome) -> str:
    """What a switch from another artifact costs when no pod of the old one may stay: with
    ``maxSurge`` 0 and ``maxUnavailable`` covering every replica, the Deployment stops every
    old pod before a new one loads and checks its answers (issue 44, 7)."""
    rollout = plan.spec.serving.rollout
    old = served_key(obs.deployment)
    if (
        old is None
        or old == serving.key
        or rollout.max_surge > 0
        or rollout.max_unavailable < plan.spec.replicas
        or plan.spec.serving.canary is not None
    ):
        return ""
    return (
        f"; with maxSurge 0 and maxUnavailable {rollout.max_unavailable} at "
        f"{plan.spec.replicas} replica{'s' if plan.spec.replicas > 1 else ''}, the model "
        "serves nothing while the new pods load and check their answers (a spare card: set "
        "serving.rollout.maxSurge: 1, or serving.canary, to keep the previous artifact serving)"
    )


#: A serving pod that no scheduler has looked at for this long (no PodScheduled condition) is
#: reported: a running scheduler tries a new pod within seconds, even when nothing fits.
SCHEDULER_SILENCE_SECONDS = DEFAULT_POLICY.scheduler_silence_seconds


def scheduler_silence(
    pods: list[dict[str, Any]], now: datetime, silence: float = SCHEDULER_SILENCE_SECONDS
) -> tuple[str | None, float | None]:
    """(why serving pods wait for a scheduler that does not run, when to look again): pods
    that no scheduler has looked at for ``silence`` seconds (SCHEDULER_SILENCE_SECONDS unless
    the operator's policy says otherwise) are reported; younger ones are looked at again once
    they reach it (a pod that merely waits sends no further event)."""
    silent, recheck = [], None
    for p in pods:
        since = parse_time(p.get("unscheduledSince"))
        if since is None:
            continue
        age = (now - since).total_seconds()
        if age >= silence:
            silent.append((p, age))
        else:
            left = silence - age + 1
            recheck = left if recheck is None else min(recheck, left)
    if not silent:
        return None, recheck
    first, age = silent[0]
    why = (
        f"{len(silent)} pod{'s' if len(silent) > 1 else ''} not looked at by scheduler "
        f"{first.get('scheduler')!r} ({first['name']}: {age:.0f}s without a PodScheduled "
        "condition): is that scheduler installed and running? (spec.accelerator.schedulerName, "
        "or the operator's --default-scheduler-name; IBM's Spyre Operator installs "
        "spyre-scheduler)"
    )
    return why[:1024], recheck


#: The HPA's own conditions, most telling first when one is False.
_HPA_CONDITIONS = ("ScalingActive", "AbleToScale")


def _autoscaling_condition(hpa: dict[str, Any] | None) -> C.Cond:
    """What the HorizontalPodAutoscaler reports: its metrics, or why it cannot scale."""
    if hpa is None:
        return C.Cond(
            C.AUTOSCALING,
            C.UNKNOWN,
            C.AUTOSCALER_PENDING,
            "HorizontalPodAutoscaler not created yet",
        )
    st = hpa.get("status") or {}
    by_type = {c.get("type"): c for c in st.get("conditions") or []}
    if not by_type:
        return C.Cond(
            C.AUTOSCALING,
            C.UNKNOWN,
            C.AUTOSCALER_PENDING,
            "the HorizontalPodAutoscaler has not evaluated its metrics yet",
        )
    for t in _HPA_CONDITIONS:
        c = by_type.get(t)
        if c is not None and c.get("status") == C.FALSE:
            return C.Cond(
                C.AUTOSCALING,
                C.FALSE,
                c.get("reason") or f"{t}False",
                f"HorizontalPodAutoscaler {t}=False: {c.get('message') or ''}"[:1024],
            )
    spec = hpa.get("spec") or {}
    desired, current = st.get("desiredReplicas"), st.get("currentReplicas")
    message = (
        f"{current} replicas, desired {desired} "
        f"(min {spec.get('minReplicas', 1)}, max {spec.get('maxReplicas')})"
    )
    limited = by_type.get("ScalingLimited")
    if limited is not None and limited.get("status") == C.TRUE:
        return C.Cond(
            C.AUTOSCALING,
            C.TRUE,
            limited.get("reason") or "ScalingLimited",
            f"{message}: {limited.get('message') or ''}"[:1024],
        )
    return C.Cond(C.AUTOSCALING, C.TRUE, C.AUTOSCALER_ACTIVE, message)


def write_error_message(errors: list[WriteError]) -> str | None:
    """The API server's rejections of a reconcile's writes, for status and the log."""
    if not errors:
        return None
    return "; ".join(
        f"the API server rejected {e.kind} {e.name} ({e.code}): {e.message}" for e in errors
    )[:1024]
