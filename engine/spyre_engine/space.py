"""Will a precompile's artifact fit on the cache claim? Asked before anything compiles.

A full claim used to be found by the compiler, minutes or hours in, with a message about a
write that failed somewhere in its own files. The best estimate of what an artifact will take is
what the same compile took before: the newest complete artifact on the claim compiled by the same
backend for the same catalog ``data`` (model, cards, shape), whatever its key (an engine or
plugin upgrade, another option, gives the same shape a new key: the common reason a claim must
hold two copies of everything). Its manifest's ``totalBytes`` times :data:`MARGIN`, less what the
target dir already holds (a recompile of the key overwrites it), must be free on the volume; if
not, the precompile stops with ``InsufficientCacheSpace`` naming both numbers and what to do.
With no such artifact there is no estimate and nothing is refused (logged).

Everything read here is a file on the claim: whatever a manifest or a catalog says, a malformed
one is skipped, never trusted as a size it does not state plainly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spyre_engine import catalog, manifest

log = logging.getLogger(__name__)

#: An artifact may come out somewhat larger than the last one of its shape (another compiler
#: version, another graph count); refusing a compile that would have fit costs a retry, letting
#: one run out of space mid-compile costs the compile.
MARGIN = 1.25
#: A manifest larger than this is not read (a real one lists files: kilobytes to a few MB).
_MANIFEST_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class Estimate:
    """The newest complete artifact of the same backend and shape: its key and size."""

    key: str
    size_bytes: int


def human(n: int) -> str:
    """Bytes in binary units, e.g. ``1.5 GiB``: the operator's decide.observed.human_size, word for
    word (tests/engine/test_space.py compares them: the two ship in separate images)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def _manifest_total(artifact_dir: Path) -> tuple[int, float] | None:
    """The manifest's ``totalBytes`` and the manifest's mtime, or None (none, unreadable,
    oversized, or not a plain non-negative integer)."""
    path = manifest.manifest_path(artifact_dir)
    try:
        st = path.stat()
        if not path.is_file() or st.st_size > _MANIFEST_MAX_BYTES:
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    total = doc.get("totalBytes") if isinstance(doc, dict) else None
    if type(total) is not int or total < 0:
        return None
    return total, st.st_mtime


def _same_compile(entries: list[dict[str, Any]], backend: str, data: Mapping[str, Any]) -> bool:
    return any(e.get("dynamo_backend") == backend and e.get("data") == data for e in entries)


def estimate(artifact: Path, backend: str, data: Mapping[str, Any]) -> Estimate | None:
    """The newest complete sibling of ``artifact`` (same parent) compiled by ``backend`` for
    catalog ``data``, or None."""
    best: tuple[float, Estimate] | None = None
    with contextlib.suppress(OSError):
        for entry in os.scandir(artifact.parent):
            if entry.name.startswith(".") or entry.name == artifact.name:
                continue
            if not entry.is_dir(follow_symlinks=False):
                continue
            sibling = Path(entry.path)
            try:  # the catalog first: small, and most siblings are other shapes
                entries = catalog.read_catalog(sibling)
            except catalog.CatalogError:
                continue
            if not _same_compile(entries, backend, data):
                continue
            total = _manifest_total(sibling)
            if total is None:
                continue  # no complete artifact
            if best is None or total[1] > best[0]:
                best = (total[1], Estimate(entry.name, total[0]))
    return None if best is None else best[1]


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem, or None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shortfall(
    needed: int, already: int, free: int | None
) -> int | None:
    """Bytes missing for an artifact of ``needed`` bytes (margin included) over a dir already
    holding ``already`` bytes, with ``free`` bytes free; None when it fits or free is unknown."""
    if free is None:
        return None
    missing = needed - already - free
    return missing if missing > 0 else None


def insufficient_space_message(
    est: Estimate, needed: int, free: int, claim_root: Path
) -> str:
    """What the precompile refuses with: the numbers, then what to do."""
    return (
        f"the artifact would not fit on the cache claim: the last artifact of this shape "
        f"({est.key}) took {human(est.size_bytes)}, {human(needed)} with a "
        f"{int((MARGIN - 1) * 100)}% margin, and {claim_root} has {human(free)} free. Grow "
        "the claim (cache.volume.size, where its StorageClass allows expansion; else a new "
        "cache.volume.name or your own PVC), or let "
        "garbage collection remove unused artifacts sooner (cache.volume.retention: keepLast, "
        "unusedForSeconds); then set the annotation serving.spyre.dev/retry-compile to retry"
    )
