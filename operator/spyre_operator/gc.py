"""Garbage collection of unused artifacts on a managed cache volume: the pure decision.

The operator never mounts a volume: it decides here which keys of one claim are unused and
old enough, and a short Job (desired/gcjob.py) runs ``spyre-engine gc --remove KEYS`` on the
claim. The engine removes them so that nobody sees half of one and skips any directory a
precompile still writes (its writer lock); the Job's termination message says what it removed.

Only artifacts some SpyreModel using the claim still lists in ``status.cache.artifacts`` are
known to the operator; those of a deleted SpyreModel went with its status. They are orphans:
a sweep (``--keep`` = every key still known, see :func:`known_keys`) has the engine time them
on the volume from the first gc that finds them and remove them once unknown for
``unusedForSeconds`` (``keepLast`` does not apply: no model is left to roll back).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .api.v1alpha1 import CacheRetention


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


def parse_gc_result(message: str | None) -> GcResult | None:
    """The one-line JSON ``spyre-engine gc`` writes, or None (failed, or not a gc summary)."""
    if not message:
        return None
    for line in reversed(message.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict) or "removed" not in doc:
            return None
        removed = {
            str(r["key"]): int(r.get("sizeBytes") or 0)
            for r in doc.get("removed") or []
            if isinstance(r, dict) and r.get("key")
        }
        skipped = {
            str(r["key"]): str(r.get("reason") or "")
            for r in doc.get("skipped") or []
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
            int(doc.get("freedBytes") or 0),
            orphans_removed=frozenset(
                str(r["key"])
                for r in doc.get("removed") or []
                if isinstance(r, dict) and r.get("key") and r.get("orphan")
            ),
            orphans=orphans,
            orphan_count=int(doc.get("orphanCount") or len(orphans)),
            orphan_bytes=int(doc.get("orphanBytes") or 0),
            remaining_bytes=(
                int(doc["remainingBytes"]) if doc.get("remainingBytes") is not None else None
            ),
        )
    return None


__all__ = [
    "ClaimUse",
    "GcResult",
    "epoch",
    "keys_to_remove",
    "known_keys",
    "parse_gc_result",
]
