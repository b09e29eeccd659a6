"""The precompile Job as a model sees it (pure, no I/O): why its pod does not start, whether
to replace it, what attempt it is, and which Jobs no spec needs any more.

A running Job says nothing about a pod that cannot start: an unschedulable pod, an image that
cannot be pulled, a missing Secret, a quota that refuses the pod all leave the Job "active"
until its deadline (2 h by default). The controller reads the pods (and, while the Job has
none, its FailedCreate Events) and these functions turn them into a condition reason with
the pod's own message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..desired import names
from . import conditions as C
from . import pods as P


@dataclass(frozen=True)
class Stuck:
    """Why a running precompile Job makes no progress."""

    reason: str
    message: str
    #: Only a fix makes it start (Degraded); an unschedulable pod may get a node by itself.
    needs_fix: bool


#: The scheduler's verdict on a pod whose PersistentVolumeClaim is not bound yet (a PreFilter
#: rejection for every node: it says nothing else); k8s.io/kubernetes v1.36.3
#: pkg/scheduler/framework/plugins/volumebinding/volume_binding.go PreFilter.
UNBOUND_CLAIM_VERDICT = "unbound immediate PersistentVolumeClaims"


def job_stuck(
    job_name: str,
    pods: list[dict[str, Any]],
    events: Iterable[dict[str, Any]] = (),
    claim_bound: bool = False,
) -> Stuck | None:
    """Why the running Job ``job_name`` does not compile, from its pods and Events.

    ``claim_bound``: the cache claim is Bound now. The scheduler's first try can precede the
    binding of a new claim, and its verdict stays on the pod until it tries again (the
    binding makes it); that verdict is then stale, not a reason.
    """
    live = [p for p in pods if not p.get("terminated")]
    for p in live:
        cannot = P.cannot_start(p)
        if cannot is not None:
            return Stuck(cannot[0], f"precompile Job {job_name}: {cannot[1]}"[:1024], True)
    for p in live:
        why = P.unschedulable(p)
        if why and not (claim_bound and UNBOUND_CLAIM_VERDICT in why):
            return Stuck(
                C.PRECOMPILE_UNSCHEDULABLE,
                f"precompile pod {p.get('name')} cannot be scheduled: {why}"[:1024],
                False,
            )
    if live:
        return None
    refused = [e for e in events if e.get("reason") == "FailedCreate"]
    if refused:
        last = max(refused, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return Stuck(
            C.PRECOMPILE_POD_REJECTED,
            f"the Job controller cannot create the pod of precompile Job {job_name}: "
            f"{last.get('message') or 'FailedCreate'}"[:1024],
            True,
        )
    return None


def annotation(job: dict[str, Any] | None, name: str) -> str | None:
    """An annotation of a live Job."""
    value = (((job or {}).get("metadata") or {}).get("annotations") or {}).get(name)
    return str(value) if value is not None else None


def job_attempt(job: dict[str, Any] | None) -> int | None:
    """The attempt a live Job runs for its (claim, key), if it says."""
    raw = annotation(job, names.ATTEMPT_ANNOTATION)
    try:
        return max(1, int(raw)) if raw is not None else None
    except ValueError:
        return None


def template_changed(
    live: dict[str, Any], desired_hash: str, model: str, sharers: Iterable[str]
) -> bool:
    """The live Job's pod template is not what ``model``'s spec builds now, and ``model`` may
    replace it: it built the template, or the model that did no longer needs this Job.

    Models sharing a key may place their compile differently; only the template's own model
    replaces it, so two of them never replace each other's Job in turn. A Job made before
    the template was hashed is never replaced.
    """
    live_hash = annotation(live, names.TEMPLATE_HASH_ANNOTATION)
    if live_hash is None or live_hash == desired_hash:
        return False
    built_by = annotation(live, names.TEMPLATE_OF_ANNOTATION)
    return built_by == model or built_by not in set(sharers)


def superseded(
    owned: Iterable[dict[str, Any]], claim: str, key: str, needed: Callable[[str, str], bool]
) -> list[tuple[str, str]]:
    """Precompile Jobs a model owns that no spec needs: (name, why) for each.

    ``owned`` are the Jobs listing the model as an owner; one for another (claim, key) than
    the model's spec is stopped and removed unless ``needed(claim, key)`` says some model
    (this one, or another sharing the claim) still wants that artifact.
    """
    out = []
    for job in owned:
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(names.COMPONENT) != names.COMPONENT_PRECOMPILE:
            continue
        job_claim = labels.get(names.CLAIM_LABEL)
        job_key = annotation(job, names.ARTIFACT_KEY_ANNOTATION)
        if not job_claim or not job_key or (job_claim, job_key) == (claim, key):
            continue
        if needed(job_claim, job_key):
            continue
        out.append(
            (
                str(meta.get("name")),
                f"no SpyreModel needs artifact {names.short_key(job_key)} on cache claim "
                f"{job_claim} any more",
            )
        )
    return out
