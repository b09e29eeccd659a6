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
from spyre_engine import catalog, gc, manifest


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
    assert os.listdir(tmp_path / "artifacts") == ["bbb"]  # no trash left behind


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
