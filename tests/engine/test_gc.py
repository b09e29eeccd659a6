"""``spyre-engine usage`` / ``gc`` on real directories (no vLLM): sizes, removal that never
touches a dir a precompile writes, and never shows a reader half an artifact (issue 14)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from spyre_engine import catalog, gc, inuse, manifest


def _artifact(cache: Path, key: str, size: int = 200_000, files: int = 3) -> Path:
    """A finished artifact: graph files, a catalog entry, the manifest written last."""
    art = cache / "artifacts" / key
    (art / "graphs").mkdir(parents=True)
    for i in range(files):
        (art / "graphs" / f"g{i}.bin").write_bytes(os.urandom(size))
    catalog.add_entry(art, {"data": {"MODEL_NAME": key}})
    manifest.write_manifest(art)
    return art


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spyre_engine.cli", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_usage_reports_every_artifact_and_the_volume(tmp_path: Path) -> None:
    _artifact(tmp_path, "aaa", size=100_000, files=2)
    _artifact(tmp_path, "bbb", size=50_000, files=1)
    half = tmp_path / "artifacts" / "ccc"  # a compile that never finished: no manifest
    half.mkdir()
    (half / "partial.bin").write_bytes(b"x" * 10)
    term = tmp_path / "term"
    proc = _cli("usage", "--cache-root", str(tmp_path), "--termination-log", str(term))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(term.read_text())
    assert json.loads(proc.stdout) == doc
    by_key = {a["key"]: a for a in doc["artifacts"]}
    assert set(by_key) == {"aaa", "bbb", "ccc"}
    # Every byte on disk is counted: graphs, catalog, manifest, locks.
    assert by_key["aaa"]["sizeBytes"] == gc.directory_size(tmp_path / "artifacts" / "aaa")
    assert by_key["aaa"]["sizeBytes"] > 200_000
    assert by_key["aaa"]["complete"] and not by_key["ccc"]["complete"]
    assert not any(a["writing"] for a in doc["artifacts"])
    assert doc["totalBytes"] == sum(a["sizeBytes"] for a in doc["artifacts"])
    assert doc["volumeBytes"] > 0 and 0 <= doc["freeBytes"] <= doc["volumeBytes"]
    assert "weightsBytes" not in doc  # no model downloaded here


def test_usage_measures_the_downloaded_models_where_the_operator_puts_them(
    tmp_path: Path,
) -> None:
    """Issue 47, 1: hf:// models download into the claim's hub directory (the operator's
    HF_CACHE_DIR, under the cache root the GC pod mounts), beside the artifacts: usage and
    every gc summary report their size apart."""
    from spyre_operator.desired.plan import CACHE_MOUNT, HF_CACHE_DIR

    assert HF_CACHE_DIR == f"{CACHE_MOUNT}/{gc.HUB_DIR}"
    blobs = tmp_path / gc.HUB_DIR / "models--org--m" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "w").write_bytes(b"x" * 70_000)
    _artifact(tmp_path, "aaa", size=1000, files=1)
    assert gc.usage(tmp_path)["weightsBytes"] == gc.directory_size(tmp_path / gc.HUB_DIR)
    term = tmp_path / "term"
    proc = _cli("gc", "--cache-root", str(tmp_path), "--remove", "aaa",
                "--termination-log", str(term))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(term.read_text())["weightsBytes"] >= 70_000


def test_gc_removes_the_given_keys_and_nothing_else(tmp_path: Path) -> None:
    a = _artifact(tmp_path, "aaa")
    b = _artifact(tmp_path, "bbb")
    size_a = gc.directory_size(a)
    term = tmp_path / "term"
    proc = _cli("gc", "--cache-root", str(tmp_path), "--remove", "aaa,nope,../etc",
                "--termination-log", str(term))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(term.read_text())
    assert doc["removed"] == [{"key": "aaa", "sizeBytes": size_a}]
    assert doc["freedBytes"] == size_a
    assert {s["key"]: s["reason"] for s in doc["skipped"]} == {
        "nope": "absent", "../etc": "not an artifact key: '../etc'"}
    assert not a.exists() and manifest.verify(b)
    assert doc["remainingBytes"] == gc.directory_size(b)
    # the volume, for status.cache (the operator mounts no claim): this filesystem's figures
    st = os.statvfs(tmp_path)
    assert doc["volumeBytes"] == st.f_blocks * st.f_frsize
    assert 0 < doc["freeBytes"] <= doc["volumeBytes"]
    # no trash left behind; the record of the removal beside the artifacts
    assert sorted(os.listdir(tmp_path / "artifacts")) == [gc.REMOVED_FILENAME, "bbb"]


def test_gc_skips_a_dir_a_precompile_is_writing(tmp_path: Path) -> None:
    art = _artifact(tmp_path, "busy")
    # Another process holds the writer lock, as a running precompile does.
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from spyre_engine.gc import writing\n"
         f"with writing({str(art)!r}):\n"
         "    print('locked', flush=True)\n"
         "    sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert gc.usage(tmp_path)["artifacts"][0]["writing"] is True
        result = gc.gc(tmp_path, ["busy"])
        assert result.removed == [] and result.skipped == [
            {"key": "busy", "reason": "a precompile is writing it"}]
        assert manifest.verify(art) and catalog.read_catalog(art)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    assert gc.gc(tmp_path, ["busy"]).removed[0]["key"] == "busy"
    assert not art.exists()


def test_a_precompile_waiting_for_the_lock_writes_a_fresh_dir(tmp_path: Path) -> None:
    """gc holds the lock while it moves the dir to the trash: a writer that was waiting gets
    the lock of a new dir at the same path, not of the trash."""
    art = _artifact(tmp_path, "k")
    lock_fd = os.open(art / gc.WRITER_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)  # gc's step 1, by hand
    entered = threading.Event()

    def writer() -> None:
        with gc.writing(art):
            (art / "new.bin").write_bytes(b"fresh")
            entered.set()

    t = threading.Thread(target=writer)
    t.start()
    assert not entered.wait(0.5)  # waiting for gc
    os.rename(art, art.with_name(".trash-k-1"))  # gc's step 4
    os.close(lock_fd)
    t.join(timeout=30)
    assert entered.is_set()
    assert (art / "new.bin").read_bytes() == b"fresh"
    assert (art / gc.WRITER_LOCK).exists()
    assert gc.sweep_trash(tmp_path) > 0 and os.listdir(tmp_path / "artifacts") == ["k"]


@pytest.mark.parametrize("rounds", [30])
def test_a_reader_never_sees_half_an_artifact(tmp_path: Path, rounds: int) -> None:
    """A server checks the manifest, then the catalog; whenever it then still finds its catalog
    entry, the files were complete: gc removes the catalog first and the files last."""
    violations, checks = [], 0
    for i in range(rounds):
        art = _artifact(tmp_path, f"r{i}", size=20_000, files=20)
        stop = threading.Event()

        def reader(art: Path = art, stop: threading.Event = stop) -> None:
            nonlocal checks
            while not stop.is_set():
                try:
                    manifest.verify(art)
                    ok = True
                except manifest.ArtifactCorrupt:
                    ok = False
                try:
                    entries = catalog.read_catalog(art)
                except catalog.CatalogError as exc:  # a half-written catalog
                    violations.append(str(exc))
                    continue
                checks += 1
                if entries and not ok:
                    violations.append(f"{art.name}: catalog entry but files incomplete")

        t = threading.Thread(target=reader)
        t.start()
        assert gc.gc(tmp_path, [art.name]).removed
        stop.set()
        t.join(timeout=30)
    assert checks > 0
    assert violations == []


def test_orphans_are_recorded_on_the_volume_then_removed_after_the_retention(
        tmp_path: Path) -> None:
    """A dir nobody knows (a deleted SpyreModel's) is timed from the first gc that finds it,
    on the volume itself, and removed only by a gc that long after; known dirs stay."""
    _artifact(tmp_path, "known")
    _artifact(tmp_path, "orphan")
    half = tmp_path / "artifacts" / "crashed"  # a precompile killed half-way, lock free
    half.mkdir()
    (half / "partial.bin").write_bytes(b"x" * 10)
    record = tmp_path / "artifacts" / gc.ORPHANS_FILENAME

    first = gc.gc(tmp_path, [], keep=["known"], orphans_unused_for=100, now=1000)
    assert first.removed == [] and first.skipped == []
    assert [(o["key"], o["since"]) for o in first.orphans] == [("crashed", 1000), ("orphan", 1000)]
    assert json.loads(record.read_text()) == {"crashed": 1000, "orphan": 1000}
    # A gc without the sweep (an operator that does not pass it) leaves the record alone.
    gc.gc(tmp_path, [])
    assert json.loads(record.read_text()) == {"crashed": 1000, "orphan": 1000}

    # Not due yet: kept, and the first sighting is not reset by a later one.
    again = gc.gc(tmp_path, [], keep=["known"], orphans_unused_for=100, now=1099)
    assert again.removed == [] and {o["since"] for o in again.orphans} == {1000}

    # "crashed" is known again (a SpyreModel of that shape came back): it leaves the record.
    due = gc.gc(tmp_path, [], keep=["known", "crashed"], orphans_unused_for=100, now=1100)
    assert [(r["key"], r["orphan"]) for r in due.removed] == [("orphan", True)]
    assert not (tmp_path / "artifacts" / "orphan").exists()
    assert (tmp_path / "artifacts" / "known" / "graphs").is_dir() and half.is_dir()
    assert due.orphans == [] and json.loads(record.read_text()) == {}
    doc = due.to_dict()
    assert "orphans" not in doc and doc["freedBytes"] > 0


def test_an_orphan_being_written_is_never_recorded(tmp_path: Path) -> None:
    art = _artifact(tmp_path, "compiling")
    with gc.writing(art):
        result = gc.gc(tmp_path, [], keep=[], orphans_unused_for=0, now=5)
    assert result.removed == [] and result.orphans == [] and art.is_dir()
    # Lock released: the next sweep with a zero retention removes it at once.
    result = gc.gc(tmp_path, [], keep=[], orphans_unused_for=0, now=6)
    assert [r["key"] for r in result.removed] == ["compiling"] and not art.exists()


def test_gc_cli_sweeps_orphans_and_reports_them(tmp_path: Path) -> None:
    _artifact(tmp_path, "aaa")
    _artifact(tmp_path, "bbb")
    term = tmp_path / "term"
    proc = _cli("gc", "--cache-root", str(tmp_path), "--keep", "aaa",
                "--orphans-unused-for", "3600", "--termination-log", str(term))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(term.read_text())
    assert doc["removed"] == [] and doc["orphanCount"] == 1
    assert doc["orphans"][0]["key"] == "bbb" and doc["orphanBytes"] > 0
    proc = _cli("gc", "--cache-root", str(tmp_path), "--keep", "aaa",
                "--orphans-unused-for", "0", "--termination-log", str(term))
    doc = json.loads(term.read_text())
    assert [r["key"] for r in doc["removed"]] == ["bbb"] and "orphans" not in doc
    assert (tmp_path / "artifacts" / "aaa").is_dir()


# ------------------------------------------------------------------ in use at removal time

CLAIM = "spyre-compile-cache"


def _pod(name: str, key: str, claim: str = CLAIM, phase: str = "Running") -> dict[str, object]:
    return {"metadata": {"name": name, "annotations": {inuse.ARTIFACT_KEY_ANNOTATION: key}},
            "spec": {"volumes": [{"name": "cache",
                                  "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": phase}}


def _workload(name: str, key: str, claim: str = CLAIM, done: bool = False) -> dict[str, object]:
    conds = [{"type": "Complete", "status": "True"}] if done else []
    return {"metadata": {"name": name},
            "spec": {"template": {
                "metadata": {"annotations": {inuse.ARTIFACT_KEY_ANNOTATION: key}},
                "spec": {"volumes": [{"name": "cache",
                                      "persistentVolumeClaim": {"claimName": claim}}]}}},
            "status": {"conditions": conds}}


def test_what_uses_a_key_now_is_any_live_pod_running_job_or_deployment_on_the_claim() -> None:
    pods = [_pod("done", "k", phase="Succeeded"), _pod("other-claim", "k", claim="x"),
            _pod("other-key", "j"), _pod("starting", "k", phase="Pending")]
    jobs = [_workload("finished", "k", done=True), _workload("compiling", "k")]
    deployments = [_workload("server", "k"), _workload("elsewhere", "k", claim="x")]
    assert inuse.users_of("k", CLAIM, pods, jobs, deployments) == [
        "deployment/server", "job/compiling", "pod/starting"]
    assert inuse.users_of("k", CLAIM, pods[:3], jobs[:1], deployments[1:]) == []


def test_a_key_in_use_when_gc_runs_is_kept_whatever_the_job_was_told(tmp_path: Path) -> None:
    """The remove list was fixed when the GC Job was made; a revert serves the key again
    before the pod runs: the check at removal time keeps it, complete and loadable."""
    served = _artifact(tmp_path, "aaa")
    _artifact(tmp_path, "bbb")
    objects: dict[str, list[dict[str, object]]] = {
        "pods": [_pod("server-1", "aaa")], "jobs": [], "deployments": []}
    asked: list[tuple[str, bool]] = []

    def lister(resource: str) -> list[dict[str, object]]:
        return objects[resource]

    check = inuse.InUseCheck(CLAIM, lister)

    def in_use(key: str) -> str | None:
        # Asked with the dir's lock held: a precompile starting now waits for the removal.
        asked.append((key, gc.being_written(tmp_path / "artifacts" / key)))
        return check(key)

    result = gc.gc(tmp_path, ["aaa", "bbb"], in_use=in_use)
    assert [r["key"] for r in result.removed] == ["bbb"]
    assert result.skipped == [{"key": "aaa", "reason": "in use by pod/server-1"}]
    assert asked == [("aaa", True), ("bbb", True)]
    manifest.verify(served)  # whole: catalog and manifest untouched
    assert catalog.CATALOG_FILENAME in os.listdir(served)


def test_an_orphan_a_pod_serves_is_not_swept(tmp_path: Path) -> None:
    _artifact(tmp_path, "orphan")
    check = inuse.InUseCheck(CLAIM, lambda r: [_pod("p", "orphan")] if r == "pods" else [])
    result = gc.gc(tmp_path, [], keep=[], orphans_unused_for=0, now=1.0, in_use=check)
    assert result.removed == []
    assert result.skipped == [{"key": "orphan", "reason": "in use by pod/p"}]
    assert (tmp_path / "artifacts" / "orphan").is_dir()


def test_when_it_cannot_tell_what_is_in_use_gc_removes_nothing(tmp_path: Path) -> None:
    _artifact(tmp_path, "aaa")
    _artifact(tmp_path, "orphan")

    def unreachable(resource: str) -> list[dict[str, object]]:
        raise inuse.InUseUnknown(f"listing {resource}: connection refused")

    result = gc.gc(tmp_path, ["aaa"], keep=[], orphans_unused_for=0, now=1.0,
                   in_use=inuse.InUseCheck(CLAIM, unreachable))
    assert result.removed == []
    assert result.in_use_unknown == "listing pods: connection refused"
    assert result.skipped == [{"key": "aaa", "reason": gc.UNKNOWN_REASON}]
    assert sorted(os.listdir(tmp_path / "artifacts")) == ["aaa", "orphan"]


def test_gc_cli_with_a_claim_outside_a_cluster_fails_safe(tmp_path: Path) -> None:
    """No API server to ask (no KUBERNETES_SERVICE_HOST, no token): exit non-zero, reason
    InUseUnknown in the termination log, every artifact still there."""
    _artifact(tmp_path, "aaa")
    term = tmp_path / "term"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    proc = subprocess.run(
        [sys.executable, "-m", "spyre_engine.cli", "gc", "--cache-root", str(tmp_path),
         "--remove", "aaa", "--claim", CLAIM, "--namespace", "ns",
         "--termination-log", str(term)],
        capture_output=True, text=True, timeout=120, check=False, env=env)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(term.read_text())
    assert doc["reason"] == "InUseUnknown"
    assert "nothing was removed" in doc["message"]
    assert (tmp_path / "artifacts" / "aaa" / manifest.MANIFEST_FILENAME).is_file()


def test_what_gc_removed_is_recorded_on_the_volume_and_reported_by_every_later_gc(
    tmp_path: Path,
) -> None:
    """Issue 47, 2: the record outlives the Job that removed the key. A later gc (which
    removes something else, or nothing) reports it in ``removedRecord``, newest first; the
    record on the claim is anyone's file: what is not a key with a time is left out."""
    _artifact(tmp_path, "aaa", size=1000, files=1)
    _artifact(tmp_path, "bbb", size=1000, files=1)
    first = gc.gc(tmp_path, ["aaa"], now=1_000_000_000)
    assert first.removed_record == {"aaa": "2001-09-09T01:46:40Z"}
    # the Job that removed it is gone; the next gc removes another key and reports both
    term = tmp_path / "term"
    proc = _cli("gc", "--cache-root", str(tmp_path), "--remove", "bbb",
                "--termination-log", str(term))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(term.read_text())
    assert list(doc["removedRecord"]) == ["bbb", "aaa"], doc
    assert doc["removedRecord"]["aaa"] == "2001-09-09T01:46:40Z"
    # one that removes nothing still reports it
    assert list(gc.gc(tmp_path, []).removed_record) == ["bbb", "aaa"]

    record = tmp_path / "artifacts" / gc.REMOVED_FILENAME
    doc = json.loads(record.read_text())
    record.write_text(json.dumps({**doc, "../etc": "2001-09-09T01:46:40Z", "x" * 65:
                                  "2001-09-09T01:46:40Z", "ccc": "yesterday", "ddd": 5}))
    assert set(gc.read_removed(tmp_path / "artifacts")) == {"aaa", "bbb"}
    record.write_text("[")
    assert gc.read_removed(tmp_path / "artifacts") == {}


def test_a_gc_summary_fits_the_termination_message() -> None:
    """The kubelet keeps 4 KiB of a termination message, and a cut line parses as nothing:
    the oldest record entries, then pending orphans, are left out until the line fits."""
    doc = {"removed": [{"key": "k" * 32, "sizeBytes": 1}], "skipped": [], "freedBytes": 1,
           "removedRecord": {f"{i:032x}": "2026-12-06T10:00:00Z" for i in range(200)},
           "orphans": [{"key": f"{i:032x}", "since": 1, "sizeBytes": 1} for i in range(10)]}
    line = gc.fit_summary(doc)
    assert len(line.encode()) < gc.TERMINATION_MESSAGE_BYTES
    out = json.loads(line)
    assert out["removed"] == doc["removed"] and len(out["orphans"]) == 10
    assert list(out["removedRecord"]) == list(doc["removedRecord"])[: len(out["removedRecord"])]
    assert 0 < len(out["removedRecord"]) < 200
