"""Decide what one SpyreModel needs, from its spec and the observed children (pure, no I/O).

``decide()`` is the whole reconcile policy: the handler layer gathers :class:`Observed` from
the watch caches, calls it, and hands the result to the apply layer. Keeping it pure lets unit
tests cover every transition without a cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lightkube.resources.batch_v1 import Job
from lightkube.resources.policy_v1 import PodDisruptionBudget
from pydantic import ValidationError

from . import conditions as C
from .api.v1alpha1 import CacheVolumeSpec, SpyreModelSpec
from .desired import names
from .desired.deployment import build_deployment
from .desired.job import build_precompile_job
from .desired.plan import ModelPlan, OwnerRef, plan_model
from .desired.pvc import build_cache_pvc, cache_owners
from .desired.service import build_pdb, build_service, wants_pdb
from .summary import ArtifactSummary, EngineFailure, parse_termination_message

# Artifact phases (status.artifact.phase)
PENDING, COMPILING, READY, FAILED = "Pending", "Compiling", "Ready", "Failed"


@dataclass
class Observed:
    """Cluster state relevant to one SpyreModel, read from the watch caches."""

    cache_pvc: dict[str, Any] | None = None
    model_pvc_exists: bool = True
    job: dict[str, Any] | None = None
    #: Compact records of the precompile Job's pods (see handlers.compact_pod).
    job_pods: list[dict[str, Any]] = field(default_factory=list)
    deployment: dict[str, Any] | None = None
    service: dict[str, Any] | None = None
    pdb: dict[str, Any] | None = None
    server_pods: list[dict[str, Any]] = field(default_factory=list)
    #: Every SpyreModel in the namespace needing this (claim, key): owners of the shared Job.
    job_owners: list[OwnerRef] = field(default_factory=list)
    #: Every SpyreModel in the namespace using this managed claim, with its volume settings.
    cache_users: list[tuple[OwnerRef, CacheVolumeSpec]] = field(default_factory=list)


@dataclass
class Decision:
    """What to write for one SpyreModel."""

    apply: list[Any] = field(default_factory=list)
    #: The precompile Job: created if absent, otherwise only its owners are reconciled.
    job: Job | None = None
    delete: list[tuple[type, str]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)


def _cond(conds: list[dict[str, Any]] | None, type_: str, status: str) -> bool:
    c = C.find(conds, type_)
    return bool(c and c.get("status") == status)


def _job_state(job: dict[str, Any]) -> str:
    for c in job.get("status", {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return READY
        if c.get("type") == "Failed":
            return FAILED
    return COMPILING


def _job_condition_message(job: dict[str, Any], type_: str) -> str:
    for c in job.get("status", {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return str(c.get("message") or c.get("reason") or "")
    return ""


def _latest_termination(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    terminated = [p["terminated"] for p in pods if p.get("terminated")]
    if not terminated:
        return None
    return max(terminated, key=lambda t: (t.get("finishedAt") or "", t.get("exitCode") == 0))


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    try:
        return (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()
    except ValueError:
        return None


def _human_size(n: int | None) -> str:
    if n is None:
        return "unknown size"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def artifact_from_job(
    plan: ModelPlan, obs: Observed, previous: dict[str, Any] | None
) -> dict[str, Any]:
    """status.artifact for the spec's key, from the Job (or the last status if it is gone)."""
    base = {"key": plan.key, "path": plan.artifact_dir(), "jobName": plan.job_name}
    job = obs.job
    if job is None:
        if previous and previous.get("key") == plan.key and previous.get("phase") == READY:
            return {**previous, "jobName": plan.job_name}  # artifact is on disk; Job was removed
        return {**base, "phase": PENDING, "message": "creating the precompile Job"}
    state = _job_state(job)
    term = _latest_termination(obs.job_pods)
    parsed = parse_termination_message(term.get("message")) if term else None
    if state == READY:
        status = job.get("status", {})
        out = {
            **base,
            "phase": READY,
            "completedAt": status.get("completionTime"),
            "compileSeconds": _seconds_between(
                status.get("startTime"), status.get("completionTime")
            ),
        }
        if isinstance(parsed, ArtifactSummary):
            if parsed.compile_seconds is not None:
                out["compileSeconds"] = round(parsed.compile_seconds, 3)
            if parsed.size_bytes is not None:
                out["sizeBytes"] = parsed.size_bytes
            if parsed.key and parsed.key != plan.key:
                out["message"] = f"engine reported key {parsed.key}, expected {plan.key}"
        return {k: v for k, v in out.items() if v is not None}
    if state == FAILED:
        detail = _job_condition_message(job, "Failed")
        if isinstance(parsed, EngineFailure):
            msg = f"{parsed.reason}: {parsed.message}" if parsed.message else parsed.reason
        elif term and term.get("exitCode") not in (None, 0):
            msg = f"precompile container exited with code {term.get('exitCode')}"
        else:
            msg = "precompile Job failed"
        if detail:
            msg = f"{msg} ({detail})"
        return {**base, "phase": FAILED, "message": msg}
    active = job.get("status", {}).get("active") or 0
    msg = f"precompile Job {plan.job_name} is running" if active else "precompile pod starting"
    return {**base, "phase": COMPILING, "message": msg}


def served_key(deployment: dict[str, Any] | None) -> str | None:
    """The artifact key a live Deployment serves."""
    if not deployment:
        return None
    return deployment.get("metadata", {}).get("annotations", {}).get(names.ARTIFACT_KEY_ANNOTATION)


def _served_spec(deployment: dict[str, Any]) -> SpyreModelSpec | None:
    raw = deployment.get("metadata", {}).get("annotations", {}).get(names.SERVED_SPEC_ANNOTATION)
    if not raw:
        return None
    try:
        return SpyreModelSpec.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None


def _rollout(deployment: dict[str, Any] | None, replicas: int) -> tuple[bool, int, int, str | None]:
    """(fully rolled out and available, replicas, available, stall message) of a Deployment."""
    if not deployment:
        return False, 0, 0, None
    st = deployment.get("status") or {}
    gen = deployment.get("metadata", {}).get("generation", 0)
    available = st.get("availableReplicas") or 0
    total = st.get("replicas") or 0
    done = (
        st.get("observedGeneration", 0) >= gen
        and (st.get("updatedReplicas") or 0) == replicas
        and available == replicas
        and total == replicas
    )
    stall = None
    for c in st.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            stall = c.get("message") or "rollout exceeded its progress deadline"
    return done, total, available, stall


def _engine_failure(pods: list[dict[str, Any]]) -> str | None:
    """A serving container that exited non-zero (e.g. refusing a mismatched artifact)."""
    for p in pods:
        term = p.get("terminated")
        if term and term.get("exitCode") not in (None, 0):
            parsed = parse_termination_message(term.get("message"))
            if isinstance(parsed, EngineFailure):
                return f"pod {p['name']}: {parsed.reason}: {parsed.message}"
            return f"pod {p['name']}: engine exited with code {term.get('exitCode')}"
        if p.get("waiting") == "CrashLoopBackOff":
            return f"pod {p['name']}: CrashLoopBackOff"
    return None


def _cache_condition(plan: ModelPlan, pvc: dict[str, Any] | None) -> C.Cond:
    t = C.CACHE_VOLUME_READY
    if pvc is None:
        if plan.claim_managed:
            return C.Cond(t, C.FALSE, C.CLAIM_CREATING, f"creating PVC {plan.claim}")
        return C.Cond(
            t,
            C.FALSE,
            C.CLAIM_NOT_FOUND,
            f"PersistentVolumeClaim {plan.claim} not found in namespace {plan.namespace}; "
            "create it, or unset cache.claimName to let the operator create one",
        )
    phase = (pvc.get("status") or {}).get("phase") or "Pending"
    if phase == "Bound":
        vol = (pvc.get("spec") or {}).get("volumeName", "")
        return C.Cond(t, C.TRUE, C.CLAIM_BOUND, f"PVC {plan.claim} is bound to {vol}")
    if phase == "Lost":
        return C.Cond(t, C.FALSE, C.CLAIM_LOST, f"PVC {plan.claim} lost its volume")
    return C.Cond(
        t,
        C.FALSE,
        C.CLAIM_PENDING,
        f"PVC {plan.claim} is Pending: no matching PersistentVolume yet, or its StorageClass "
        "binds on first use",
    )


def decide(model: dict[str, Any], obs: Observed, now: str) -> Decision:
    """The reconcile policy for one SpyreModel."""
    meta = model.get("metadata", {})
    name, ns = meta["name"], meta["namespace"]
    generation = meta.get("generation", 1)
    old_status = model.get("status") or {}
    old_conds = old_status.get("conditions")
    d = Decision()

    try:
        spec = SpyreModelSpec.model_validate(model.get("spec") or {})
    except ValidationError as e:
        msg = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )[:1024]
        invalid = [
            C.Cond(C.READY, C.FALSE, C.INVALID_SPEC, msg),
            C.Cond(C.DEGRADED, C.TRUE, C.INVALID_SPEC, msg),
            C.Cond(C.PROGRESSING, C.FALSE, C.INVALID_SPEC, "fix the spec"),
            C.Cond(C.RECONCILING, C.FALSE, C.INVALID_SPEC, "fix the spec"),
            C.Cond(C.STALLED, C.TRUE, C.INVALID_SPEC, msg),
        ]
        d.status = {
            **old_status,
            "observedGeneration": generation,
            "conditions": C.merge_conditions(old_conds, invalid, generation, now),
        }
        d.events = _events(old_conds, d.status["conditions"])
        return d

    plan = plan_model(name, ns, meta.get("uid", ""), generation, spec)

    # 1. Cache volume
    pvc = obs.cache_pvc
    if plan.claim_managed and plan.volume is not None:
        ours = (
            pvc is None
            or (pvc.get("metadata", {}).get("labels") or {}).get(names.MANAGED_BY)
            == names.MANAGED_BY_VALUE
        )
        if ours:  # a same-named PVC someone else made is used as-is, never modified
            users = obs.cache_users or [(plan.owner, plan.volume)]
            d.apply.append(build_cache_pvc(ns, plan.volume, cache_owners(users)))
    cache_cond = _cache_condition(plan, pvc)
    claim_missing = cache_cond.reason == C.CLAIM_NOT_FOUND

    # 2. Artifact (precompile Job)
    prev_artifact = old_status.get("artifact")
    artifact = artifact_from_job(plan, obs, prev_artifact)
    art_cond = C.find(old_conds, C.ARTIFACT_READY)
    if (
        artifact["phase"] == FAILED
        and art_cond
        and art_cond.get("reason") == C.PRECOMPILE_FAILED
        and (art_cond.get("observedGeneration") or 0) < generation
    ):
        # The spec changed since the failure: retry by replacing the failed Job.
        d.delete.append((Job, plan.job_name))
        artifact = {**artifact, "phase": PENDING, "message": "retrying after a spec change"}
    elif obs.job is not None or (artifact["phase"] != READY and not claim_missing):
        # Create the Job if absent; if present, keep its owner list in step with every
        # SpyreModel that needs this (claim, key).
        owners = obs.job_owners or [plan.owner]
        if plan.owner not in owners:
            owners = [*owners, plan.owner]
        d.job = build_precompile_job(plan, owners)

    if artifact["phase"] == READY:
        art = C.Cond(
            C.ARTIFACT_READY,
            C.TRUE,
            C.ARTIFACT_AVAILABLE,
            f"artifact {plan.short_key} ready at {artifact['path']}"
            + (
                f" (compiled in {artifact['compileSeconds']:.0f}s, "
                f"{_human_size(artifact.get('sizeBytes'))})"
                if artifact.get("compileSeconds") is not None
                else ""
            ),
        )
    elif artifact["phase"] == FAILED:
        art = C.Cond(C.ARTIFACT_READY, C.FALSE, C.PRECOMPILE_FAILED, artifact.get("message", ""))
    elif claim_missing:
        art = C.Cond(C.ARTIFACT_READY, C.FALSE, C.CLAIM_NOT_FOUND, "waiting for the cache claim")
    else:
        art = C.Cond(C.ARTIFACT_READY, C.FALSE, C.COMPILING, artifact.get("message", ""))

    # 3. Serving: switch to the new key only once its artifact is ready.
    live_key = served_key(obs.deployment)
    serve_plan: ModelPlan | None = None
    serve_key: str | None = None
    if artifact["phase"] == READY:
        serve_plan, serve_key = plan, plan.key
    elif obs.deployment is not None and live_key:
        old_spec = _served_spec(obs.deployment)
        if old_spec is not None:
            old_spec = old_spec.model_copy(update={"replicas": spec.replicas})
            serve_plan = plan_model(name, ns, plan.uid, generation, old_spec)
        serve_key = live_key
    if serve_plan is not None and serve_key is not None:
        d.apply.append(build_deployment(serve_plan, serve_key))
    d.apply.append(build_service(plan))
    if wants_pdb(plan):
        d.apply.append(build_pdb(plan))
    elif obs.pdb is not None:
        d.delete.append((PodDisruptionBudget, names.server_name(name)))

    # 4. Status
    serving_key = serve_key if serve_plan is not None else None
    current = serving_key == plan.key
    desired_replicas = spec.replicas
    done, total, available, stall = _rollout(obs.deployment, desired_replicas)
    if obs.deployment is not None and served_key(obs.deployment) != serving_key:
        done = False  # the Deployment we just applied has not been observed yet
    engine_failure = _engine_failure(
        [p for p in obs.server_pods if p.get("artifact") == names.short_key(serving_key or "")]
    )

    if serving_key is None:
        if artifact["phase"] == FAILED:
            ready = C.Cond(C.READY, C.FALSE, C.PRECOMPILE_FAILED, art.message)
        elif claim_missing:
            ready = C.Cond(C.READY, C.FALSE, C.CLAIM_NOT_FOUND, cache_cond.message)
        else:
            ready = C.Cond(C.READY, C.FALSE, C.COMPILING, f"compiling artifact {plan.short_key}")
    elif desired_replicas == 0 and done:
        ready = C.Cond(C.READY, C.TRUE, C.SCALED_TO_ZERO, "scaled to zero replicas")
    elif not current and available > 0:
        ready = C.Cond(
            C.READY,
            C.TRUE,
            C.SERVING_PREVIOUS_ARTIFACT,
            f"serving artifact {names.short_key(serving_key)} while {plan.short_key} "
            + ("failed to compile" if artifact["phase"] == FAILED else "compiles"),
        )
    elif current and done:
        ready = C.Cond(
            C.READY,
            C.TRUE,
            C.SERVING,
            f"{available}/{desired_replicas} replicas serving artifact {plan.short_key}",
        )
    elif engine_failure:
        ready = C.Cond(C.READY, C.FALSE, C.ENGINE_FAILED, engine_failure)
    else:
        ready = C.Cond(
            C.READY,
            C.FALSE,
            C.ROLLING_OUT if available < desired_replicas and total else C.PODS_NOT_READY,
            f"{available}/{desired_replicas} replicas available",
        )

    if artifact["phase"] in (PENDING, COMPILING) and not claim_missing:
        progressing = C.Cond(C.PROGRESSING, C.TRUE, C.COMPILING, art.message)
    elif serving_key is not None and not (current and done) and not stall:
        progressing = C.Cond(
            C.PROGRESSING, C.TRUE, C.ROLLING_OUT, f"rolling out artifact {plan.short_key}"
        )
    else:
        progressing = C.Cond(C.PROGRESSING, C.FALSE, C.RECONCILED, "nothing to do")

    if artifact["phase"] == FAILED:
        degraded = C.Cond(C.DEGRADED, C.TRUE, C.PRECOMPILE_FAILED, art.message)
    elif claim_missing or cache_cond.reason == C.CLAIM_LOST:
        degraded = C.Cond(C.DEGRADED, C.TRUE, cache_cond.reason, cache_cond.message)
    elif not obs.model_pvc_exists:
        degraded = C.Cond(
            C.DEGRADED,
            C.TRUE,
            C.CLAIM_NOT_FOUND,
            f"model claim {plan.model_claim} not found in namespace {ns}",
        )
    elif engine_failure:
        degraded = C.Cond(C.DEGRADED, C.TRUE, C.ENGINE_FAILED, engine_failure)
    elif stall:
        degraded = C.Cond(C.DEGRADED, C.TRUE, C.ROLLOUT_STALLED, stall)
    else:
        degraded = C.Cond(C.DEGRADED, C.FALSE, C.AS_EXPECTED, "")

    kstatus = [
        C.Cond(C.RECONCILING, progressing.status, progressing.reason, progressing.message),
        C.Cond(C.STALLED, degraded.status, degraded.reason, degraded.message),
    ]
    conds = C.merge_conditions(
        old_conds, [ready, cache_cond, art, progressing, degraded, *kstatus], generation, now
    )
    dep_status = (obs.deployment or {}).get("status") or {}
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "artifact": artifact,
        "replicas": dep_status.get("replicas") or 0,
        "readyReplicas": dep_status.get("readyReplicas") or 0,
        "selector": ",".join(f"{k}={v}" for k, v in names.server_selector(name).items()),
        "endpoint": plan.endpoint,
        "conditions": conds,
    }
    if serving_key:
        status["servingArtifactKey"] = serving_key
    d.status = status
    d.events = _events(old_conds, conds)
    return d


def _events(
    old: list[dict[str, Any]] | None, new: list[dict[str, Any]]
) -> list[tuple[str, str, str]]:
    """One Event per transition of the conditions users watch most.

    Transitions with the same reason in one reconcile (Ready and ArtifactReady both
    ``Compiling``, both ``PrecompileFailed``) make one Event: Events are the bulk of the
    operator's API requests at scale (see tests/bench/RESULTS.md).
    """
    out = []
    seen: set[str] = set()
    for c in C.transitions(old, new):
        if c["type"] in (C.READY, C.ARTIFACT_READY, C.DEGRADED, C.CACHE_VOLUME_READY):
            if c["type"] == C.DEGRADED and c["status"] == C.FALSE and not old:
                continue  # "not degraded" on creation is not news
            if c["reason"] in seen:
                continue
            seen.add(c["reason"])
            message = f"{c['type']}={c['status']}: {c['message']}"
            out.append((C.event_type(c["reason"]), c["reason"], message))
    return out


__all__ = [
    "Decision",
    "Observed",
    "decide",
    "artifact_from_job",
    "served_key",
]
