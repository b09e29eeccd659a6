"""``spyre-engine gc`` and downloaded models (issue 47, 1): the claim's ``hub/`` is swept like
the artifacts beside it. The hub trees here are made by huggingface_hub itself
(``snapshot_download`` from tests/engine/hub.py's local stand-in for the Hub), so the layout
gc reads is the library's, and ``scan_cache_dir`` (the library's own reader) checks what is
left: no broken snapshot, no blob lost that a kept revision needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import scan_cache_dir, snapshot_download
from spyre_engine import gc, inuse, weights
from spyre_engine.inuse import InUseUnknown
from spyre_engine.weights import ModelRef, parse_ref

from tests.engine.hub import LocalHub, Repo

CONFIG = b'{"model_type": "granite"}'
DAY = 86400.0


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with LocalHub() as hub:
        yield hub


def _download(hub: LocalHub, cache: Path, repo: str, weights_bytes: bytes,
              revision: str | None = None) -> str:
    """Publish ``repo`` with these weights (a new commit when they change) and download it
    into ``cache``/hub as the precompile Job does; the commit."""
    hub.repos[repo] = Repo(files={"config.json": CONFIG, "model.safetensors": weights_bytes})
    path = snapshot_download(repo, revision=revision, cache_dir=cache / weights.HUB_DIR,
                             endpoint=hub.url, token=False)  # fmt: skip
    return Path(path).name


def _revisions(cache: Path, stray: str = "") -> dict[str, set[str]]:
    """What huggingface_hub itself reads in the hub: {repo: {commit}}; no warnings (but
    about the ``stray`` folder a test put there)."""
    info = scan_cache_dir(cache / weights.HUB_DIR)
    assert all(stray and stray in str(w) for w in info.warnings), info.warnings
    out = {r.repo_id: {rev.commit_hash for rev in r.revisions} for r in info.repos}
    for r in info.repos:
        for rev in r.revisions:
            for f in rev.files:  # every file of every revision left is whole
                assert f.blob_path.is_file(), f
    return out


def _sweep(cache: Path, keep: list[str], now: float, live: Any = None) -> gc.GcResult:
    refs = [r for r in (parse_ref(k) for k in keep) if r is not None]
    return gc.gc(cache, [], keep=[], orphans_unused_for=DAY, now=now, keep_models=refs,
                 models_in_use=live)  # fmt: skip


def test_a_model_no_spyremodel_names_is_removed_once_unnamed_for_the_retention(
    hub: LocalHub, tmp_path: Path
) -> None:
    _download(hub, tmp_path, "org/kept", b"a" * 1000)
    _download(hub, tmp_path, "org/gone", b"b" * 5000)
    locks = tmp_path / "hub" / ".locks" / "models--org--gone"
    assert locks.is_dir()  # huggingface_hub's download locks, removed with the model
    first = _sweep(tmp_path, ["org/kept"], now=1000.0)
    assert first.weights is not None and not first.weights.removed
    [pending] = first.weights.pending
    assert pending["model"] == "models--org--gone" and pending["since"] == 1000
    assert pending["sizeBytes"] >= 5000
    assert set(_revisions(tmp_path)) == {"org/kept", "org/gone"}
    # A day later, still unnamed: removed; the kept one untouched.
    second = _sweep(tmp_path, ["org/kept"], now=1000.0 + DAY)
    assert second.weights is not None
    assert [r["model"] for r in second.weights.removed] == ["models--org--gone"]
    assert second.weights.removed[0]["sizeBytes"] >= 5000
    assert set(_revisions(tmp_path)) == {"org/kept"} and not locks.exists()
    doc = second.to_dict()
    assert doc["modelsRemoved"][0]["model"] == "models--org--gone" and doc["modelsFreedBytes"]


def test_a_model_named_again_before_its_time_leaves_the_record(
    hub: LocalHub, tmp_path: Path
) -> None:
    _download(hub, tmp_path, "org/back", b"c" * 100)
    assert _sweep(tmp_path, [], now=0.0).weights.pending  # type: ignore[union-attr]
    assert _sweep(tmp_path, ["org/back@main"], now=DAY / 2).weights.pending == []  # type: ignore[union-attr]
    # unnamed again: the clock starts over, nothing is due a day after the first sighting
    again = _sweep(tmp_path, [], now=DAY)
    assert again.weights is not None and not again.weights.removed
    assert again.weights.pending[0]["since"] == int(DAY)


def test_an_old_revision_goes_with_the_blobs_only_it_used(hub: LocalHub, tmp_path: Path) -> None:
    """A branch that moved: the old snapshot's weights go, the config both share stays."""
    old = _download(hub, tmp_path, "org/m", b"1" * 4000)
    new = _download(hub, tmp_path, "org/m", b"2" * 4000)
    assert old != new and _revisions(tmp_path) == {"org/m": {old, new}}
    blobs = tmp_path / "hub" / "models--org--m" / "blobs"
    assert len(list(blobs.iterdir())) == 3  # the shared config, two weights files
    pending = _sweep(tmp_path, ["org/m"], now=0.0).weights
    assert pending is not None and [p["model"] for p in pending.pending] == [
        f"models--org--m/snapshots/{old}"]
    done = _sweep(tmp_path, ["org/m"], now=DAY).weights
    assert done is not None and [r["model"] for r in done.removed] == [
        f"models--org--m/snapshots/{old}"]
    assert done.freed_bytes == 4000
    assert _revisions(tmp_path) == {"org/m": {new}} and len(list(blobs.iterdir())) == 2


def test_a_revision_kept_by_commit_or_served_stays(hub: LocalHub, tmp_path: Path) -> None:
    old = _download(hub, tmp_path, "org/m", b"1" * 4000)
    new = _download(hub, tmp_path, "org/m", b"2" * 4000)
    _sweep(tmp_path, ["org/m"], now=0.0)
    # a SpyreModel pinned to the old commit keeps it
    kept = _sweep(tmp_path, ["org/m", f"org/m@{old}"], now=DAY).weights
    assert kept is not None and not kept.removed
    assert _revisions(tmp_path) == {"org/m": {old, new}}
    # a serving pod (not a Job: nothing downloading) that runs the old commit keeps it too
    serving = {"models--org--m": weights.ModelUse(["pod/m-1"], False, {old})}
    assert _sweep(tmp_path, ["org/m"], now=2 * DAY).weights.pending  # type: ignore[union-attr]
    held = _sweep(tmp_path, ["org/m"], now=3 * DAY, live=lambda: serving).weights
    assert held is not None and not held.removed
    assert held.skipped == [{"model": f"models--org--m/snapshots/{old}",
                             "reason": "in use by pod/m-1"}]  # fmt: skip
    assert _revisions(tmp_path) == {"org/m": {old, new}}


def test_a_model_a_job_downloads_or_a_pod_runs_is_kept(hub: LocalHub, tmp_path: Path) -> None:
    _download(hub, tmp_path, "org/gone", b"b" * 100)
    old = _download(hub, tmp_path, "org/m", b"1" * 100)
    _download(hub, tmp_path, "org/m", b"2" * 100)
    _sweep(tmp_path, ["org/m"], now=0.0)
    live = {"models--org--gone": weights.ModelUse(["pod/x"], False, {None}),
            "models--org--m": weights.ModelUse(["job/spyre-compile-1"], True, {"main"})}
    res = _sweep(tmp_path, ["org/m"], now=DAY, live=lambda: live).weights
    assert res is not None and not res.removed
    assert {s["model"] for s in res.skipped} == {
        "models--org--gone", f"models--org--m/snapshots/{old}"}
    assert len(_revisions(tmp_path)["org/m"]) == 2 and "org/gone" in _revisions(tmp_path)


def test_when_use_cannot_be_told_nothing_is_removed(hub: LocalHub, tmp_path: Path) -> None:
    _download(hub, tmp_path, "org/gone", b"b" * 100)
    _sweep(tmp_path, [], now=0.0)

    def unknown() -> dict[str, weights.ModelUse]:
        raise InUseUnknown("listing pods: HTTP 403")

    res = _sweep(tmp_path, [], now=DAY, live=unknown)
    assert res.in_use_unknown == "listing pods: HTTP 403"
    assert "org/gone" in _revisions(tmp_path)


def test_what_is_on_the_claim_is_read_as_hostile(hub: LocalHub, tmp_path: Path) -> None:
    """A folder that is a symlink out of the hub, links that point outside, a forged record:
    nothing outside hub/ is touched, nothing kept goes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"p")
    hub_dir = tmp_path / "hub"
    _download(hub, tmp_path, "org/m", b"1" * 100)
    (hub_dir / "models--org--evil").symlink_to(outside)
    snap = next((hub_dir / "models--org--m" / "snapshots").iterdir())
    old = hub_dir / "models--org--m" / "snapshots" / ("0" * 40)
    old.mkdir()
    (old / "x").symlink_to(outside / "blobs" / "precious")  # names a "blob" outside
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / ".gc-models.json").write_text(json.dumps(
        {"models--org--evil": -1e12, f"models--org--m/snapshots/{'0' * 40}": "soon",
         "../../outside": 0}))  # fmt: skip
    for now in (0.0, DAY):
        _sweep(tmp_path, ["org/m"], now=now)
    assert (outside / "precious").read_bytes() == b"p"
    assert (hub_dir / "models--org--evil").is_symlink()
    assert snap.is_dir() and not old.exists()  # the stray snapshot went after its day
    assert set(_revisions(tmp_path, stray="models--org--evil")) == {"org/m"}


@pytest.mark.parametrize("value, ok", [
    ("hf://org/name", ModelRef("org/name")),
    ("org/name@main", ModelRef("org/name", "main")),
    ("hf://org/name@refs/pr/1", ModelRef("org/name", "refs/pr/1")),
    ("hf://../etc", None), ("org/../x", None), ("org/na me", None), ("org", None),
    ("org/name@", None), ("org/name@a b", None), ("/org/x/y", None),
])  # fmt: skip
def test_model_refs_are_parsed_never_trusted(value: str, ok: ModelRef | None) -> None:
    assert parse_ref(value) == ok


def test_the_folder_is_huggingface_hubs_own_name(hub: LocalHub, tmp_path: Path) -> None:
    _download(hub, tmp_path, "Org-1/Name.v2", b"1")
    assert [p.name for p in (tmp_path / "hub").glob("models--*")] == [
        ModelRef("Org-1/Name.v2").folder]


def _template(args: list[str], claim: str = "cache") -> dict[str, Any]:
    return {"containers": [{"name": "c", "args": args}],
            "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": claim}}]}


def test_what_runs_a_model_on_the_claim_is_found_by_its_arguments() -> None:
    pods = [
        {"metadata": {"name": "serve-1"}, "status": {"phase": "Running"},
         "spec": _template(["serve", "--model", "hf://org/a@main"])},
        {"metadata": {"name": "done"}, "status": {"phase": "Succeeded"},
         "spec": _template(["serve", "--model", "hf://org/b"])},
        {"metadata": {"name": "other-claim"}, "status": {"phase": "Running"},
         "spec": _template(["serve", "--model", "hf://org/c"], claim="elsewhere")},
        {"metadata": {"name": "compile-x", "ownerReferences": [{"kind": "Job", "name": "j"}]},
         "status": {"phase": "Running"},
         "spec": _template(["precompile", "--model=hf://org/d@v1"])},
        {"metadata": {"name": "pvc-model"}, "status": {"phase": "Running"},
         "spec": _template(["serve", "--model", "pvc://models/tiny"])},
    ]
    jobs = [{"metadata": {"name": "finished"}, "spec": {"template": {"spec": _template(
        ["precompile", "--model", "hf://org/e"])}},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]}}]
    deployments = [{"metadata": {"name": "scaled-to-zero"}, "spec": {"template": {
        "spec": _template(["serve", "--model", "hf://org/f"])}}}]
    found = inuse.models_in_use("cache", pods, jobs, deployments)
    assert {f: (u.users, u.downloading, u.revisions) for f, u in found.items()} == {
        "models--org--a": (["pod/serve-1"], False, {"main"}),
        "models--org--d": (["pod/compile-x"], True, {"v1"}),
        "models--org--f": (["deployment/scaled-to-zero"], False, {None}),
    }


def test_the_command_sweeps_the_models_it_is_told_to_keep(hub: LocalHub, tmp_path: Path) -> None:
    """``--keep-models``: the summary reports the sweep; an entry that is not a model turns the
    sweep of downloaded models off (keeping less than asked could remove a used one)."""
    _download(hub, tmp_path, "org/kept", b"a" * 10)
    _download(hub, tmp_path, "org/gone", b"b" * 10)
    term = tmp_path / "term"

    def run(keep: str | None, env: dict[str, str] | None = None) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "spyre_engine.cli", "gc", "--cache-root", str(tmp_path),
             "--remove", "", "--keep", "", "--orphans-unused-for", "0",
             *(["--keep-models", keep] if keep is not None else []),
             "--termination-log", str(term)],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(term.read_text())  # type: ignore[no-any-return]

    refused = run("org/kept,hf://../x")
    assert "modelsRemoved" not in refused and set(_revisions(tmp_path)) == {"org/kept", "org/gone"}
    doc = run("org/kept@main")
    assert [r["model"] for r in doc["modelsRemoved"]] == ["models--org--gone"], doc
    assert set(_revisions(tmp_path)) == {"org/kept"}

    # The operator's way (an engine older than the variable ignores it): a JSON list, where
    # an empty one keeps nothing.
    assert "modelsRemoved" not in run(None)  # neither: downloaded models are left alone
    doc = run(None, {"SPYRE_ENGINE_KEEP_MODELS": "[]"})
    assert [r["model"] for r in doc["modelsRemoved"]] == ["models--org--kept"], doc
    assert _revisions(tmp_path) == {}
