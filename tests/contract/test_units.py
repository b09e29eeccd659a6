"""Unit checks behind the contract (no cluster, no vLLM): the engine on a read-only artifact."""

from __future__ import annotations

import collections
import os
import tempfile
from pathlib import Path

import pytest
from spyre_engine.launch import Child, inductor_dirs, plugin_env
from spyre_engine.precompile import remove_dead_sockets
from spyre_engine.settings import ServeSettings


def test_serve_uses_a_private_inductor_cache_when_the_artifact_is_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    art = tmp_path / "art"
    (art / "inductor" / "ab").mkdir(parents=True)
    (art / "inductor" / "ab" / "graph.py").write_text("x = 1\n")
    # Writable: serve (and precompile) use the artifact's own dirs.
    assert inductor_dirs(art, serving=True) == (art / "inductor", art / "tmp")
    # Read-only (as mounted in the serving pods; root ignores modes, so fake access(2)).
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, m: False if Path(p) == art and m == os.W_OK else real_access(p, m)
    )
    (tmp_path / "podtmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "podtmp"))  # the pod's /tmp
    settings = ServeSettings.model_validate(
        {"model": "/m", "artifact_dir": art, "backend": "inductor"}
    )
    env = plugin_env(settings, require_precompiled=True, base={})
    cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    assert cache.is_relative_to(tmp_path / "podtmp")
    assert (cache / "ab" / "graph.py").read_text() == "x = 1\n"
    assert Path(env["TMPDIR"]).is_dir() and Path(env["TMPDIR"]).is_relative_to(tmp_path / "podtmp")
    # Precompile always writes into the artifact.
    assert inductor_dirs(art, serving=False) == (art / "inductor", art / "tmp")


def test_engine_failure_names_the_engine_cores_exception_not_vllms_wrapper() -> None:
    # What `vllm serve` printed when the serving pod could not write its read-only cache.
    child = Child.__new__(Child)
    child.tail = collections.deque(
        [
            "(EngineCore pid=9)     raise InductorError(e, currentframe()).with_traceback(",
            "(EngineCore pid=9) torch._inductor.exc.InductorError: OSError: [Errno 30] "
            "Read-only file system: '/cache/artifacts/k/inductor/locks/x.lock'",
            "(APIServer pid=8)     raise RuntimeError(",
            "(APIServer pid=8) RuntimeError: Engine core initialization failed. "
            "See root cause above. Failed core proc(s): {}",
        ]
    )
    assert "Read-only file system" in child.last_error()


def test_precompile_removes_the_dead_sockets_vllm_left_in_the_artifact(tmp_path: Path) -> None:
    import socket

    (tmp_path / "graph.bin").write_bytes(b"x")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "ipc-1"))
    assert remove_dead_sockets(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["graph.bin"]
