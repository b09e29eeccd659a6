"""The artifact decision: status.artifact for the spec's (claim, key) and the precompile
Job behind it (:func:`decide_artifact`; pure, no I/O), with what status remembers of the
artifacts on a claim."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lightkube.resources.batch_v1 import Job

from ..desired import names
from ..desired.job import build_precompile_job
from ..desired.plan import ModelPlan
from . import conditions as C
from . import jobs
from .cache import CacheOutcome
from .observed import (
    CANARY_ABORT_ANNOTATION,
    COMPILING,
    FAILED,
    PENDING,
    READY,
    RETRY_ANNOTATION,
    Observed,
    Policy,
    fmt_time,
    human_size,
    job_state,
    latest_termination,
    parse_time,
    seconds_between,
)
from .precompile_state import Stuck, job_attempt, job_stuck, template_changed
from .slots import WAITING_RECHECK_SECONDS
from .summary import ArtifactSummary, EngineFailure, parse_termination_message


@dataclass
class ArtifactOutcome:
    """status.artifact for the spec's (claim, key), its condition and the Job to keep."""

    status: dict[str, Any]
    cond: C.Cond
    job: Job | None = None
    delete_job: bool = False
    requeue_after: float | None = None
    #: The running Job's pod cannot start (not scheduled, image, Secret, quota).
    stuck: Stuck | None = None
    #: No precompile Job yet: the model waits for a slot of the compile budget.
    waiting: bool = False

    @property
    def phase(self) -> str:
        return str(self.status["phase"])

    @property
    def answers_refused(self) -> bool:
        """Compiled, but refused by its serving pods: their answers differ from its reference
        (OutputMismatch), or its canary broke the model's bounds (CanaryFailed)."""
        return self.phase == FAILED and self.status.get("reason") in C.SERVING_REFUSED_REASONS

    @property
    def problem(self) -> str | None:
        """What Degraded says about the artifact: a failed compile, or a precompile pod that
        only a fix lets start."""
        if self.phase == FAILED or (self.stuck is not None and self.stuck.needs_fix):
            return self.cond.message
        return None


def _summary(obs: Observed) -> ArtifactSummary | EngineFailure | None:
    term = latest_termination(obs.job_pods)
    return parse_termination_message(term.get("message")) if term else None


def _failure_message(
    obs: Observed, job: dict[str, Any], parsed: ArtifactSummary | EngineFailure | None
) -> str:
    term = latest_termination(obs.job_pods)
    if isinstance(parsed, EngineFailure):
        msg = f"{parsed.reason}: {parsed.message}" if parsed.message else parsed.reason
    elif term and term.get("exitCode") not in (None, 0):
        msg = f"precompile container exited with code {term.get('exitCode')}"
    else:
        msg = "precompile Job failed"
    failed = jobs.condition(job, jobs.FAILED) or {}
    detail = str(failed.get("message") or failed.get("reason") or "")
    return f"{msg} ({detail})" if detail else msg


def _ready_status(plan: ModelPlan, obs: Observed, job: dict[str, Any]) -> dict[str, Any]:
    st = job.get("status", {})
    out: dict[str, Any] = {
        "phase": READY,
        "completedAt": st.get("completionTime"),
        "compileSeconds": seconds_between(st.get("startTime"), st.get("completionTime")),
    }
    parsed = _summary(obs)
    if isinstance(parsed, ArtifactSummary):
        if parsed.compile_seconds is not None:
            out["compileSeconds"] = round(parsed.compile_seconds, 3)
        if parsed.size_bytes is not None:
            out["sizeBytes"] = parsed.size_bytes
        if parsed.model_revision:
            out["modelRevision"] = parsed.model_revision
        if parsed.references:
            out["references"] = {k: parsed.references.get(k) for k in
                                 ("source", "prompts", "tokens", "tolerance")}  # fmt: skip
        if parsed.key and parsed.key != plan.key:
            out["message"] = f"engine reported key {parsed.key}, expected {plan.key}"
    return out


def _created_after_completion(pvc: dict[str, Any] | None, job: dict[str, Any]) -> bool:
    """A claim created after the Job finished cannot hold what the Job compiled.

    (A PVC in use by a pod cannot be deleted, so a claim recreated under the same name is
    always newer than the completion of any Job that wrote to the old one.)
    """
    created = parse_time(((pvc or {}).get("metadata") or {}).get("creationTimestamp"))
    done = parse_time((job.get("status") or {}).get("completionTime"))
    return bool(created and done and created > done)


@dataclass
class _ArtifactFacts:
    """What decide_artifact reads once: the spec's (claim, key), what status remembers of it,
    the retry budget of that (claim, key) and the clock."""

    plan: ModelPlan
    obs: Observed
    cache: CacheOutcome
    policy: Policy
    now: datetime
    pvc_uid: str | None
    #: status.artifact when it is about this (claim, key), else empty.
    old: dict[str, Any]
    #: The attempt of the live Job (shared by the models of this key), else status's.
    attempts: int
    token: str | None
    old_token: str | None
    #: status.canary (the operator's record of the spec's canary) and the abort annotation.
    canary: dict[str, Any] = field(default_factory=dict)
    abort: str | None = None

    @classmethod
    def read(
        cls,
        plan: ModelPlan,
        obs: Observed,
        model: dict[str, Any],
        cache: CacheOutcome,
        now: str,
        policy: Policy,
    ) -> _ArtifactFacts:
        old = (model.get("status") or {}).get("artifact") or {}
        if old.get("key") != plan.key or old.get("claim") != plan.claim:
            old = {}
        return cls(
            plan=plan,
            obs=obs,
            cache=cache,
            policy=policy,
            now=parse_time(now) or datetime.now(UTC),
            pvc_uid=((obs.cache_pvc or {}).get("metadata") or {}).get("uid"),
            old=old,
            attempts=job_attempt(obs.job) or int(old.get("attempts") or 1),
            token=((model.get("metadata") or {}).get("annotations") or {}).get(RETRY_ANNOTATION),
            old_token=old.get("retryToken"),
            canary=(model.get("status") or {}).get("canary") or {},
            abort=((model.get("metadata") or {}).get("annotations") or {}).get(
                CANARY_ABORT_ANNOTATION
            ),
        )

    @property
    def base(self) -> dict[str, Any]:
        p = self.plan
        return {"key": p.key, "path": p.artifact_dir(), "jobName": p.job_name, "claim": p.claim}

    def job(self, attempt: int | None = None) -> Job:
        """The precompile Job, owned by every model that needs this (claim, key)."""
        owners = self.obs.job_owners or [self.plan.owner]
        if self.plan.owner not in owners:
            owners = [*owners, self.plan.owner]
        return build_precompile_job(self.plan, owners, attempt or self.attempts)

    def pending(self, message: str, reason: str = C.COMPILING, **extra: Any) -> ArtifactOutcome:
        carry = {"attempts": self.attempts, "retryToken": self.old_token}
        st = clean_artifacts({**self.base, **carry, **extra, "phase": PENDING, "message": message})
        return ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, reason, message))

    def retry(self, why: str) -> ArtifactOutcome:
        """Pending the next attempt (the caller deletes the failed Job or creates the new one)."""
        n = self.attempts + 1
        return self.pending(f"{why}: attempt {n}", attempts=n, retryToken=self.token)

    def retry_reason(self, due: datetime | None, template_changed: bool = False) -> str | None:
        """Why a failed compile is retried now, if it is."""
        if self.token and self.token != self.old_token:
            return f"retrying now ({RETRY_ANNOTATION}={self.token})"
        if template_changed:
            return "retrying now: the precompile pod template changed since the failed attempt"
        if due is None or self.now >= due:
            return "retrying after backoff"
        return None

    def failed(self, message: str, reason: str, due: datetime) -> ArtifactOutcome:
        """Failed until ``due`` (the Job, if it is still there, is kept for its owners)."""
        carry = {"attempts": self.attempts, "retryToken": self.old_token}
        st = clean_artifacts(
            {**self.base, **carry, "phase": FAILED, "message": message, "reason": reason,
             "nextRetryAt": fmt_time(due)}
        )  # fmt: skip
        text = (
            f"{message}; attempt {self.attempts}, next retry at {fmt_time(due)} (or set the "
            f"annotation {RETRY_ANNOTATION} to a new value to retry now)"
        )
        out = ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, reason, text))
        out.requeue_after = max(1.0, (due - self.now).total_seconds())
        return out

    def replaceable(self, job: dict[str, Any]) -> bool:
        """The live Job was built from another pod template of this model's (see
        precompile_state.template_changed)."""
        desired = self.job().metadata
        want = ((desired.annotations if desired else None) or {}).get(
            names.TEMPLATE_HASH_ANNOTATION, ""
        )
        sharers = [o.name for o in self.obs.job_owners]
        return template_changed(job, want, self.plan.name, sharers)


def decide_artifact(
    plan: ModelPlan,
    obs: Observed,
    model: dict[str, Any],
    cache: CacheOutcome,
    now: str,
    policy: Policy,
) -> ArtifactOutcome:
    """The artifact for this spec's key *on this claim*, and the precompile Job behind it.

    Readiness is per (claim, key): a Complete Job on a claim that was recreated since, or a
    remembered Ready on another claim, is not an artifact here.
    """
    a = _ArtifactFacts.read(plan, obs, model, cache, now, policy)
    job = obs.job
    if job is None:
        out = _without_job(a, model)
        if out.job is not None and not obs.compile_slot.free:
            return _waiting_for_compile_slot(a, out)
        return out
    state = job_state(job)
    if state == READY:
        return _unless_answers_refused(a, _compiled(a, job))
    if state == FAILED:
        return _after_failure(a, job)
    return _running(a, job)


def _without_job(a: _ArtifactFacts, model: dict[str, Any]) -> ArtifactOutcome:
    """No Job for this (claim, key): what status remembers, else a (new) compile."""
    refused = _refused_by_servers(a.plan, a.obs)
    if refused:
        out = a.pending(f"{refused}; the precompile Job is gone: compiling the artifact again")
        out.job = a.job()
        return out
    known = _known_on_claim(a, model)
    if known is not None:
        return _unless_answers_refused(a, known)
    if a.cache.missing:
        return a.pending("waiting for the cache claim", reason=C.CLAIM_NOT_FOUND)
    if a.old.get("phase") == FAILED:
        # The failed Job was removed (its TTL, or by hand): status has its reason and retry.
        due = parse_time(a.old.get("nextRetryAt"))
        why = a.retry_reason(due)
        if why is None and due is not None:
            reason = a.old.get("reason") or C.PRECOMPILE_FAILED
            return a.failed(a.old.get("message") or "precompile Job failed", reason, due)
        out = a.retry(why or "retrying after backoff")
        out.job = a.job(a.attempts + 1)
        return out
    removed = a.obs.collected.get(a.plan.key)  # what status remembered is gone: say so
    out = a.pending(
        "creating the precompile Job"
        if removed is None
        else f"the artifact was removed from PVC {a.plan.claim} by garbage collection"
        f"{f' at {removed}' if removed else ''}; compiling it again"
    )
    out.job = a.job()
    return out


def waiting_since(model: dict[str, Any], plan: ModelPlan, now: str) -> str:
    """Since when the model waits for a compile slot for this (claim, key): what its status
    recorded (so a restarted operator keeps the order), else now."""
    old = (model.get("status") or {}).get("artifact") or {}
    if old.get("key") == plan.key and old.get("claim") == plan.claim and old.get("waitingSince"):
        return str(old["waitingSince"])
    return now


def _waiting_for_compile_slot(a: _ArtifactFacts, out: ArtifactOutcome) -> ArtifactOutcome:
    """The Job ``out`` would create waits for the compile budget: no Job; status says why and
    since when (the order among waiting models, oldest first)."""
    slot = a.obs.compile_slot
    message = (
        f"{slot.message('precompile', 'max-concurrent-compiles')}; the precompile Job "
        f"{a.plan.job_name} starts when a slot frees"
    )
    since = a.old.get("waitingSince") or fmt_time(a.now)  # as waiting_since() finds it
    st = {**out.status, "phase": PENDING, "message": message, "waitingSince": since}
    waiting = ArtifactOutcome(
        st, C.Cond(C.ARTIFACT_READY, C.FALSE, C.WAITING_FOR_COMPILE_SLOT, message)
    )
    waiting.waiting = True
    waiting.requeue_after = WAITING_RECHECK_SECONDS
    return waiting


def _known_on_claim(a: _ArtifactFacts, model: dict[str, Any]) -> ArtifactOutcome | None:
    """Ready without a Job: the artifact is on this very claim (same UID), as this model's
    status or another user's of the claim records it (the Job was removed: TTL, by hand)."""
    plan, old = a.plan, a.old
    if (
        old.get("phase") == READY
        and a.pvc_uid
        and old.get("claimUID") == a.pvc_uid
        and not collected_since(a.obs, plan.key, old.get("completedAt"))
    ):
        st = {**old, "jobName": plan.job_name}
        return ArtifactOutcome(st, _ready_condition(plan, st, remembered=True))
    known = _remembered_on_claim(model, plan, a.pvc_uid)
    if known is None and a.pvc_uid:
        known = next(
            (
                e
                for e in a.obs.claim_artifacts
                if e.get("key") == plan.key
                and e.get("claim") == plan.claim
                and e.get("claimUID") == a.pvc_uid
            ),
            None,
        )
    if known is None or collected_since(a.obs, plan.key, known.get("completedAt")):
        return None
    # A revert to a shape compiled before (or one another model compiled), still on this
    # claim: serve it, no Job.
    st = clean_artifacts(
        {
            **a.base,
            "phase": READY,
            "claimUID": a.pvc_uid,
            "sizeBytes": known.get("sizeBytes"),
            "compileSeconds": known.get("compileSeconds"),
            "completedAt": known.get("completedAt"),
            "modelRevision": known.get("modelRevision"),
        }
    )
    return ArtifactOutcome(st, _ready_condition(plan, st, remembered=True))


def _compiled(a: _ArtifactFacts, job: dict[str, Any]) -> ArtifactOutcome:
    """The Job completed: ready, unless the claim was created again since."""
    if _created_after_completion(a.obs.cache_pvc, job):
        out = a.pending(
            f"PVC {a.plan.claim} was created after this artifact was compiled: the "
            "artifact is not on it; compiling again"
        )
        out.delete_job = True
        return out
    removed = collected_since(a.obs, a.plan.key, jobs.finished_at(job))
    if removed is not None:
        out = a.pending(
            f"the artifact was removed from PVC {a.plan.claim} by garbage collection"
            f"{f' ({removed})' if removed else ''} after this Job compiled it; compiling again"
        )
        out.delete_job = True
        return out
    st = clean_artifacts(
        {**a.base, **_ready_status(a.plan, a.obs, job), "claimUID": a.pvc_uid,
         "attempts": a.attempts}
    )  # fmt: skip
    out = ArtifactOutcome(st, _ready_condition(a.plan, st))
    out.job = a.job()
    return out


def _after_failure(a: _ArtifactFacts, job: dict[str, Any]) -> ArtifactOutcome:
    """The Job failed: Failed until the retry is due (one backoff per claim and key: the
    attempt is the Job's), asked for, or the model's pod template changed."""
    failed_at = parse_time((jobs.condition(job, jobs.FAILED) or {}).get("lastTransitionTime"))
    due = (failed_at or a.now) + timedelta(seconds=a.policy.retry_delay(a.attempts))
    why = a.retry_reason(due, template_changed=a.replaceable(job))
    if why is not None:
        out = a.retry(why)
        out.delete_job = True
        return out
    parsed = _summary(a.obs)
    reason = (
        parsed.reason
        if isinstance(parsed, EngineFailure) and parsed.reason in C.ENGINE_COMPILE_REASONS
        else C.PRECOMPILE_FAILED
    )
    out = a.failed(_failure_message(a.obs, job, parsed), reason, due)
    out.job = a.job()
    return out


def _running(a: _ArtifactFacts, job: dict[str, Any]) -> ArtifactOutcome:
    """The Job runs: compiling, or its pod cannot start (the pod's own reason and message).

    A stuck Job whose pod template this model changed since (placement, resources, a Secret
    outside the key) is replaced at once rather than left to its deadline; a Job whose pod
    runs is never replaced.
    """
    plan = a.plan
    claim_bound = ((a.obs.cache_pvc or {}).get("status") or {}).get("phase") == "Bound"
    stuck = job_stuck(plan.job_name, a.obs.job_pods, a.obs.job_events, claim_bound)
    if stuck is not None and a.replaceable(job):
        out = a.pending(
            f"replacing precompile Job {plan.job_name}: its pod template changed since it was "
            f"created, and it could not start ({stuck.message})"[:1024]
        )
        out.delete_job = True
        return out
    carry = {"attempts": a.attempts, "retryToken": a.old_token}
    if stuck is not None:
        st = clean_artifacts({**a.base, **carry, "phase": PENDING, "message": stuck.message})
        out = ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, stuck.reason, stuck.message))
        out.stuck = stuck
        out.job = a.job()
        return out
    active = job.get("status", {}).get("active") or 0
    msg = f"precompile Job {plan.job_name} is running" if active else "precompile pod starting"
    st = clean_artifacts({**a.base, **carry, "phase": COMPILING, "message": msg})
    out = ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, C.COMPILING, msg))
    out.job = a.job()
    return out


def clean_artifacts(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _ready_condition(plan: ModelPlan, st: dict[str, Any], remembered: bool = False) -> C.Cond:
    detail = ""
    if st.get("compileSeconds") is not None:
        detail = f" (compiled in {st['compileSeconds']:.0f}s, {human_size(st.get('sizeBytes'))})"
    if remembered:
        detail += f"; compiled earlier ({st.get('completedAt') or 'time unknown'}), not again"
    return C.Cond(
        C.ARTIFACT_READY,
        C.TRUE,
        C.ARTIFACT_AVAILABLE,
        f"artifact {plan.short_key} ready at {st['path']} on PVC {plan.claim}{detail}",
    )


# ------------------------------------------------------------------------------ remembered


def remembered_artifacts(model: dict[str, Any]) -> list[dict[str, Any]]:
    cache = (model.get("status") or {}).get("cache") or {}
    return [a for a in cache.get("artifacts") or [] if a.get("key") and a.get("claim")]


def collected_since(obs: Observed, key: str, compiled_at: str | None) -> str | None:
    """When a finished GC Job removed ``key`` from the claim after it was compiled at
    ``compiled_at`` ("" if that Job's time is unknown); None if no GC Job removed it since
    (a removal before the compile is a stale report: the artifact was compiled again)."""
    removed_at = obs.collected.get(key)
    if removed_at is None:
        return None
    removed, compiled = parse_time(removed_at), parse_time(compiled_at)
    if removed is not None and compiled is not None and compiled > removed:
        return None
    return removed_at


def _remembered_on_claim(
    model: dict[str, Any], plan: ModelPlan, pvc_uid: str | None
) -> dict[str, Any] | None:
    """The remembered artifact of this spec's key on this very claim (same UID), if any."""
    if not pvc_uid:
        return None
    for a in remembered_artifacts(model):
        if a["key"] == plan.key and a["claim"] == plan.claim and a.get("claimUID") == pvc_uid:
            return a
    return None


def _unless_answers_refused(a: _ArtifactFacts, out: ArtifactOutcome) -> ArtifactOutcome:
    """A compiled artifact whose serving pods stopped on OutputMismatch or CanaryFailed is
    refused: Failed with that reason (not compiled again: the same inputs give the same
    graphs), and status remembers it once the pods are gone, so the model does not switch
    back to it. The retry annotation, set to a new value, asks for the check (or the canary)
    again."""
    if out.phase != READY:
        return out
    refused_before = (
        a.old.get("phase") == FAILED and a.old.get("reason") in C.SERVING_REFUSED_REASONS
    )
    if refused_before and a.token != a.old_token:
        out.status = clean_artifacts({**out.status, "retryToken": a.token})
        out.cond = C.Cond(
            C.ARTIFACT_READY, C.TRUE, out.cond.reason,
            f"{out.cond.message}; checking its answers again ({RETRY_ANNOTATION}={a.token})",
        )  # fmt: skip
        return out
    found = _answers_refused_by_servers(a.plan, a.obs) or _canary_refused(a)
    if found is not None:
        reason, why = found
        token = a.token
    elif refused_before:
        reason = a.old.get("reason") or C.OUTPUT_MISMATCH
        why, token = a.old.get("message") or "its serving pods refused it", a.old_token
    else:
        return out
    st = clean_artifacts(
        {**out.status, "phase": FAILED, "reason": reason, "message": why, "retryToken": token}
    )
    text = (
        f"{why}; not promoted, the artifact served before keeps serving (set the annotation "
        f"{RETRY_ANNOTATION} to a new value to check this one again)"
    )[:1024]
    refused = ArtifactOutcome(st, C.Cond(C.ARTIFACT_READY, C.FALSE, reason, text))
    refused.job = out.job
    return refused


def _canary_refused(a: _ArtifactFacts) -> tuple[str, str] | None:
    """The operator's own verdicts on the spec's running canary (status.canary, which only
    the operator writes): aborted by the annotation naming its artifact, worse than the
    baseline at its window's end, or not passed by its deadline (what it was doing then is its
    last message)."""
    spec, st = a.plan.spec.serving.canary, a.canary
    if spec is None or st.get("artifactKey") != a.plan.key or st.get("phase") != "Running":
        return None
    if a.abort and a.abort == a.plan.short_key:
        return C.CANARY_ABORTED, (
            f"the canary was aborted by the annotation {CANARY_ABORT_ANNOTATION}={a.abort} "
            "(remove it, then set the retry annotation, to run the canary again)"
        )
    if st.get("baselineVerdict"):  # decide/baseline.py, at the window's end
        return C.CANARY_FAILED, (
            f"compared with the previous artifact's pods over its window: "
            f"{st['baselineVerdict']}"
        )[:1024]
    created = parse_time(st.get("createdTime"))
    if created is not None and (a.now - created).total_seconds() >= spec.deadline:
        doing = str(st.get("message") or "").strip()
        return C.CANARY_DEADLINE_EXCEEDED, (
            f"the canary was not passed within canary.deadlineSeconds ({spec.deadline}s) of "
            f"its start at {st.get('createdTime')}" + (f": {doing}" if doing else "")
        )[:1024]
    return None


def _answers_refused_by_servers(plan: ModelPlan, obs: Observed) -> tuple[str, str] | None:
    """A serving pod of this key that stopped on OutputMismatch (the first divergence) or
    CanaryFailed (the bound it broke): the reason, and which pod said what (the engine's
    termination message)."""
    for p, parsed in _server_failures(plan, obs):
        if parsed.reason == C.OUTPUT_MISMATCH:
            return parsed.reason, (
                f"pod {p.get('name')}: answers unlike the artifact's reference: {parsed.message}"
            )
        if parsed.reason == C.CANARY_FAILED:
            return parsed.reason, f"canary pod {p.get('name')}: {parsed.message}"
    return None


def _refused_by_servers(plan: ModelPlan, obs: Observed) -> str | None:
    """A serving pod of this key refused its artifact (missing, corrupt, no entry).

    Then remembering it is not enough: with its Job gone, it is compiled again (the engine's
    precompile removes what the manifest shows damaged first). A Job that still exists is not
    re-run by this: one automatic recompile, never a loop.
    """
    for p, parsed in _server_failures(plan, obs):
        if parsed.reason in C.ARTIFACT_REFUSED_REASONS:
            return f"pod {p.get('name')} refused the artifact ({parsed.reason})"
    return None


def _server_failures(
    plan: ModelPlan, obs: Observed
) -> Iterator[tuple[dict[str, Any], EngineFailure]]:
    """The serving pods of this key whose engine stopped with a reason, and that reason."""
    for p in obs.server_pods:
        if p.get("artifact") != plan.short_key:
            continue
        parsed = parse_termination_message((p.get("terminated") or {}).get("message"))
        if isinstance(parsed, EngineFailure):
            yield p, parsed
