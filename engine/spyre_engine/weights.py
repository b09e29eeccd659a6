"""Downloaded models on a cache claim: what ``spyre-engine gc`` removes of ``hub/`` (issue 47, 1).

``hf://`` models download into ``<cache-root>/hub`` (Hugging Face's cache layout:
``models--ORG--NAME/`` holding ``refs/<branch>`` (a commit), ``snapshots/<commit>/`` (symlinks)
and ``blobs/`` (the files)), beside ``artifacts/``. Without collection every model ever served
stays there, and every revision a branch moved to adds a copy.

A gc with ``--keep-models`` (the models the operator's SpyreModels on the claim name: their
spec, what they serve and what they last served well) sweeps ``hub/``:

* a **model** folder no kept model names is timed like an orphan artifact: the first gc that
  finds it records when (``artifacts/.gc-models.json``, on the volume) and a gc once it has been
  unnamed ``--orphans-unused-for`` seconds removes it (renamed to ``hub/.trash-*``, then
  deleted), with its download locks;
* a **snapshot** of a kept model is timed the same way when neither a branch the model's
  ``refs/`` points at nor a revision kept by commit is its commit (an old ``@main``); when it
  goes, the blobs only it used go with it (never a blob nothing referenced before: that is a
  download in progress).

Right before removing anything of a model, the GC pod asks the API server what uses it now
(inuse.py: a pod, unfinished Job or Deployment of the namespace that mounts the claim and runs
``--model hf://ORG/NAME[@REV]``): a model in use is kept whole while an unfinished Job downloads
it, and otherwise keeps the snapshots its users' revisions resolve to. If that cannot be told,
nothing is removed. Anything on the claim is read as hostile: folders that are symlinks, names
that are not Hugging Face's, unreadable refs and records are left alone or ignored, and nothing
outside ``hub/`` is touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spyre_engine.disk import TRASH_PREFIX, directory_size, empty_trash

#: Where ``hf://`` models download on the cache claim (the operator's plan.HF_CACHE_DIR, under
#: the cache root; tests/engine/test_gc.py compares them).
HUB_DIR = "hub"
#: When each unnamed model folder or snapshot was first found: {"models--o--n": unix s,
#: "models--o--n/snapshots/<commit>": unix s}; under artifacts/, beside gc's other records.
RECORD_FILENAME = ".gc-models.json"
#: Pending removals listed in the summary (the termination message holds 4 KiB).
MAX_LISTED = 8
#: Hugging Face's repo ids: ``org/name`` of these characters (huggingface_hub validates the
#: same), and revisions as the CRD allows them.
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+$")
_REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,255}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class ModelRef:
    """A downloaded model: its repo id and the revision asked for (None: the default branch)."""

    repo: str
    revision: str | None = None

    @property
    def folder(self) -> str:
        """The model's folder under hub/, as huggingface_hub names it."""
        return repo_folder(self.repo)


def repo_folder(repo: str) -> str:
    """``models--ORG--NAME``: huggingface_hub's own name for a model's cache folder."""
    from huggingface_hub.file_download import repo_folder_name

    return str(repo_folder_name(repo_id=repo, repo_type="model"))


def parse_ref(value: str) -> ModelRef | None:
    """``[hf://]ORG/NAME[@REVISION]`` as a ModelRef, or None if it is not one."""
    text = value.strip()
    text = text[len("hf://"):] if text.startswith("hf://") else text
    repo, at, revision = text.partition("@")
    repo = repo.strip("/")
    if not _REPO.match(repo) or ".." in repo or (at and not _REVISION.match(revision)):
        return None
    return ModelRef(repo, revision or None)


def model_args(args: Iterable[Any]) -> list[ModelRef]:
    """The ``hf://`` models a container's argv names with ``--model`` (``--model X`` or
    ``--model=X``); anything else is not a model."""
    out: list[ModelRef] = []
    items = [a for a in args if isinstance(a, str)]
    for i, a in enumerate(items):
        value = a[len("--model="):] if a.startswith("--model=") else (
            items[i + 1] if a == "--model" and i + 1 < len(items) else None)
        if value and value.startswith("hf://"):
            ref = parse_ref(value)
            if ref is not None:
                out.append(ref)
    return out


def pod_models(pod_spec: dict[str, Any]) -> list[ModelRef]:
    """The ``hf://`` models any container of a pod spec runs."""
    out: list[ModelRef] = []
    for c in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]:
        if isinstance(c, dict):
            out += model_args([*(c.get("command") or []), *(c.get("args") or [])])
    return out


@dataclass
class ModelUse:
    """What uses a model folder now: who, whether one of them may be downloading it (an
    unfinished Job), and the revisions they asked for (None: the default branch)."""

    users: list[str] = field(default_factory=list)
    downloading: bool = False
    revisions: set[str | None] = field(default_factory=set)


#: ``models_in_use()``: {folder: ModelUse} right now (raises InUseUnknown when it cannot tell).
ModelsInUse = Callable[[], dict[str, ModelUse]]


@dataclass
class WeightsResult:
    """What a sweep of hub/ removed, kept and left pending."""

    removed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)

    @property
    def freed_bytes(self) -> int:
        return sum(int(r["sizeBytes"]) for r in self.removed)

    def to_dict(self) -> dict[str, Any]:
        """camelCase, inside gc's summary."""
        doc: dict[str, Any] = {}
        if self.removed:
            doc["modelsRemoved"] = self.removed[:MAX_LISTED]
            doc["modelsFreedBytes"] = self.freed_bytes
        if self.skipped:
            doc["modelsSkipped"] = self.skipped[:MAX_LISTED]
        if self.pending:
            doc["modelsPending"] = self.pending[:MAX_LISTED]
            doc["modelsPendingCount"] = len(self.pending)
        return doc


def _read_text(path: Path, limit: int = 256) -> str | None:
    """A small regular file's text (a ref), or None."""
    try:
        if not path.is_file() or path.is_symlink():
            return None
        with path.open("rb") as f:
            return f.read(limit).decode("ascii", "replace").strip()
    except OSError:
        return None


def refs(folder: Path) -> dict[str, str]:
    """The model's ``refs/``: {branch: commit} (only well-formed commits)."""
    out: dict[str, str] = {}
    base = folder / "refs"
    if base.is_symlink() or not base.is_dir():
        return out
    for root, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for name in files:
            path = Path(root) / name
            commit = _read_text(path)
            if commit and _COMMIT.match(commit):
                out[str(path.relative_to(base))] = commit
    return out


def wanted_commits(folder: Path, revisions: Iterable[str | None]) -> set[str]:
    """The snapshots ``revisions`` resolve to in ``folder``: a commit itself, else the commit
    its ref names (None: ``main``). Every commit a ref points at is wanted too: it is what
    the branch means now."""
    branch = refs(folder)
    out = set(branch.values())
    for rev in revisions:
        rev = rev or "main"
        if _COMMIT.match(rev):
            out.add(rev)
        elif rev in branch:
            out.add(branch[rev])
    return out


def _links(snapshot: Path) -> set[str]:
    """The blob names the snapshot's symlinks point at (``../../blobs/<name>``)."""
    out: set[str] = set()
    for root, dirs, files in os.walk(snapshot):
        for name in [*files, *dirs]:
            path = os.path.join(root, name)
            if os.path.islink(path):
                target = os.readlink(path)
                if "/blobs/" in target:
                    out.add(os.path.basename(target))
    return out


def _snapshots(folder: Path) -> dict[str, Path]:
    base = folder / "snapshots"
    if base.is_symlink() or not base.is_dir():
        return {}
    return {e.name: Path(e.path) for e in os.scandir(base)
            if _COMMIT.match(e.name) and e.is_dir(follow_symlinks=False)}  # fmt: skip


def _trash(path: Path, hub: Path) -> None:
    """Move ``path`` out of the way atomically (a reader sees it whole or not at all), then
    delete it."""
    gone = hub / f"{TRASH_PREFIX}{path.name}-{os.getpid()}"
    os.rename(path, gone)
    shutil.rmtree(gone, ignore_errors=True)


def sweep_trash(cache_root: Path) -> int:
    """Delete what a killed gc left in hub/'s trash; bytes freed."""
    with contextlib.suppress(NotADirectoryError):
        return empty_trash(Path(cache_root) / HUB_DIR)
    return 0


def sweep_models(
    cache_root: Path,
    keep: Iterable[ModelRef],
    unused_for: float,
    now: float,
    seen: dict[str, float],
    in_use: ModelsInUse | None = None,
) -> tuple[WeightsResult, dict[str, float]]:
    """Sweep hub/ (see the module docstring): the result and the new record ({unit: first
    found unnamed}). ``in_use`` is asked once, before the first removal."""
    result, record = WeightsResult(), dict[str, float]()
    hub = Path(cache_root) / HUB_DIR
    if hub.is_symlink() or not hub.is_dir():
        return result, record
    kept: dict[str, set[str | None]] = {}
    for ref in keep:
        kept.setdefault(ref.folder, set()).add(ref.revision)
    live: dict[str, ModelUse] | None = None

    def use(folder: str) -> ModelUse | None:
        nonlocal live
        if live is None:
            live = in_use() if in_use is not None else {}
        return live.get(folder)

    for entry in sorted(os.scandir(hub), key=lambda e: e.name):
        if not entry.name.startswith("models--") or not entry.is_dir(follow_symlinks=False):
            continue
        folder = Path(entry.path)
        if entry.name not in kept:
            unit = entry.name
            since = seen.get(unit, now)
            if now - since >= unused_for:
                who = use(unit)
                if who is None or not who.users:
                    size = directory_size(folder)
                    _trash(folder, hub)
                    with contextlib.suppress(OSError):
                        shutil.rmtree(hub / ".locks" / unit)
                    result.removed.append({"model": unit, "sizeBytes": size})
                    continue
                result.skipped.append({"model": unit, "reason": _in_use(who)})
            record[unit] = since
            result.pending.append({"model": unit, "since": int(since),
                                   "sizeBytes": directory_size(folder)})  # fmt: skip
            continue
        _sweep_snapshots(folder, hub, kept[entry.name], unused_for, now, seen, record, result, use)
    result.pending.sort(key=lambda p: (p["since"], p["model"]))
    return result, record


def _sweep_snapshots(
    folder: Path,
    hub: Path,
    revisions: set[str | None],
    unused_for: float,
    now: float,
    seen: dict[str, float],
    record: dict[str, float],
    result: WeightsResult,
    use: Callable[[str], ModelUse | None],
) -> None:
    """The old snapshots of a kept model folder, and the blobs only they used."""
    snaps = _snapshots(folder)
    wanted = wanted_commits(folder, revisions)
    old = sorted(c for c in snaps if c not in wanted)
    due = []
    for commit in old:
        unit = f"{folder.name}/snapshots/{commit}"
        since = seen.get(unit, now)
        if now - since >= unused_for:
            due.append(commit)
        else:
            record[unit] = since
            result.pending.append({"model": unit, "since": int(since),
                                   "sizeBytes": directory_size(snaps[commit])})  # fmt: skip
    if not due:
        return
    who = use(folder.name)
    if who is not None and who.downloading:
        for commit in due:  # a download may be writing blobs no snapshot links yet
            unit = f"{folder.name}/snapshots/{commit}"
            record[unit] = seen.get(unit, now)
            result.skipped.append({"model": unit, "reason": _in_use(who)})
        return
    serving = wanted_commits(folder, who.revisions) if who is not None else set()
    before = set().union(*(_links(p) for p in snaps.values()))
    gone = []
    for commit in due:
        unit = f"{folder.name}/snapshots/{commit}"
        if commit in serving:
            record[unit] = seen.get(unit, now)
            result.skipped.append({"model": unit, "reason": _in_use(who)})  # type: ignore[arg-type]
            continue
        with contextlib.suppress(OSError):
            _trash(snaps[commit], hub)
            gone.append(commit)
    after = set().union(*(_links(p) for c, p in snaps.items() if c not in gone))
    blobs = folder / "blobs"
    freed = 0
    if gone and not blobs.is_symlink() and blobs.is_dir():
        for name in sorted(before - after):
            path = blobs / name
            if "/" in name or name.startswith(".") or not path.is_file() or path.is_symlink():
                continue
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                path.unlink()
                freed += size
    for i, commit in enumerate(gone):
        result.removed.append({"model": f"{folder.name}/snapshots/{commit}",
                               "sizeBytes": freed if i == 0 else 0})  # fmt: skip


def _in_use(who: ModelUse) -> str:
    more = f" and {len(who.users) - 3} more" if len(who.users) > 3 else ""
    return f"in use by {', '.join(who.users[:3])}{more}"


__all__ = [
    "HUB_DIR",
    "ModelRef",
    "ModelUse",
    "WeightsResult",
    "model_args",
    "parse_ref",
    "pod_models",
    "repo_folder",
    "sweep_models",
    "sweep_trash",
]
