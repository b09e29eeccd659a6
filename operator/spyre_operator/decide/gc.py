"""Garbage collection of unused artifacts on a managed cache volume: the pure decisions.

The operator never mounts a volume: it decides here which keys of one claim are unused and
old enough, and a short Job (desired/gcjob.py) runs ``spyre-engine gc --remove KEYS`` on the
claim. The engine removes them so that nobody sees half of one and skips any directory a
precompile still writes (its writer lock); the Job's termination message says what it removed.

Only artifacts some SpyreModel using the claim still lists in ``status.cache.artifacts`` are
known to the operator; those of a deleted SpyreModel went with its status. They are orphans:
a sweep (``--keep`` = every key still known, see :func:`known_keys`) has the engine time them
on the volume from the first gc that finds them and remove them once unknown for
``unusedForSeconds`` (``keepLast`` does not apply: no model is left to roll back).

The collaborator that acts on them (reads the caches and finished GC Jobs, creates GC Jobs,
reports Events) is control/gc.py's ``GarbageCollector``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import spyre_contract as contract

from ..api.v1alpha1 import CacheRetention
from ..desired import names
from . import jobs


@dataclass(frozen=True)
class ClaimUse:
    """One SpyreModel using the claim: the key its spec needs and what its status lists."""

    name: str
    #: The key the current spec needs (in use even before it is compiled).
    spec_key: str | None
    #: status.cache.artifacts (every claim; only this claim's entries are considered).
    artifacts: list[dict[str, Any]] = field(default_factory=list)


def _time(s: str | None) -> datetime | None:
    if not s:
        return None
    try:
        return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def epoch(s: str | None) -> float | None:
    """Unix seconds of an RFC 3339 ``...Z`` time (the operator's clock), or None."""
    t = _time(s)
    return None if t is None else t.timestamp()


def keys_to_remove(
    claim: str,
    claim_uid: str | None,
    users: Iterable[ClaimUse],
    protected: Iterable[str],
    retention: CacheRetention,
    now: str,
) -> list[str]:
    """The artifact keys of ``claim`` to remove, sorted.

    A key is kept when any of these holds: retention is disabled; a user's spec needs it; it
    is in ``protected`` (served by a Deployment, written by a running precompile Job); a user
    lists it as in use; it was last used (latest over the users listing it) less than
    ``retention.unusedForSeconds`` ago or at an unknown time; it is among the
    ``retention.keepLast`` most recently used unused artifacts of a user. Entries recorded on
    another incarnation of the claim (another UID) are not on this volume and never listed.
    """
    if not retention.enabled:
        return []
    users = list(users)
    keep = set(protected) | {u.spec_key for u in users if u.spec_key}
    last_used: dict[str, datetime | None] = {}
    for u in users:
        mine = [
            a
            for a in u.artifacts
            if a.get("key")
            and a.get("claim") == claim
            and (claim_uid is None or a.get("claimUID") in (None, claim_uid))
        ]
        unused = []
        for a in mine:
            if a.get("inUse"):
                keep.add(a["key"])
                continue
            t = _time(a.get("lastUsed"))
            if t is None:
                keep.add(a["key"])  # unknown age: not provably old
            prev = last_used.get(a["key"], t)
            last_used[a["key"]] = None if prev is None or t is None else max(prev, t)
            unused.append((t, a["key"]))
        unused.sort(key=lambda p: (p[0] is not None, p[0]), reverse=True)
        keep |= {k for _t, k in unused[: retention.keep_last]}
    cutoff = _time(now)
    out = []
    for key, t in last_used.items():
        if key in keep or t is None or cutoff is None:
            continue
        if (cutoff - t).total_seconds() >= retention.unused_for_seconds:
            out.append(key)
    return sorted(out)


def known_keys(
    claim: str,
    statuses: Iterable[dict[str, Any]],
    spec_keys: Iterable[str | None],
    protected: Iterable[str],
) -> set[str]:
    """Every key of ``claim`` the operator knows: listed in any SpyreModel's status (any
    incarnation of the claim, in use or not), needed by a spec, or protected (served by a
    Deployment, compiled by a running Job). A sweep treats every other dir as an orphan."""
    out = {k for k in spec_keys if k} | set(protected)
    for status in statuses:
        for a in ((status or {}).get("cache") or {}).get("artifacts") or []:
            if a.get("key") and a.get("claim") == claim:
                out.add(str(a["key"]))
    return out


def named_models(models: Iterable[dict[str, Any]]) -> set[str]:
    """The ``hf://`` models (``ORG/NAME[@REVISION]``) SpyreModels name: their spec, the spec
    they serve (``status.servedSpec``) and the one they last served well
    (``status.lastGoodServedSpec``). A sweep keeps these downloads on the claim (engine
    weights.py); the GC pod also keeps what pods and Jobs run right then. The served specs are
    read for their model alone, not validated as a spec (``parse_served_spec``): one an older
    operator wrote that no longer validates still keeps its model."""
    out: set[str] = set()
    for m in models:
        uris = [((m.get("spec") or {}).get("model") or {}).get("uri")]
        status = m.get("status") or {}
        for field_ in ("servedSpec", "lastGoodServedSpec"):
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                uris.append((json.loads(status.get(field_) or "{}").get("model") or {}).get("uri"))
        out |= {u[len("hf://"):] for u in uris if isinstance(u, str) and u.startswith("hf://")}
    return out


@dataclass(frozen=True)
class GcResult:
    """What a GC Job's ``spyre-engine gc`` removed (its termination message)."""

    removed: dict[str, int]
    skipped: dict[str, str]
    freed_bytes: int
    #: Removed keys that were orphans (no SpyreModel listed them).
    orphans_removed: frozenset[str] = frozenset()
    #: Orphans not due yet: (key, first found unknown, unix seconds), oldest first.
    orphans: tuple[tuple[str, int], ...] = ()
    orphan_count: int = 0
    orphan_bytes: int = 0
    #: Every artifact dir on the volume after the removal, measured (None: not reported).
    remaining_bytes: int | None = None
    #: The volume's size and its free space after the removal (statvfs; None: not reported).
    volume_bytes: int | None = None
    free_bytes: int | None = None
    #: The downloaded models (hf://) on the claim, beside the artifacts (None: not reported).
    weights_bytes: int | None = None
    #: The volume's own record of removals (engine gc.py's ``.gc-removed.json``), this run's
    #: and earlier runs' whose Jobs may have gone unread: {key: when}.
    removed_record: dict[str, str] = field(default_factory=dict)
    #: Downloaded models (hub/ folders, or ``<folder>/snapshots/<commit>`` for an old
    #: revision) removed: {unit: bytes}; freed in all; pending: (unit, first found unnamed).
    models_removed: dict[str, int] = field(default_factory=dict)
    models_freed_bytes: int = 0
    models_pending: tuple[tuple[str, int], ...] = ()


#: What a summary may name as a downloaded model: huggingface_hub's folder, or one of its
#: snapshots (the pod's output: nothing else is believed).
_MODEL_UNIT = re.compile(r"^models--[A-Za-z0-9._-]+--[A-Za-z0-9._-]+(/snapshots/[0-9a-f]{40})?$")


def _model_units(doc: dict[str, Any], name: str, value: str) -> dict[str, int]:
    """``{unit: value}`` of a summary's list of downloaded models (``modelsRemoved``:
    sizeBytes, ``modelsPending``: since), only well-formed units and counts."""
    out: dict[str, int] = {}
    items = doc.get(name)
    for r in items if isinstance(items, list) else []:
        if not isinstance(r, dict):
            continue
        unit, n = r.get("model"), r.get(value)
        if isinstance(unit, str) and len(unit) <= 300 and _MODEL_UNIT.match(unit) \
                and ".." not in unit and type(n) is int and n >= 0:
            out[unit] = n
    return out


#: The longest key the engine's record may name (the operator's are 32 hex digits).
_MAX_RECORDED_KEY = 64


def _record_entries(doc: dict[str, Any]) -> dict[str, str]:
    """``removedRecord`` of a GC summary: the pod's output, so only plain keys with times the
    operator's clock format parses."""
    raw = doc.get("removedRecord")
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items()
            if isinstance(k, str) and 0 < len(k) <= _MAX_RECORDED_KEY and "/" not in k
            and not k.startswith(".") and isinstance(v, str) and _time(v) is not None}


def _count(doc: dict[str, Any], field: str) -> int | None:
    """A non-negative integer field of a GC summary (the pod's own output: never trusted as
    anything else), or None."""
    v = doc.get(field)
    return v if type(v) is int and v >= 0 else None


def parse_gc_result(message: str | None) -> GcResult | None:
    """The one-line JSON ``spyre-engine gc`` writes, or None (failed, or not a gc summary)."""
    if not message:
        return None
    for line in reversed(message.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict) or contract.REMOVED not in doc:
            return None
        removed = {
            str(r["key"]): int(r.get("sizeBytes") or 0)
            for r in doc.get(contract.REMOVED) or []
            if isinstance(r, dict) and r.get("key")
        }
        skipped = {
            str(r["key"]): str(r.get("reason") or "")
            for r in doc.get(contract.SKIPPED) or []
            if isinstance(r, dict) and r.get("key")
        }
        orphans = tuple(
            (str(o["key"]), int(o.get("since") or 0))
            for o in doc.get("orphans") or []
            if isinstance(o, dict) and o.get("key")
        )
        return GcResult(
            removed,
            skipped,
            int(doc.get(contract.FREED_BYTES) or 0),
            orphans_removed=frozenset(
                str(r["key"])
                for r in doc.get(contract.REMOVED) or []
                if isinstance(r, dict) and r.get("key") and r.get("orphan")
            ),
            orphans=orphans,
            orphan_count=int(doc.get("orphanCount") or len(orphans)),
            orphan_bytes=int(doc.get("orphanBytes") or 0),
            remaining_bytes=(
                int(doc["remainingBytes"]) if doc.get("remainingBytes") is not None else None
            ),
            volume_bytes=_count(doc, "volumeBytes"),
            free_bytes=_count(doc, "freeBytes"),
            weights_bytes=_count(doc, "weightsBytes"),
            removed_record=_record_entries(doc),
            models_removed=_model_units(doc, "modelsRemoved", "sizeBytes"),
            models_freed_bytes=_count(doc, "modelsFreedBytes") or 0,
            models_pending=tuple(sorted(_model_units(doc, "modelsPending", "since").items(),
                                        key=lambda kv: (kv[1], kv[0]))),
        )
    return None


def removed_record(pvc: dict[str, Any] | None) -> dict[str, str]:
    """The keys GC removed from this volume, with when (the PVC's record; see
    ``names.REMOVED_ARTIFACTS_ANNOTATION``). Unreadable: empty."""
    meta = (pvc or {}).get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(names.REMOVED_ARTIFACTS_ANNOTATION)
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): str(v) for k, v in doc.items() if k and isinstance(v, str) and v}


def with_removed(record: dict[str, str], keys: Iterable[str], when: str,
                 limit: int = names.REMOVED_ARTIFACTS_KEPT) -> dict[str, str]:
    """``record`` with ``keys`` removed at ``when`` (the later time wins), the newest
    ``limit`` kept (by time, then key)."""
    return merge_removed(record, dict.fromkeys(keys, when), limit)


def merge_removed(record: dict[str, str], entries: dict[str, str],
                  limit: int | None = names.REMOVED_ARTIFACTS_KEPT) -> dict[str, str]:
    """``record`` with each of ``entries`` (key: removed at; the later time wins), the
    newest ``limit`` kept (by time, then key; None: all)."""
    out = dict(record)
    for k, when in entries.items():
        out[k] = max(out.get(k, ""), when)
    newest = sorted(out.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:limit]
    return dict(sorted(newest))


def gone_keys(result: GcResult) -> set[str]:
    """What a GC Job left absent from the volume: removed, or already absent."""
    return set(result.removed) | {k for k, r in result.skipped.items() if r == "absent"}


def stale_compile(job: dict[str, Any], removed_at: str | None) -> bool:
    """A precompile Job whose artifact a GC Job removed at ``removed_at``: it finished before
    that (unknown times: finished). A Job of the same name that runs, or finished after, is a
    recompile of the key: deleting it would kill or forget that compile."""
    if not jobs.finished(job):
        return False
    done = jobs.finished_at(job)
    return not (removed_at and done and done > removed_at)


def still_listed(keys: set[str], claim: str, models: list[dict[str, Any]]) -> bool:
    """Some model's status.cache.artifacts lists one of ``keys`` on ``claim``."""
    return any(
        a.get("key") in keys and a.get("claim") == claim
        for m in models
        for a in ((m.get("status") or {}).get("cache") or {}).get("artifacts") or []
    )


def mounts_claim(workload: dict[str, Any], claim: str) -> bool:
    """The pod template of a Deployment or Job mounts PVC ``claim`` (or lists no volumes at
    all: unknown counts as mounted, so its key is kept)."""
    pod = (((workload.get("spec") or {}).get("template") or {}).get("spec")) or {}
    volumes = pod.get("volumes")
    if not volumes:
        return True
    return any((v.get("persistentVolumeClaim") or {}).get("claimName") == claim for v in volumes)
