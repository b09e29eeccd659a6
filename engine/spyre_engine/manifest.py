"""``spyre_artifact_manifest.json``: what a finished artifact dir holds, checked before serving.

Precompile writes the manifest as its very last step, after the graphs and the catalog entry:
every regular file under the artifact dir with its size and sha256 (symlinks with their target),
written to a temp file and renamed, so the manifest exists only for a complete artifact. Serve
checks it before vLLM loads anything: a missing manifest (a compile that never finished), a
missing or truncated file (a half-written dir, a partial copy) or a checksum mismatch (a
corrupt file) refuses to start with reason ``ArtifactCorrupt`` instead of loading garbage or, for
inductor, compiling on the serving path.

Left out: the engine's own bookkeeping (the catalog, which serve parses anyway, its lock, the
writer lock, temp files) and anything that is not a regular file or a symlink (vLLM's dead IPC
sockets).
Files present but not listed are logged, not refused: a later precompile of another shape into
the same dir may add files while this artifact is served. The operator never does that (one
dir per artifact key), so the manifest is always the one of the last precompile that finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from spyre_engine.catalog import CATALOG_FILENAME, LOCK_FILENAME, write_json_atomically

log = logging.getLogger(__name__)

MANIFEST_FILENAME = "spyre_artifact_manifest.json"
#: Held by every precompile while it writes the dir (spyre_engine.gc.writing).
WRITER_LOCK_FILENAME = ".spyre-writer.lock"
MANIFEST_FORMAT = 1
_TEMP_PREFIXES = (".catalog-", ".manifest-")
_CHUNK = 1 << 20

#: How much serve checks: sizes and checksums, sizes only (cheap on tens of GB), nothing.
VerifyMode = Literal["checksums", "sizes", "off"]


class ArtifactCorrupt(Exception):
    """The artifact dir does not match its manifest, or has none."""


def manifest_path(artifact_dir: Path) -> Path:
    """Where the manifest of ``artifact_dir`` lives."""
    return Path(artifact_dir) / MANIFEST_FILENAME


def _excluded(rel: str) -> bool:
    if rel in (CATALOG_FILENAME, LOCK_FILENAME, MANIFEST_FILENAME, WRITER_LOCK_FILENAME):
        return True
    name = rel.rsplit("/", 1)[-1]
    return "/" not in rel and name.startswith(_TEMP_PREFIXES) and name.endswith(".tmp")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _walk(artifact_dir: Path) -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every file the manifest covers, sorted."""
    out = []
    for root, dirs, files in os.walk(artifact_dir):
        # A symlink to a directory is listed among dirs (and not descended into): a link too.
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        for name in [*files, *links]:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, artifact_dir).replace(os.sep, "/")
            if _excluded(rel):
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                out.append((rel, st))
    return sorted(out)


def build_manifest(artifact_dir: Path) -> dict[str, Any]:
    """The manifest of ``artifact_dir`` as it is now."""
    artifact_dir = Path(artifact_dir)
    files: list[dict[str, Any]] = []
    total = 0
    for rel, st in _walk(artifact_dir):
        if stat.S_ISLNK(st.st_mode):
            files.append({"path": rel, "link": os.readlink(artifact_dir / rel)})
            continue
        files.append({"path": rel, "size": st.st_size, "sha256": sha256_file(artifact_dir / rel)})
        total += st.st_size
    return {"format": MANIFEST_FORMAT, "files": files, "totalBytes": total}


def write_manifest(artifact_dir: Path) -> dict[str, Any]:
    """Build the manifest and put it in place atomically (temp file, fsync, rename); returns it."""
    artifact_dir = Path(artifact_dir)
    doc = build_manifest(artifact_dir)
    write_json_atomically(manifest_path(artifact_dir), doc, indent=1, temp_prefix=".manifest-")
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(artifact_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return doc


def read_manifest(artifact_dir: Path) -> dict[str, Any]:
    """The manifest; raises ArtifactCorrupt when it is missing or malformed."""
    path = manifest_path(artifact_dir)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ArtifactCorrupt(
            f"{path} is missing: the precompile that wrote this artifact did not finish (or the "
            "artifact was copied without it); precompile again"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ArtifactCorrupt(f"{path} is unreadable or truncated: {exc}") from exc
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and isinstance(f.get("path"), str) for f in files
    ):
        raise ArtifactCorrupt(f"{path} is not a manifest (no list of files)")
    return doc  # type: ignore[no-any-return]


@dataclass
class Problems:
    """What differs between an artifact dir and its manifest."""

    missing: list[str] = field(default_factory=list)
    wrong_size: list[str] = field(default_factory=list)
    wrong_checksum: list[str] = field(default_factory=list)
    wrong_link: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)

    @property
    def bad(self) -> list[str]:
        """Every listed file that is not as recorded."""
        return self.missing + self.wrong_size + self.wrong_checksum + self.wrong_link

    def describe(self, limit: int = 3) -> str:
        """One line naming the first few problems of each kind."""
        parts = []
        for label, items in (
            ("missing", self.missing),
            ("truncated or resized", self.wrong_size),
            ("checksum mismatch", self.wrong_checksum),
            ("symlink changed", self.wrong_link),
        ):
            if items:
                more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
                parts.append(f"{label}: {', '.join(items[:limit])}{more}")
        return "; ".join(parts)


def compare(artifact_dir: Path, doc: dict[str, Any], mode: VerifyMode = "checksums") -> Problems:
    """Check every file the manifest lists (sizes, and checksums unless ``mode`` is sizes)."""
    artifact_dir = Path(artifact_dir)
    problems = Problems()
    listed = set()
    for entry in doc.get("files") or []:
        rel = entry["path"]
        listed.add(rel)
        full = artifact_dir / rel
        try:
            st = os.lstat(full)
        except OSError:
            problems.missing.append(rel)
            continue
        if "link" in entry:
            try:
                target = os.readlink(full)
            except OSError:
                target = None
            if target != entry["link"]:
                problems.wrong_link.append(rel)
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.get("size"):
            problems.wrong_size.append(rel)
            continue
        if mode == "checksums":
            try:
                digest = sha256_file(full)
            except OSError:  # removed while we read (gc): missing, not an error
                problems.missing.append(rel)
                continue
            if digest != entry.get("sha256"):
                problems.wrong_checksum.append(rel)
    problems.unlisted = [rel for rel, _ in _walk(artifact_dir) if rel not in listed]
    return problems


def verify(artifact_dir: Path, mode: VerifyMode = "checksums") -> dict[str, Any]:
    """Check ``artifact_dir`` against its manifest; returns the manifest, or raises
    ArtifactCorrupt naming what is missing, truncated or changed."""
    if mode == "off":
        return {}
    doc = read_manifest(artifact_dir)
    problems = compare(artifact_dir, doc, mode)
    if problems.bad:
        raise ArtifactCorrupt(
            f"{artifact_dir} does not match {MANIFEST_FILENAME} ({len(problems.bad)} of "
            f"{len(doc['files'])} files): {problems.describe()}; the artifact is incomplete or "
            "corrupt: precompile again"
        )
    if problems.unlisted:
        log.warning(
            "%d file(s) in %s are not in the manifest (not checked): %s",
            len(problems.unlisted),
            artifact_dir,
            ", ".join(problems.unlisted[:5]),
        )
    return doc


def remove_damaged(artifact_dir: Path) -> list[str]:
    """Before compiling into a dir again: drop the manifest and every file it lists that is
    missing, truncated or changed, so the compile writes them anew instead of reusing them.
    Returns the removed paths; nothing happens without a manifest."""
    artifact_dir = Path(artifact_dir)
    try:
        doc = read_manifest(artifact_dir)
    except ArtifactCorrupt:
        return []
    problems = compare(artifact_dir, doc, "checksums")
    removed = []
    for rel in problems.wrong_size + problems.wrong_checksum + problems.wrong_link:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(artifact_dir / rel)
            removed.append(rel)
    if problems.bad:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(manifest_path(artifact_dir))
    return removed


__all__ = [
    "MANIFEST_FILENAME",
    "ArtifactCorrupt",
    "Problems",
    "VerifyMode",
    "build_manifest",
    "compare",
    "manifest_path",
    "read_manifest",
    "remove_damaged",
    "sha256_file",
    "verify",
    "write_manifest",
]
