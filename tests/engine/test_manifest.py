"""The artifact manifest: written last by precompile, checked by serve (real files, no vLLM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spyre_engine import catalog, manifest
from spyre_engine.precompile import invalidate_manifest
from spyre_engine.settings import ServeSettings
from spyre_engine.summary import FailureSummary, parse_termination_message


def _artifact(root: Path) -> Path:
    """An artifact dir shaped like an inductor one: graphs in subdirs, a symlink, the catalog."""
    art = root / "art"
    (art / "inductor" / "fx").mkdir(parents=True)
    (art / "tmp").mkdir()
    (art / "graph-0.bin").write_bytes(os.urandom(300_000))
    (art / "inductor" / "fx" / "g1.py").write_text("print('graph')\n")
    (art / "tmp" / "header.h").write_text("#define X 1\n")
    (art / "inductor" / "latest").symlink_to("fx")
    return art


def _model(root: Path) -> Path:
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_manifest_lists_every_file_with_size_and_checksum(tmp_path: Path) -> None:
    art = _artifact(tmp_path)
    catalog.add_entry(art, {"data": {"MODEL_NAME": "m"}})  # bookkeeping: left out
    (art / ".catalog-x.tmp").write_text("partial")
    doc = manifest.write_manifest(art)
    on_disk = json.loads(manifest.manifest_path(art).read_text())
    assert on_disk == doc
    paths = [f["path"] for f in doc["files"]]
    assert paths == ["graph-0.bin", "inductor/fx/g1.py", "inductor/latest", "tmp/header.h"]
    graph = doc["files"][0]
    assert graph["size"] == 300_000
    assert graph["sha256"] == manifest.sha256_file(art / "graph-0.bin")
    assert doc["files"][2] == {"path": "inductor/latest", "link": "fx"}
    assert doc["totalBytes"] == sum(f.get("size", 0) for f in doc["files"])
    assert not list(art.glob(".manifest-*.tmp"))
    assert manifest.verify(art)["files"] == doc["files"]


@pytest.mark.parametrize(
    ("damage", "mode", "fragment"),
    [
        (lambda a: (a / "graph-0.bin").write_bytes(b"x" * 1000), "sizes", "truncated"),
        (lambda a: os.truncate(a / "graph-0.bin", 4096), "checksums", "truncated"),
        (lambda a: (a / "tmp" / "header.h").unlink(), "sizes", "missing: tmp/header.h"),
        # Same size, other bytes: only the checksum sees it.
        (lambda a: (a / "tmp" / "header.h").write_text("#define X 2\n"), "checksums", "checksum"),
        (lambda a: manifest.manifest_path(a).unlink(), "sizes", "did not finish"),
        (lambda a: manifest.manifest_path(a).write_text('{"files": [{"pa'), "sizes", "truncated"),
    ],
)
def test_damaged_artifact_fails_verification(
    tmp_path: Path, damage: object, mode: manifest.VerifyMode, fragment: str
) -> None:
    art = _artifact(tmp_path)
    manifest.write_manifest(art)
    damage(art)  # type: ignore[operator]
    with pytest.raises(manifest.ArtifactCorrupt, match=fragment):
        manifest.verify(art, mode)


def test_sizes_mode_reads_no_content_and_misses_same_size_changes(tmp_path: Path) -> None:
    art = _artifact(tmp_path)
    manifest.write_manifest(art)
    (art / "tmp" / "header.h").write_text("#define X 2\n")
    manifest.verify(art, "sizes")  # passes: what "sizes" gives up for speed
    with pytest.raises(manifest.ArtifactCorrupt):
        manifest.verify(art, "checksums")


def test_unlisted_files_are_not_a_failure(tmp_path: Path) -> None:
    art = _artifact(tmp_path)
    manifest.write_manifest(art)
    (art / "another-shape.bin").write_bytes(b"new")
    problems = manifest.compare(art, manifest.read_manifest(art))
    assert problems.unlisted == ["another-shape.bin"] and not problems.bad
    manifest.verify(art)


def test_compiling_again_drops_the_manifest_and_only_the_damaged_files(tmp_path: Path) -> None:
    art = _artifact(tmp_path)
    manifest.write_manifest(art)
    os.truncate(art / "graph-0.bin", 10)
    invalidate_manifest(art)
    assert not manifest.manifest_path(art).exists()
    assert not (art / "graph-0.bin").exists()  # compiled anew, not reused
    assert (art / "inductor" / "fx" / "g1.py").exists() and (art / "tmp" / "header.h").exists()
    # An intact artifact keeps every file; only the manifest goes until the compile finishes.
    manifest.write_manifest(art)
    invalidate_manifest(art)
    assert not manifest.manifest_path(art).exists()
    assert (art / "inductor" / "fx" / "g1.py").exists()


def _serve(model: Path, art: Path, term: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spyre_engine.cli",
            "serve",
            "--model",
            str(model),
            "--artifact-dir",
            str(art),
            "--termination-log",
            str(term),
            "--backend",
            "eager",
            "--max-model-len",
            "512",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_serve_refuses_a_truncated_or_unfinished_artifact(tmp_path: Path) -> None:
    """Before vLLM is started: exit 1 and reason ArtifactCorrupt in the termination log."""
    model, art, term = _model(tmp_path), _artifact(tmp_path), tmp_path / "term"
    settings = ServeSettings.model_validate(
        {"model": str(model), "artifact_dir": art, "max_model_len": 512, "backend": "eager"}
    )
    catalog.add_entry(art, catalog.make_entry(settings, str(model), "2.6.3"))

    proc = _serve(model, art, term)  # the catalog entry is there, the manifest is not
    assert proc.returncode == 1, proc.stderr[-2000:]
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "ArtifactCorrupt"
    assert "spyre_artifact_manifest.json is missing" in failure.message
    assert "Starting vLLM" not in proc.stderr

    manifest.write_manifest(art)
    os.truncate(art / "graph-0.bin", 1000)
    proc = _serve(model, art, term, "--verify-artifact", "sizes")
    assert proc.returncode == 1
    failure = parse_termination_message(term.read_text())
    assert isinstance(failure, FailureSummary) and failure.reason == "ArtifactCorrupt"
    assert "truncated or resized: graph-0.bin" in failure.message
    assert "Starting vLLM" not in proc.stderr


def test_serve_verifies_an_intact_artifact(tmp_path: Path) -> None:
    from spyre_engine.cli import verify_artifact

    model, art = _model(tmp_path), _artifact(tmp_path)
    manifest.write_manifest(art)
    settings = ServeSettings.model_validate({"model": str(model), "artifact_dir": art})
    doc = verify_artifact(settings)
    assert doc is not None and len(doc["files"]) == 4
    off = settings.model_copy(update={"verify_artifact": "off"})
    manifest.manifest_path(art).unlink()
    assert verify_artifact(off) is None
