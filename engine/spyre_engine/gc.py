"""``spyre-engine usage`` and ``spyre-engine gc``: what the artifacts use on a cache volume, and
removing unused ones so that nobody sees half of one.

Layout: ``<cache-root>/artifacts/<key>/`` (what the operator mounts at ``/cache``). The engine
owns the artifact format, so it also owns removal; which keys are unused is the operator's
decision (reference counting across every SpyreModel and Deployment on the claim), passed as
``--remove``.

Removal of one artifact, in this order:

1. take the dir's writer lock exclusively, without waiting: every precompile holds it shared
   for its whole run (:func:`writing`), so a dir a precompile is writing is skipped, never
   touched;
2. remove the catalog (rename + unlink: a reader sees the whole catalog or none), so a server
   starting now refuses with ``ArtifactMismatch`` instead of loading;
3. remove the manifest, so a reader past step 2 refuses with ``ArtifactCorrupt``;
4. rename the dir to ``<cache-root>/artifacts/.trash-<key>-<pid>`` (atomic on one filesystem),
   release the lock, then delete the trash. Trash left by a killed gc is deleted by the next.

A precompile that starts meanwhile waits for the lock, notices that its lock file was moved to
the trash, and takes the lock of a fresh dir at the original path instead (:func:`writing`).

Orphans (``--orphans-unused-for``): the operator only knows the artifacts its SpyreModels list
in their status; those of a deleted SpyreModel (or of a precompile run by hand) are on the
volume only. With ``--keep`` (every key the operator still knows) a gc also sweeps the others:
the first gc that finds a dir unknown records when, in ``artifacts/.gc-orphans.json`` on the
volume itself (so an operator restart loses nothing), and a later one removes it once it has
been unknown that long. A dir known again (a SpyreModel of that shape came back) leaves the
record; a dir a precompile is writing is never an orphan.

What gc removed is recorded on the volume too, in ``artifacts/.gc-removed.json`` (``{key: removed
at}``, the newest :data:`MAX_REMOVED_RECORDED`), and every summary reports the newest
:data:`MAX_REMOVED_REPORTED` of it (``removedRecord``): the operator learns of a removal from any
later gc even when the Job that removed it went before it was read (its TTL while the operator
was down, a cleanup of finished Jobs), and stops trusting its memory of that artifact.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import spyre_contract as contract

from spyre_engine.catalog import CATALOG_FILENAME, write_json_atomically
from spyre_engine.disk import TRASH_PREFIX, directory_size, empty_trash
from spyre_engine.inuse import InUseUnknown
from spyre_engine.manifest import MANIFEST_FILENAME, WRITER_LOCK_FILENAME
from spyre_engine.weights import HUB_DIR, ModelRef, ModelsInUse, WeightsResult, sweep_models
from spyre_engine.weights import RECORD_FILENAME as MODELS_RECORD_FILENAME
from spyre_engine.weights import sweep_trash as sweep_hub_trash

ARTIFACTS_DIR = "artifacts"
WRITER_LOCK = WRITER_LOCK_FILENAME
#: When each orphan was first found unknown: {key: unix seconds}.
ORPHANS_FILENAME = ".gc-orphans.json"
#: Pending orphans listed in the summary (the termination message holds 4 KiB).
MAX_LISTED_ORPHANS = 10
#: What gc removed, with when: {key: "YYYY-MM-DDTHH:MM:SSZ"} (UTC).
REMOVED_FILENAME = ".gc-removed.json"
#: Removals kept on the volume, and reported in each summary (newest first).
MAX_REMOVED_RECORDED = 64
MAX_REMOVED_REPORTED = 16
#: The operator's keys are 32 hex digits; a longer name in the record is not one of them.
MAX_KEY_LENGTH = 64
#: What the kubelet keeps of a termination message.
TERMINATION_MESSAGE_BYTES = 4096


def fit_summary(doc: dict[str, Any], limit: int = TERMINATION_MESSAGE_BYTES) -> str:
    """``doc`` as one JSON line of at most ``limit`` bytes: the oldest entries of the removal
    record, then of the pending orphans, are left out until it fits (the kubelet cuts a longer
    message, and a cut line parses as nothing)."""
    doc = dict(doc)
    while True:
        line = json.dumps(doc, separators=(",", ":"))
        if len(line.encode()) < limit:
            return line
        for name in ("removedRecord", "orphans", "modelsPending", "modelsSkipped"):
            items = doc.get(name)
            if items:
                left = list(items.items() if isinstance(items, dict) else items)[:-1]
                doc[name] = dict(left) if isinstance(items, dict) else left
                break
        else:
            return line
#: Why a key was kept when what is in use could not be told.
UNKNOWN_REASON = "could not tell whether it is in use: nothing removed"
#: ``in_use(key)``: why the key is in use right now (None: unused); see inuse.py.
InUse = Callable[[str], str | None]


class InvalidKey(ValueError):
    """A key that is not a plain directory name under ``artifacts/``."""


def artifacts_root(cache_root: Path) -> Path:
    """``<cache-root>/artifacts``."""
    return Path(cache_root) / ARTIFACTS_DIR


def check_key(key: str) -> str:
    """``key`` if it names a dir directly under artifacts/ (no ``/``, ``..`` or dot-files)."""
    if not key or "/" in key or "\0" in key or key.startswith(".") or key in ("..",):
        raise InvalidKey(f"not an artifact key: {key!r}")
    return key


@contextlib.contextmanager
def writing(artifact_dir: Path) -> Iterator[None]:
    """Hold ``artifact_dir``'s writer lock (shared: precompiles of several shapes may write one
    dir together) while compiling into it; gc skips a dir whose lock it cannot take.

    If gc moved the dir to the trash while we waited, the lock we got is the trash's: take the
    lock of the fresh dir at the original path instead.
    """
    artifact_dir = Path(artifact_dir)
    while True:
        artifact_dir.mkdir(parents=True, exist_ok=True)
        path = artifact_dir / WRITER_LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                try:
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                return
        finally:
            os.close(fd)


def being_written(artifact_dir: Path) -> bool:
    """True while a precompile holds the dir's writer lock."""
    path = Path(artifact_dir) / WRITER_LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def usage(cache_root: Path) -> dict[str, Any]:
    """Every artifact dir with its size, whether it is complete (has a manifest) and whether a
    precompile is writing it; their total; the volume's size and free space."""
    root = artifacts_root(cache_root)
    artifacts, trash = [], 0
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.name.startswith(TRASH_PREFIX):
                trash += directory_size(Path(entry.path))
                continue
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            artifacts.append(
                {
                    "key": entry.name,
                    "sizeBytes": directory_size(path),
                    "complete": (path / MANIFEST_FILENAME).is_file(),
                    "writing": being_written(path),
                }
            )
    out: dict[str, Any] = {
        "artifacts": artifacts,
        "totalBytes": sum(a["sizeBytes"] for a in artifacts),
        "trashBytes": trash,
    }
    hub = Path(cache_root) / HUB_DIR
    if hub.is_dir():
        out["weightsBytes"] = directory_size(hub)  # downloaded models, beside the artifacts
    with contextlib.suppress(OSError):
        st = os.statvfs(cache_root)
        out["volumeBytes"] = st.f_blocks * st.f_frsize
        out["freeBytes"] = st.f_bavail * st.f_frsize
    return out


@dataclass
class GcResult:
    """What one gc run removed and what it left, and why."""

    removed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    trash_bytes: int = 0
    #: Orphans not due yet: key, since (unix seconds), sizeBytes; oldest first.
    orphans: list[dict[str, Any]] = field(default_factory=list)
    #: Why what is in use could not be told (then nothing more was removed).
    in_use_unknown: str | None = None
    #: The volume's record of removals, this run's included: {key: when}, newest first.
    removed_record: dict[str, str] = field(default_factory=dict)
    #: The sweep of downloaded models (hub/), when the operator asked for one.
    weights: WeightsResult | None = None

    @property
    def freed_bytes(self) -> int:
        """Bytes freed: the removed artifacts plus leftover trash."""
        return sum(int(r["sizeBytes"]) for r in self.removed) + self.trash_bytes

    def to_dict(self) -> dict[str, Any]:
        """camelCase, for the termination log."""
        doc: dict[str, Any] = {
            contract.REMOVED: self.removed,
            contract.SKIPPED: self.skipped,
            contract.FREED_BYTES: self.freed_bytes,
        }
        if self.in_use_unknown:
            doc["inUseUnknown"] = self.in_use_unknown
        if self.removed_record:
            doc["removedRecord"] = dict(list(self.removed_record.items())[:MAX_REMOVED_REPORTED])
        if self.orphans:
            doc["orphans"] = self.orphans[:MAX_LISTED_ORPHANS]
            doc["orphanCount"] = len(self.orphans)
            doc["orphanBytes"] = sum(int(o["sizeBytes"]) for o in self.orphans)
        if self.weights is not None:
            doc.update(self.weights.to_dict())
        return doc


def _unlink_atomically(path: Path) -> None:
    """Remove ``path`` so that a reader sees the whole file or none (rename, then unlink)."""
    gone = path.with_name(f".{path.name}.removed-{os.getpid()}.tmp")
    try:
        os.replace(path, gone)
    except FileNotFoundError:
        return
    os.unlink(gone)


def remove_artifact(
    cache_root: Path, key: str, in_use: InUse | None = None
) -> tuple[int | None, str]:
    """Remove one artifact (see the module docstring): (bytes freed, what happened); bytes is
    None when it was skipped. ``in_use`` is asked once the lock is held, right before the
    removal (raises InUseUnknown when it cannot tell: nothing is removed)."""
    art = artifacts_root(cache_root) / check_key(key)
    if not art.is_dir():
        return None, "absent"
    lock = art / WRITER_LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return None, "a precompile is writing it"
            raise
        why = in_use(key) if in_use is not None else None
        if why:
            return None, why
        size = directory_size(art)
        _unlink_atomically(art / CATALOG_FILENAME)
        _unlink_atomically(art / MANIFEST_FILENAME)
        trash = art.with_name(f"{TRASH_PREFIX}{key}-{os.getpid()}")
        os.rename(art, trash)
    finally:
        os.close(fd)  # releases the lock
    shutil.rmtree(trash, ignore_errors=True)
    return size, "removed"


def sweep_trash(cache_root: Path) -> int:
    """Delete what a killed gc left in the trash; bytes freed."""
    return empty_trash(artifacts_root(cache_root))


def _json_object(path: Path) -> dict[Any, Any]:
    """A JSON object gc keeps on the volume; ``{}`` when absent, unreadable or not an object."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _read_orphans(root: Path) -> dict[str, float]:
    doc = _json_object(root / ORPHANS_FILENAME)
    return {str(k): float(v) for k, v in doc.items() if isinstance(v, int | float)}


def sweep_orphans(
    cache_root: Path,
    known: set[str],
    unused_for: float,
    now: float,
    result: GcResult,
    in_use: InUse | None = None,
) -> None:
    """Record the dirs not in ``known`` and remove those recorded ``unused_for`` seconds ago
    (see the module docstring); what it did goes into ``result``."""
    root = artifacts_root(cache_root)
    if not root.is_dir():
        return
    seen = _read_orphans(root)
    record: dict[str, float] = {}
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        key = entry.name
        if key.startswith(".") or key in known or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if being_written(path):
            continue  # a precompile the operator did not know of when it started this gc
        since = seen.get(key, now)
        if now - since >= unused_for:
            size, what = remove_artifact(cache_root, key, in_use)
            if size is not None:
                result.removed.append({"key": key, "sizeBytes": size, "orphan": True})
                continue
            result.skipped.append({"key": key, "reason": what})
        record[key] = since
        result.orphans.append({"key": key, "since": int(since), "sizeBytes": directory_size(path)})
    result.orphans.sort(key=lambda o: (o["since"], o["key"]))
    if record != seen:
        write_json_atomically(root / ORPHANS_FILENAME, record, 0, ".gc-orphans-")


def _sweep_weights(
    cache_root: Path,
    keep: list[ModelRef],
    unused_for: float,
    now: float,
    in_use: ModelsInUse | None,
) -> WeightsResult:
    """weights.sweep_models with its record on the volume (artifacts/.gc-models.json)."""
    root = artifacts_root(cache_root)
    seen = {str(k): float(v) for k, v in _json_object(root / MODELS_RECORD_FILENAME).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip
    result, record = sweep_models(cache_root, keep, unused_for, now, seen, in_use)
    if record != seen and (record or seen):
        with contextlib.suppress(OSError):
            root.mkdir(parents=True, exist_ok=True)
            write_json_atomically(root / MODELS_RECORD_FILENAME, record, 0, ".gc-models-")
    return result


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def read_removed(root: Path) -> dict[str, str]:
    """The volume's record of removals, newest first; unreadable or malformed: what parses
    (anything on a claim is anyone's: keys must be keys, times must be times)."""
    out = {}
    for k, v in _json_object(root / REMOVED_FILENAME).items():
        try:
            check_key(str(k))
            time.strptime(str(v), "%Y-%m-%dT%H:%M:%SZ")
        except (InvalidKey, ValueError):
            continue
        if len(str(k)) > MAX_KEY_LENGTH or len(str(v)) != len("YYYY-MM-DDTHH:MM:SSZ"):
            continue
        out[str(k)] = str(v)
    return dict(sorted(out.items(), key=lambda kv: (kv[1], kv[0]), reverse=True))


def record_removed(cache_root: Path, keys: list[str], now: float) -> dict[str, str]:
    """Add ``keys`` removed at ``now`` to the volume's record (newest
    :data:`MAX_REMOVED_RECORDED` kept); the record, newest first. Unwritable: the record
    as it would be (the summary still reports this run's removals)."""
    root = artifacts_root(cache_root)
    record = read_removed(root)
    if keys:
        when = _utc(now)
        record = {**{k: when for k in keys}, **{k: v for k, v in record.items() if k not in keys}}
        record = dict(sorted(record.items(), key=lambda kv: (kv[1], kv[0]),
                             reverse=True)[:MAX_REMOVED_RECORDED])  # fmt: skip
        with contextlib.suppress(OSError):
            write_json_atomically(root / REMOVED_FILENAME, record, 0, ".gc-removed-")
    return record


def gc(
    cache_root: Path,
    keys: list[str],
    keep: list[str] | None = None,
    orphans_unused_for: float | None = None,
    now: float | None = None,
    in_use: InUse | None = None,
    keep_models: list[ModelRef] | None = None,
    models_in_use: ModelsInUse | None = None,
) -> GcResult:
    """Remove the artifacts ``keys`` (those a precompile writes, and with ``in_use`` those in
    use right now, are skipped) and old trash; with ``orphans_unused_for``, also sweep the
    dirs in neither ``keys`` nor ``keep``, and with ``keep_models`` too, the downloaded models
    (weights.py: ``models_in_use`` is their live check). If what is in use cannot be told,
    nothing more is removed: the rest is skipped and ``result.in_use_unknown`` says why."""
    result = GcResult(trash_bytes=sweep_trash(cache_root) + sweep_hub_trash(cache_root))
    try:
        for i, key in enumerate(keys):
            try:
                size, what = remove_artifact(cache_root, key, in_use)
            except InvalidKey as exc:
                result.skipped.append({"key": key, "reason": str(exc)})
                continue
            except InUseUnknown:
                result.skipped += [{"key": k, "reason": UNKNOWN_REASON} for k in keys[i:]]
                raise
            if size is None:
                result.skipped.append({"key": key, "reason": what})
            else:
                result.removed.append({"key": key, "sizeBytes": size})
        if orphans_unused_for is not None:
            known = set(keep or ()) | set(keys)
            when = time.time() if now is None else now
            sweep_orphans(cache_root, known, orphans_unused_for, when, result, in_use)
            if keep_models is not None:
                result.weights = _sweep_weights(
                    cache_root, keep_models, orphans_unused_for, when, models_in_use)
    except InUseUnknown as exc:
        result.in_use_unknown = str(exc)
    result.removed_record = record_removed(
        cache_root, [r["key"] for r in result.removed], time.time() if now is None else now)
    return result


__all__ = [
    "ARTIFACTS_DIR",
    "HUB_DIR",
    "GcResult",
    "InvalidKey",
    "being_written",
    "check_key",
    "gc",
    "remove_artifact",
    "sweep_orphans",
    "sweep_trash",
    "usage",
    "writing",
]
