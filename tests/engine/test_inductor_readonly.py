"""Serving inductor from a read-only artifact (as the pods mount it) reuses everything it holds.

The private dirs serve uses then must still hold inductor's precompiled C++ header: inductor
checks for it in every process that loads a C++ kernel, and rebuilt it (4.5 s of a 41 s start of
the tiny model) when TMPDIR was an empty private dir. Here, the dirs serve makes; a real
inductor serve from a read-only artifact: the real node's output-check test
(tests/contract/realpods.py ``assert_inductor_served_without_compiling``), whose pods mount
the claim read-only (its local copy cost the local session an inductor compile, issue 43).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from spyre_engine.launch import inductor_dirs

PCH = Path("tmp") / "torchinductor_u" / "precompiled_headers"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_read_only_artifact_gets_a_tmpdir_linking_to_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = tmp_path / "art"
    (art / PCH / "locks").mkdir(parents=True)
    (art / PCH / "h1.h").write_text("#include <torch/csrc/inductor/cpp_prefix.h>\n")
    (art / PCH / "h1.h.gch").write_bytes(b"precompiled")
    (art / PCH / "locks" / "h1.lock").write_text("")
    (art / "inductor" / "ab").mkdir(parents=True)
    (art / "inductor" / "ab" / "kernel.so").write_bytes(b"kernel")
    before = _files(art)
    # Read-only, as mounted in the serving pods (root ignores modes, so fake access(2)).
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if Path(p) == art and m == os.W_OK else real_access(p, m)
    )
    podtmp = tmp_path / "podtmp"
    podtmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(podtmp))

    cache, tmp = inductor_dirs(art, serving=True)

    assert cache.is_relative_to(podtmp) and tmp.is_relative_to(podtmp)
    assert (cache / "ab" / "kernel.so").read_bytes() == b"kernel"
    pch = tmp / "torchinductor_u" / "precompiled_headers"
    gch = pch / "h1.h.gch"
    # The 150 MB header is linked, not copied and not missing...
    assert gch.is_symlink() and gch.resolve() == (art / PCH / "h1.h.gch").resolve()
    assert gch.read_bytes() == b"precompiled"
    # ...the lock is not linked (inductor opens it for writing), and inductor can write its own.
    assert (pch / "locks").is_dir() and not (pch / "locks" / "h1.lock").exists()
    (pch / "locks" / "h1.lock").write_text("")
    (pch / "other.h").write_text("new\n")
    assert _files(art) == before, "serve changed the artifact"


def test_read_only_artifact_without_tmp_gets_an_empty_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = tmp_path / "art"
    (art / "inductor").mkdir(parents=True)
    monkeypatch.setattr(os, "access", lambda p, m: False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _, tmp = inductor_dirs(art, serving=True)
    assert tmp.is_dir() and not any(tmp.iterdir())
    # Writable (and always for precompile): the artifact's own dirs.
    monkeypatch.undo()
    assert inductor_dirs(art, serving=True) == (art / "inductor", art / "tmp")
    assert inductor_dirs(art, serving=False) == (art / "inductor", art / "tmp")
