"""Serving inductor from a read-only artifact (as the pods mount it) reuses everything it holds.

The private dirs serve uses then must still hold inductor's precompiled C++ header: inductor
checks for it in every process that loads a C++ kernel, and rebuilt it (4.5 s of a 41 s start of
the tiny model) when TMPDIR was an empty private dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from spyre_engine.launch import inductor_dirs
from spyre_engine.testing.process import engine_command, free_port, http_status, kill_tree

from .conftest import SHAPE, STARTUP_TIMEOUT

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


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a read-only bind mount needs root and unshare",
)
def test_inductor_serve_from_a_read_only_artifact_reuses_its_precompiled_header(
    tiny_model: Path, inductor_artifact: tuple[Path, Path], tmp_path: Path
) -> None:
    art, _ = inductor_artifact  # read-only below: nothing of it changes
    common = ["--model", str(tiny_model), "--artifact-dir", str(art), "--backend", "inductor"]
    assert list(art.glob("tmp/torchinductor_*/precompiled_headers/*.gch")), "no header to reuse"
    port = free_port()
    serve = engine_command(
        "serve", *common, *SHAPE, "--served-name", "tiny", "--port", str(port),
        "--host", "127.0.0.1", "--termination-log", str(tmp_path / "t2"),
    )  # fmt: skip
    # The artifact read-only (EROFS, as the pods' cache claim) in a private mount namespace.
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(art), *serve]
    # The pod's /tmp: short, vLLM's ZMQ socket paths under it must fit in 107 characters.
    podtmp = Path(tempfile.mkdtemp(prefix="ro-", dir="/tmp"))
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        engine = subprocess.Popen(
            cmd, env={**os.environ, "TMPDIR": str(podtmp)}, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while http_status(f"http://127.0.0.1:{port}/health/startup") != 200:
            assert engine.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "not started"
            time.sleep(0.5)
        # Nothing compiled at start-up: its output check (the reference prompts, answered before
        # Ready) took shapes the precompile's own vLLM had answered, and so compiled, into the
        # artifact (its reference itself comes from eager, which compiles nothing).
        (private,) = podtmp.glob("spyre-engine-inductor-*")
        had = {p.relative_to(art / "inductor") for p in (art / "inductor").rglob("*")}
        new = sorted(str(rel) for p in (private / "inductor").rglob("*") if p.is_file()
                     and "locks" not in (rel := p.relative_to(private / "inductor")).parts
                     and rel not in had)  # fmt: skip
        assert not new, f"serve compiled at start-up: {new[:8]}"
        assert "Output check passed" in log.read_text(errors="replace")
        resp = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
            timeout=120,
        )
        assert resp.status_code == 200, resp.text
        headers = list(private.glob("tmp/torchinductor_*/precompiled_headers/*.gch"))
        assert headers, "the private TMPDIR lacks the artifact's precompiled header"
        rebuilt = [h for h in headers if not h.is_symlink()]
        assert not rebuilt, f"serve rebuilt inductor's precompiled header: {rebuilt}"
    finally:
        kill_tree(engine, timeout=30)
        shutil.rmtree(podtmp, ignore_errors=True)
