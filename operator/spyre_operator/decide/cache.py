"""The cache decision: the cache PersistentVolumeClaim to write (managed claims only) and
CacheVolumeReady (:func:`decide_cache`; pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightkube.resources.core_v1 import PersistentVolumeClaim

from ..api.v1alpha1 import CacheVolumeSpec
from ..desired import names
from ..desired.plan import ModelPlan
from ..desired.pvc import build_cache_pvc, cache_owners
from ..desired.quantity import parse_quantity
from . import conditions as C
from .observed import Observed, human_size


@dataclass
class CacheOutcome:
    """The cache claim: what to write, its condition, and a problem users must fix."""

    cond: C.Cond
    pvc: PersistentVolumeClaim | None = None
    #: Degraded: another model's settings won, or an immutable field was edited.
    problem: C.Cond | None = None

    @property
    def missing(self) -> bool:
        return self.cond.reason == C.CLAIM_NOT_FOUND


def _claim_condition(plan: ModelPlan, pvc: dict[str, Any] | None) -> C.Cond:
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
    terminating = _claim_terminating(plan, pvc)
    if terminating is not None:
        return C.Cond(t, C.FALSE, C.CLAIM_TERMINATING, terminating)
    phase = (pvc.get("status") or {}).get("phase") or "Pending"
    if phase == "Bound":
        vol = (pvc.get("spec") or {}).get("volumeName", "")
        return C.Cond(t, C.TRUE, C.CLAIM_BOUND, f"PVC {plan.claim} is bound to {vol}")
    if phase == "Lost":
        recreate = (
            "delete the PVC: the operator creates an empty one and compiles again"
            if plan.claim_managed
            else "restore its PersistentVolume, or name another claim in cache.claimName"
        )
        return C.Cond(
            t,
            C.FALSE,
            C.CLAIM_LOST,
            f"PVC {plan.claim} lost its volume (its PersistentVolume is gone): {recreate}",
        )
    return C.Cond(
        t,
        C.FALSE,
        C.CLAIM_PENDING,
        f"PVC {plan.claim} is Pending: no matching PersistentVolume yet, or its StorageClass "
        "binds on first use (the precompile pod binds it); if it stays Pending, `kubectl "
        f"describe pvc {plan.claim}` names the provisioner's problem: set "
        "cache.volume.storageClassName to a class that provisions here, or create a "
        "PersistentVolume it can bind",
    )


def _claim_terminating(plan: ModelPlan, pvc: dict[str, Any]) -> str | None:
    """Why a PVC that is being deleted still exists (its finalizers), if it is."""
    meta = pvc.get("metadata") or {}
    since = meta.get("deletionTimestamp")
    if not since:
        return None
    finalizers = meta.get("finalizers") or []
    held = (
        f"held by {', '.join(finalizers)}"
        + (" while pods still mount it" if "kubernetes.io/pvc-protection" in finalizers else "")
        if finalizers
        else "no finalizer holds it"
    )
    then = (
        "the operator then creates an empty one and compiles again"
        if plan.claim_managed
        else "create it again, or name another claim in cache.claimName"
    )
    return f"PVC {plan.claim} is being deleted (since {since}; {held}): once it is gone {then}"


def _claim_usage(
    plan: ModelPlan, pvc: dict[str, Any] | None, used: int | None
) -> C.Cond | None:
    """CacheVolumeReady=True ClaimNearlyFull once the listed artifacts pass the threshold."""
    capacity = ((pvc or {}).get("status") or {}).get("capacity", {}).get("storage")
    if not capacity or not used:
        return None
    total = parse_quantity(capacity)
    limit = plan.spec.cache.usage_warning_percent
    if not total or total <= 0 or used * 100 < limit * total:
        return None
    return C.Cond(
        C.CACHE_VOLUME_READY,
        C.TRUE,
        C.CLAIM_NEARLY_FULL,
        f"artifacts use {human_size(used)} of PVC {plan.claim}'s {human_size(int(total))} "
        f"({int(used * 100 // total)}%, warning at {limit}%): a precompile may run out of "
        "space; "
        "lower cache.volume.retention (keepLast, unusedForSeconds) so unused artifacts are "
        "collected, or use a bigger claim",
    )


def _volume_differences(a: CacheVolumeSpec, b: CacheVolumeSpec) -> list[str]:
    """Settings of two cache.volume entries for one PVC that disagree."""
    out = []
    if parse_quantity(a.size) != parse_quantity(b.size):
        out.append(f"size {a.size} vs {b.size}")
    if a.storage_class_name != b.storage_class_name:
        out.append(f"storageClassName {a.storage_class_name} vs {b.storage_class_name}")
    if sorted(a.access_modes) != sorted(b.access_modes):
        out.append(f"accessModes {a.access_modes} vs {b.access_modes}")
    if a.retain_policy != b.retain_policy:
        out.append(f"retainPolicy {a.retain_policy} vs {b.retain_policy}")
    ra, rb = a.retention, b.retention
    for setting, x, y in (("enabled", ra.enabled, rb.enabled), ("keepLast", ra.keep_last,
                        rb.keep_last), ("unusedForSeconds", ra.unused_for_seconds,
                        rb.unused_for_seconds)):  # fmt: skip
        if x != y:  # GC applies the first user's: this one's would be ignored silently
            out.append(f"retention.{setting} {x} vs {y}")
    return out


def _immutable_edits(
    volume: CacheVolumeSpec, live: dict[str, Any], class_defaulted: bool = False
) -> tuple[CacheVolumeSpec, list[str]]:
    """``volume`` with the fields an existing PVC cannot change reset to the live values.

    A bound PVC's StorageClass and access modes are immutable and its size can only grow:
    applying such an edit is rejected on every retry, so the edit is reported instead. With a
    default StorageClass (``class_defaulted``), a volume that names none keeps the live
    class: the PVC may have been created with an earlier default, which is no edit.
    """
    spec = live.get("spec") or {}
    edits: list[str] = []
    keep: dict[str, Any] = {}
    live_class = spec.get("storageClassName")
    if volume.storage_class_name is None and class_defaulted and live_class is not None:
        keep["storage_class_name"] = live_class
    elif volume.storage_class_name is not None and volume.storage_class_name != live_class:
        edits.append(f"storageClassName {live_class} -> {volume.storage_class_name}")
        keep["storage_class_name"] = live_class
    live_modes = spec.get("accessModes") or []
    if live_modes and sorted(volume.access_modes) != sorted(live_modes):
        edits.append(f"accessModes {live_modes} -> {volume.access_modes}")
        keep["access_modes"] = list(live_modes)
    live_size = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    want, have = parse_quantity(volume.size), parse_quantity(live_size)
    if want is not None and have is not None and want < have:
        edits.append(f"size {live_size} -> {volume.size} (a PVC can only grow)")
        keep["size"] = live_size
    return (volume.model_copy(update=keep) if keep else volume), edits


def decide_cache(plan: ModelPlan, obs: Observed) -> CacheOutcome:
    """The cache PVC to write (managed claims only) and CacheVolumeReady."""
    pvc = obs.cache_pvc
    out = CacheOutcome(cond=_claim_condition(plan, pvc))
    if out.cond.reason == C.CLAIM_BOUND:
        out.cond = _claim_usage(plan, pvc, obs.claim_artifact_bytes) or out.cond
    if not (plan.claim_managed and plan.volume is not None):
        return out
    labels = ((pvc or {}).get("metadata") or {}).get("labels") or {}
    if pvc is not None and labels.get(names.MANAGED_BY) != names.MANAGED_BY_VALUE:
        return out  # a same-named PVC someone else made is used as-is, never modified
    users = obs.cache_users or [(plan.owner, plan.volume)]
    first_owner, volume = users[0]
    if first_owner != plan.owner:
        diff = _volume_differences(plan.volume, volume)
        if diff:
            out.problem = C.Cond(
                C.DEGRADED,
                C.TRUE,
                C.CLAIM_CONFLICT,
                f"PVC {plan.claim} is shared with SpyreModel {first_owner.name}, whose "
                f"cache.volume settings were first and are used ({'; '.join(diff)}, this model "
                "vs the first): make the cache.volume entries agree, or name another PVC",
            )
    if pvc is None and volume.storage_class_name is None and plan.site.storage_class_name:
        # The default StorageClass applies when the PVC is created; it keeps its class.
        volume = volume.model_copy(update={"storage_class_name": plan.site.storage_class_name})
    if pvc is not None:
        volume, edits = _immutable_edits(volume, pvc, bool(plan.site.storage_class_name))
        if edits and out.problem is None:
            out.problem = C.Cond(
                C.DEGRADED,
                C.TRUE,
                C.CLAIM_IMMUTABLE,
                f"PVC {plan.claim} cannot be changed in place ({'; '.join(edits)}): keep the "
                "old values, or name a new PVC in cache.volume.name",
            )
    out.pvc = build_cache_pvc(
        plan.namespace, volume, cache_owners(users, obs.claim_name_users)
    )
    return out
