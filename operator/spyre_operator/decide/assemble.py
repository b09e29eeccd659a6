"""``decide()``: the whole reconcile decision for one SpyreModel, assembled from the
per-concern decisions, and the status of a spec that is refused (pure, no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
from lightkube.resources.batch_v1 import Job
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.policy_v1 import PodDisruptionBudget
from pydantic import ValidationError

from ..api.v1alpha1 import SpyreModelSpec
from ..desired import names
from ..desired.autoscaling import build_hpa, wants_hpa
from ..desired.deployment import build_deployment, served_spec_json
from ..desired.devices import ResourceClaimTemplate
from ..desired.inference_pool import InferencePool, inference_pool_name
from ..desired.networkpolicy import build_network_policy, wants_network_policy
from ..desired.plan import ModelPlan, plan_model, with_live_claim
from ..desired.scaletozero import build_interceptor_service, wants_scale_to_zero
from ..desired.service import build_pdb, build_service, wants_pdb
from ..desired.site import effective_status
from ..desired.verified import build_verified_configmap, reads_verified
from . import conditions as C
from .artifact import decide_artifact
from .cache import decide_cache
from .cache_status import decide_cache_status
from .canary import decide_canary
from .devices import decide_devices
from .inference_pool import decide_routing
from .observed import DEFAULT_POLICY, Decision, Observed, Policy, parse_time
from .precompile_state import superseded
from .rollout import mark_rolled_out
from .scaletozero import ScaleToZeroOutcome, decide_scale_to_zero
from .serving import decide_serving, last_good, verified_key
from .slots import WAITING_RECHECK_SECONDS
from .status import decide_status, scheduler_silence


def _invalid_status(
    model: dict[str, Any], error: ValidationError, generation: int, now: str
) -> Decision:
    old_status = model.get("status") or {}
    msg = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in error.errors()
    )[:1024]
    invalid = [
        C.Cond(C.READY, C.FALSE, C.INVALID_SPEC, msg),
        C.Cond(C.DEGRADED, C.TRUE, C.INVALID_SPEC, msg),
        C.Cond(C.PROGRESSING, C.FALSE, C.INVALID_SPEC, "fix the spec"),
    ]
    conds = C.merge_conditions(
        old_status.get("conditions"), C.with_kstatus(invalid), generation, now
    )
    status = {**old_status, "observedGeneration": generation, "conditions": conds}
    return Decision(status=status, events=_events(old_status.get("conditions"), conds))


def _refused_status(
    model: dict[str, Any],
    message: str,
    generation: int,
    now: str,
    reason: str = C.UNSUPPORTED_CONFIGURATION,
    effective: dict[str, Any] | None = None,
) -> Decision:
    """A shape the plugin does not support (or none given for a model it cannot choose one
    for), or an engine image the allow-list refuses: nothing is created or changed (a
    Deployment serving an earlier artifact keeps it)."""
    old_status = model.get("status") or {}
    msg = message[:1024]
    todo = (
        "use an allowed engine image"
        if reason == C.ENGINE_IMAGE_NOT_ALLOWED
        else "choose a supported compile shape"
    )
    refused = [
        C.Cond(C.READY, C.FALSE, reason, msg),
        C.Cond(C.ARTIFACT_READY, C.FALSE, reason, msg),
        C.Cond(C.DEGRADED, C.TRUE, reason, msg),
        C.Cond(C.PROGRESSING, C.FALSE, reason, todo),
    ]
    conds = C.merge_conditions(
        old_status.get("conditions"), C.with_kstatus(refused), generation, now
    )
    status = {**old_status, "observedGeneration": generation, "conditions": conds}
    if effective is not None:
        status["effective"] = effective
    status.pop("compile", None)
    return Decision(status=status, events=_events(old_status.get("conditions"), conds))


def decide(
    model: dict[str, Any], obs: Observed, now: str, policy: Policy = DEFAULT_POLICY,
    plan: ModelPlan | None = None,
) -> Decision:
    """The reconcile policy for one SpyreModel. ``plan``: the model's plan, as the controller
    built it for this reconcile from the same spec and ``policy.site`` (planned once per
    reconcile); None: validated and planned here (an invalid spec is reported as such)."""
    meta = model.get("metadata", {})
    name, ns = meta["name"], meta["namespace"]
    generation = meta.get("generation", 1)
    old_status = model.get("status") or {}
    if plan is None:
        try:
            spec = SpyreModelSpec.model_validate(model.get("spec") or {})
        except ValidationError as e:
            return _invalid_status(model, e, generation, now)
        plan = plan_model(name, ns, meta.get("uid", ""), spec, policy.site)
    plan = with_live_claim(plan, obs.cache_pvc)
    effective = effective_status(plan.spec, plan.from_defaults, plan.storage_class(obs.cache_pvc))
    if plan.image_refusal:
        return _refused_status(
            model, plan.image_refusal, generation, now, C.ENGINE_IMAGE_NOT_ALLOWED, effective
        )
    if plan.shape is not None and plan.shape.refusal:
        return _refused_status(model, plan.shape.refusal, generation, now, effective=effective)

    cache = decide_cache(plan, obs)
    artifact = decide_artifact(plan, obs, model, cache, now, policy)
    serving = decide_serving(plan, obs, artifact, old_status)
    canary = decide_canary(
        plan, obs, artifact, serving, old_status, now, meta.get("annotations") or {}
    )
    if canary.hold is not None:
        serving = canary.hold  # the previous artifact serves while the canary runs

    routing = decide_routing(plan, obs, old_status.get("conditions"))
    zero = decide_scale_to_zero(plan, obs, old_status.get("conditions"))

    d = Decision(job=artifact.job, requeue_after=artifact.requeue_after)
    if serving.waiting:
        d.requeue_after = min(d.requeue_after or WAITING_RECHECK_SECONDS, WAITING_RECHECK_SECONDS)
    if canary.requeue_after is not None:
        d.requeue_after = min(d.requeue_after or canary.requeue_after, canary.requeue_after)
    if cache.pvc is not None:
        d.apply.append(cache.pvc)
    if artifact.delete_job:
        d.delete.append((Job, plan.job_name))
    for job_name, _ in superseded(
        obs.owned_jobs, plan.claim, plan.key, lambda c, k: (c, k) in obs.needed_jobs
    ):
        d.delete.append((Job, job_name))  # an earlier spec's compile: stop it, free its cards
    if serving.plan is not None and serving.key is not None:
        dep = build_deployment(serving.plan, serving.key,
                               verified=reads_verified(obs, obs.deployment, serving.key))
        d.apply.append(mark_rolled_out(dep, obs.deployment))
    devices = decide_devices(plan, serving.plan, obs)
    d.apply += devices.apply  # before the pods that claim from them are created
    d.delete += [(ResourceClaimTemplate, n) for n in devices.delete]
    if canary.deployment is not None:
        d.apply.append(canary.deployment)
    elif canary.delete:
        d.delete.append((Deployment, names.canary_name(name)))
    # Deletes run before applies (controller.execute): the operator's HPA is gone before the
    # ScaledObject is written (KEDA refuses a target another HPA scales).
    d.delete += zero.delete
    d.apply.append(build_interceptor_service(plan) if zero.via_interceptor else build_service(plan))
    d.apply += zero.apply
    if wants_pdb(plan):
        d.apply.append(build_pdb(plan))
    elif obs.pdb is not None:
        d.delete.append((PodDisruptionBudget, names.server_name(name)))
    if wants_hpa(plan) and not wants_scale_to_zero(plan):
        d.apply.append(build_hpa(plan))
    elif obs.hpa is not None:
        d.delete.append((HorizontalPodAutoscaler, names.server_name(name)))
    if wants_network_policy(plan):
        interceptor = obs.keda.interceptor_namespace if zero.via_interceptor else None
        d.apply.append(build_network_policy(plan, interceptor, policy.operator_namespace))
    elif obs.network_policy is not None:
        d.delete.append((NetworkPolicy, names.server_name(name)))
    good_key, good_spec = last_good(obs.deployment, old_status)
    checked = verified_key(good_key, good_spec)
    if checked is not None or _foreign_entries(obs.verified_configmap, checked):
        d.apply.append(build_verified_configmap(plan, checked, obs.verified_configmap))
    if routing.pool is not None:
        d.apply.append(routing.pool)
    elif routing.delete:
        d.delete.append((InferencePool, inference_pool_name(name)))
    # Never write over an object that is not ours.
    if obs.foreign:
        d.apply = [o for o in d.apply if o.kind not in obs.foreign]

    silent, recheck = scheduler_silence(
        obs.server_pods, parse_time(now) or datetime.now(UTC), policy.scheduler_silence_seconds
    )
    for again in (recheck, obs.recheck_after):
        if again is not None:
            d.requeue_after = min(d.requeue_after or again, again)
    computed = C.with_kstatus(
        decide_status(
            plan, obs, cache, artifact, serving, zero, silent, canary.cond, canary.problem
        )
    )
    if routing.cond is not None:
        computed.append(routing.cond)
    conds = C.merge_conditions(old_status.get("conditions"), computed, generation, now)
    dep_status = (obs.deployment or {}).get("status") or {}
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "artifact": artifact.status,
        **({"compile": plan.shape.status()} if plan.shape is not None else {}),
        "effective": effective,
        "replicas": dep_status.get("replicas") or 0,
        "readyReplicas": dep_status.get("readyReplicas") or 0,
        "selector": ",".join(f"{k}={v}" for k, v in names.server_selector(name).items()),
        "endpoint": plan.endpoint,
        "conditions": conds,
    }
    cache_status = decide_cache_status(model, plan, obs, artifact, serving, now)
    if cache_status is not None:
        status["cache"] = cache_status
    if canary.status:
        status["canary"] = canary.status
    if devices.status:
        status["devices"] = devices.status
    s2z = _scale_to_zero_status(plan, zero, old_status, now)
    if s2z:
        status["scaleToZero"] = s2z
    if serving.key and serving.plan is not None:
        status["servingArtifactKey"] = serving.key
        status["servedSpec"] = served_spec_json(serving.plan.spec)
    if good_key and good_spec:
        status["lastGoodArtifactKey"] = good_key
        status["lastGoodServedSpec"] = good_spec
    check = _output_check_status(old_status.get("outputCheck") or {}, checked, plan, artifact, now)
    if check:
        status["outputCheck"] = check
    d.status = status
    d.events = _events(old_status.get("conditions"), conds)
    return d


def _scale_to_zero_status(
    plan: ModelPlan, zero: ScaleToZeroOutcome, old_status: dict[str, Any], now: str
) -> dict[str, Any]:
    """status.scaleToZero: when KEDA last saw the model in use, and since when it is at zero."""
    if not wants_scale_to_zero(plan):
        return {}
    old = old_status.get("scaleToZero") or {}
    out: dict[str, Any] = {}
    last = zero.last_active or old.get("lastActiveTime")
    if last:
        out["lastActiveTime"] = last
    if plan.spec.replicas == 0:
        out["scaledToZeroSince"] = old.get("scaledToZeroSince") or now
    return out


def _events(
    old: list[dict[str, Any]] | None, new: list[dict[str, Any]]
) -> list[tuple[str, str, str]]:
    """At most one Event per status write, listing every transition users watch.

    Events were the bulk of the operator's API requests (5.4 per model against a baseline of
    9 requests in all; tests/bench/RESULTS.md), and aggregating identical Events the way
    Kubernetes' event recorder does saves nothing here: every transition is distinct. So one
    reconcile's transitions share one Event: a Warning if any transition is one, named after
    the first Warning, else the first transition to True, else the first transition; its
    message lists them all as ``Type=Status Reason: message``.
    """
    shown = []
    for c in C.transitions(old, new):
        if c["type"] not in (
            C.READY,
            C.ARTIFACT_READY,
            C.DEGRADED,
            C.CACHE_VOLUME_READY,
            C.ROUTING_READY,
        ) and not (c["type"] == C.PROGRESSING and c["reason"] in C.WAITING_REASONS):
            continue
        if c["type"] == C.DEGRADED and c["status"] == C.FALSE and not old:
            continue  # "not degraded" on creation is not news
        shown.append(c)
    if not shown:
        return []
    warnings = [c for c in shown if C.event_type(c["reason"]) == "Warning"]
    to_true = [c for c in shown if c["status"] == C.TRUE]
    lead = (warnings or to_true or shown)[0]
    parts, seen = [], set()
    for c in [lead, *[c for c in shown if c is not lead]]:
        text = f"{c['type']}={c['status']} {c['reason']}: {c['message']}"
        if (c["reason"], c["message"]) in seen:  # Ready and ArtifactReady often say the same
            text = f"{c['type']}={c['status']} {c['reason']}"
        seen.add((c["reason"], c["message"]))
        parts.append(text)
    kind = "Warning" if warnings else "Normal"
    return [(kind, lead["reason"], "; ".join(parts)[:1024])]


def _foreign_entries(live: dict[str, Any] | None, checked: str | None) -> bool:
    """The operator's output-check ConfigMap holds a non-empty entry it did not write."""
    mine = names.short_key(checked) if checked else None
    return any(v and k != mine for k, v in ((live or {}).get("data") or {}).items())


#: status.outputCheck's message for an artifact served without a check.
NO_REFERENCES = (
    "its precompile recorded no reference answers (a pooling model, an engine from before the "
    "check, or a compile under serving.outputCheck Off): served without a check"
)


def _output_check_status(
    old: dict[str, Any], checked: str | None, plan: ModelPlan, artifact: Any, now: str
) -> dict[str, Any]:
    """status.outputCheck: the spec's artifact refused for OutputMismatch, else the artifact
    that passed on every replica of its rollout under Enforce (the one the ConfigMap names);
    a record about the same artifact and result keeps its time."""
    new: dict[str, Any]
    if artifact.answers_refused and artifact.status.get("reason") == C.OUTPUT_MISMATCH:
        new = {"artifactKey": plan.key, "result": "Failed",
               "message": str(artifact.status.get("message") or "")[:1024]}  # fmt: skip
    elif checked is not None and checked == plan.key and not artifact.status.get("references"):
        # Nothing was asked: its precompile recorded nothing to compare with.
        new = {"artifactKey": checked, "result": "Unchecked", "message": NO_REFERENCES}
    elif checked is not None:
        new = {"artifactKey": checked, "result": "Passed", "pods": plan.spec.replicas}
    else:
        return old
    same = old.get("artifactKey") == new["artifactKey"] and old.get("result") == new["result"]
    if same:
        return {**new, "time": old.get("time") or now,
                **({"pods": old["pods"]} if "pods" in old and "pods" in new else {})}
    return {**new, "time": now}
