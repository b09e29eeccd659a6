"""A pooling (embed) model: precompile records warmup shapes, serve answers /v1/embeddings."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from spyre_engine import catalog
from spyre_engine.summary import FailureSummary, parse_termination_message
from spyre_engine.testing.process import EngineProcess

from .conftest import STARTUP_TIMEOUT, run_engine
from .sse import TIMEOUT

pytestmark = pytest.mark.engine

POOLING = ["--task", "embed", "--warmup-shapes", "64x4", "--max-model-len", "512"]


def test_embed_precompile_and_serve(start_engine, tiny_model: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    art = tmp_path / "art"
    common = ["--model", str(tiny_model), "--artifact-dir", str(art), "--backend", "eager"]
    proc = run_engine(
        "precompile", *common, *POOLING, "--termination-log", str(tmp_path / "t1"), timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (entry,) = catalog.read_catalog(art)
    assert entry["data"]["SENDNN_INFERENCE_WARMUP_PROMPT_LENS"] == "64"
    assert entry["data"]["SENDNN_INFERENCE_WARMUP_BATCH_SIZES"] == "4"

    # Another warmup shape is refused before vLLM starts.
    other = [a if a != "64x4" else "128x2" for a in POOLING]
    term = tmp_path / "t2"
    proc = run_engine("serve", *common, *other, "--termination-log", str(term), timeout=120)
    assert proc.returncode != 0 and '"reason":"ArtifactMismatch"' in term.read_text()

    engine: EngineProcess = start_engine(
        *common, *POOLING, "--served-name", "emb", "--termination-log", str(tmp_path / "t3")
    )
    engine.wait_started(STARTUP_TIMEOUT)
    resp = httpx.post(
        engine.url + "/v1/embeddings",
        json={"model": "emb", "input": ["hello world", "the quick brown fox"]},
        timeout=TIMEOUT,
    )
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert len(data) == 2 and len(data[0]["embedding"]) == 128


def test_pooling_serve_does_not_compile_what_the_artifact_lacks(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The plugin's REQUIRE_PRECOMPILED_DECODERS skips pooling models (compilation_utils.py), so
    a pooling server used to compile whatever its artifact lacked. An entry recorded by an eager
    precompile holds no graphs: an inductor server refuses it instead of compiling into the
    cache, and so does an inductor entry whose graphs are gone."""
    art = tmp_path / "art"
    common = ["--model", str(tiny_model), "--artifact-dir", str(art), *POOLING]
    proc = run_engine(
        "precompile", *common, "--backend", "eager", "--termination-log", str(tmp_path / "t1")
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for attempt in ("eager-entry", "inductor-entry-without-graphs"):
        term = tmp_path / f"term-{attempt}"
        proc = run_engine(
            "serve",
            *common,
            "--backend",
            "inductor",
            "--termination-log",
            str(term),
            timeout=120,
        )
        failure = parse_termination_message(term.read_text())
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert isinstance(failure, FailureSummary) and failure.reason == "ArtifactMismatch"
        graphs = [p for p in (art / "inductor").rglob("*") if p.is_file()]
        assert not graphs, f"serve compiled into the artifact: {graphs[:5]}"
        if attempt == "eager-entry":
            assert "eager" in failure.message, failure.message
            # Same shape, recorded as if inductor had compiled it, but no graphs on disk.
            (entry,) = catalog.read_catalog(art)
            entry["dynamo_backend"] = "inductor"
            catalog.add_entry(art, entry)
        else:
            assert "no inductor graphs" in failure.message, failure.message


def _files(root: Path) -> set[str]:
    files = (p for p in root.rglob("*") if p.is_file() and "locks" not in p.parts)
    return {str(p.relative_to(root)) for p in files}


@pytest.mark.slow
def test_inductor_pooling_server_adds_no_graph_to_its_artifact(  # type: ignore[no-untyped-def]
    start_engine, tiny_model: Path, tmp_path: Path
) -> None:
    """Precompiled with inductor, the pooling server answers from the artifact's graphs: after
    start-up and a request, the (writable, so used in place) inductor cache has no new file."""
    art = tmp_path / "art"
    common = ["--model", str(tiny_model), "--artifact-dir", str(art), "--backend", "inductor"]
    proc = run_engine(
        "precompile", *common, *POOLING, "--termination-log", str(tmp_path / "t1"), timeout=1200
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = _files(art / "inductor")
    assert before, "precompile left no inductor graphs"
    engine: EngineProcess = start_engine(
        *common, *POOLING, "--served-name", "emb", "--termination-log", str(tmp_path / "t2")
    )
    engine.wait_started(STARTUP_TIMEOUT)
    resp = httpx.post(
        engine.url + "/v1/embeddings", json={"model": "emb", "input": ["hello"]}, timeout=TIMEOUT
    )
    assert resp.status_code == 200, resp.text
    added = _files(art / "inductor") - before
    assert not added, f"serving compiled into the artifact: {sorted(added)[:10]}"
