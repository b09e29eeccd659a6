"""The cache status decision: status.cache, the artifacts a model compiled or served and
their total size (:func:`decide_cache_status`; pure, no I/O)."""

from __future__ import annotations

from typing import Any

from ..api.v1alpha1 import SpyreModelSpec
from ..desired.plan import ModelPlan, plan_model
from ..desired.quantity import parse_quantity
from .artifact import ArtifactOutcome, clean_artifacts, collected_since, remembered_artifacts
from .observed import READY, Observed, human_size, parse_time, served_key, served_spec_of
from .serving import ServingOutcome

#: How many artifacts a model's status remembers (most recently used first).
MAX_REMEMBERED = 16


def shape_text(spec: SpyreModelSpec) -> str:
    """The compile shape in short, for status.cache.artifacts."""
    c = spec.compile
    parts = [f"tp={c.tensor_parallel_size}", f"backend={c.backend}"]
    if c.warmup_shapes:
        shapes = ",".join(f"{w.prompt_len}x{w.batch_size}" for w in c.warmup_shapes)
        parts.append(f"warmup={shapes}")
    else:
        parts += [f"maxModelLen={c.max_model_len}", f"maxNumSeqs={c.max_num_seqs}"]
        if c.max_num_batched_tokens:
            parts.append(f"chunk={c.max_num_batched_tokens}")
    return " ".join(parts)


def decide_cache_status(
    model: dict[str, Any],
    plan: ModelPlan,
    obs: Observed,
    artifact: ArtifactOutcome,
    serving: ServingOutcome,
    now: str,
) -> dict[str, Any] | None:
    """status.cache: the artifacts this model compiled or served, and their total size.

    An artifact is recorded once Ready on a claim and stays listed (at most
    :data:`MAX_REMEMBERED`, most recently used first) so a revert finds it. ``inUse`` is
    whether the spec needs it or the Deployment serves it; ``lastUsed`` changes only when that
    flips, so an idle resync writes nothing. Entries of the spec's claim recorded on an older
    incarnation of it (another UID) are dropped: that claim holds none of them.
    """
    pvc_uid = ((obs.cache_pvc or {}).get("metadata") or {}).get("uid")
    entries: dict[tuple[str, str], dict[str, Any]] = {
        (a["key"], a["claim"]): dict(a) for a in remembered_artifacts(model)
    }
    if artifact.phase == READY:
        st = artifact.status
        rec = {
            "key": plan.key,
            "claim": plan.claim,
            "claimUID": st.get("claimUID") or pvc_uid,
            "path": st.get("path"),
            "model": plan.spec.model.uri,
            "shape": shape_text(plan.spec),
            "sizeBytes": st.get("sizeBytes"),
            "compileSeconds": st.get("compileSeconds"),
            "completedAt": st.get("completedAt"),
            "modelRevision": st.get("modelRevision"),
        }
        prev = entries.get((plan.key, plan.claim), {})
        entries[(plan.key, plan.claim)] = {**prev, **clean_artifacts(rec)}
    if pvc_uid:
        entries = {
            k: a
            for k, a in entries.items()
            if not (a["claim"] == plan.claim and a.get("claimUID") not in (None, pvc_uid))
        }
    in_use = set()
    if artifact.phase == READY:
        in_use.add((plan.key, plan.claim))
    if serving.key and serving.plan is not None:
        in_use.add((serving.key, serving.plan.claim))
    live_key, live_spec = served_key(obs.deployment), served_spec_of(obs.deployment or {})
    if live_key and live_spec is not None:  # its pods serve it until the rollout replaces them
        live = plan_model(
            plan.name, plan.namespace, plan.uid, live_spec, plan.site.for_served_spec()
        )
        in_use.add((live_key, live.claim))
    entries = {  # removed by a GC Job since compiled: no longer on the claim (unless in use)
        k: a
        for k, a in entries.items()
        if not (
            k[1] == plan.claim
            and collected_since(obs, k[0], a.get("completedAt")) is not None
            and k not in in_use
        )
    }
    for k, a in entries.items():
        using = k in in_use
        if "lastUsed" not in a or bool(a.get("inUse")) != using:
            a["lastUsed"] = now
        a["inUse"] = using
    if not entries:
        return None
    ordered = sorted(entries.values(), key=lambda a: (a["key"], a["claim"]))
    ordered.sort(key=lambda a: (not a["inUse"], _neg_time(a.get("lastUsed"))))
    kept = ordered[:MAX_REMEMBERED]
    here = [a for a in kept if a["claim"] == plan.claim]
    used = sum(int(a.get("sizeBytes") or 0) for a in here)
    return {
        "artifacts": kept,
        "usedBytes": used,
        "usage": f"{human_size(used)} in {len(here)}",
        **claim_space(model, obs, pvc_uid),
    }


def claim_space(model: dict[str, Any], obs: Observed, pvc_uid: str | None) -> dict[str, Any]:
    """The current claim's capacity (its PVC's status), and its free space and downloaded
    models' size as last measured on the volume: the newest GC Job's, else what status recorded
    for this incarnation of the claim (a restart, or the Job gone by its TTL, loses no figure;
    another claim's is never shown)."""
    out: dict[str, Any] = {}
    capacity = parse_quantity(
        (((obs.cache_pvc or {}).get("status") or {}).get("capacity") or {}).get("storage"))
    if capacity is not None and capacity > 0:
        out["capacityBytes"] = int(capacity)
    if pvc_uid is None:
        return out
    prev = (model.get("status") or {}).get("cache") or {}
    if obs.claim_measured is not None:
        m = obs.claim_measured
        measured = {"freeBytes": m.free_bytes, "weightsBytes": m.weights_bytes,
                    "measuredAt": m.at or None}  # fmt: skip
    elif prev.get("claimUID") == pvc_uid:
        measured = {k: prev.get(k) for k in ("freeBytes", "weightsBytes", "measuredAt")}
    else:
        measured = {}
    measured = {k: v for k, v in measured.items()
                if (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
                or (k == "measuredAt" and isinstance(v, str))}  # fmt: skip
    return {**out, "claimUID": pvc_uid, **measured}


def _neg_time(t: str | None) -> float:
    parsed = parse_time(t)
    return -parsed.timestamp() if parsed else 0.0
