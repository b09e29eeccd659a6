"""``spyre-engine precompile``: catalog entry, termination summary, idempotence, concurrency."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from spyre_engine import catalog, manifest
from spyre_engine.summary import PrecompileSummary, parse_termination_message
from spyre_engine.testing.process import engine_command

from .conftest import SHAPE, precompile_eager, run_engine

pytestmark = pytest.mark.engine


def test_precompile_writes_entry_and_summary(tiny_model: Path, tmp_path: Path) -> None:
    art = tmp_path / "art"
    summary = precompile_eager(tiny_model, art, "--artifact-key", "k-123")
    parsed = parse_termination_message(json.dumps(summary))
    assert isinstance(parsed, PrecompileSummary)
    assert parsed.key == "k-123" and parsed.path == str(art.resolve())
    assert parsed.compile_seconds >= 0 and parsed.size_bytes > 0
    assert parsed.versions.sendnn_inference == "2.6.3"
    assert parsed.versions.vllm and parsed.versions.torch
    # the Spyre compiler stack: none on this CPU machine, recorded as absent
    assert parsed.versions.torch_sendnn is None and parsed.versions.deeptools is None
    assert {"torch_sendnn", "deeptools"} <= set(summary["versions"])
    entries = catalog.read_catalog(art)
    assert entries == [
        {
            "sendnn_inference_version": "2.6.3",
            "dynamo_backend": "eager",
            "compiler_stack": {"torch_sendnn": None, "deeptools": None},
            "data": {
                "MODEL_NAME": str(tiny_model),
                "NUM_AIUS": 1,
                "VLLM_DT_MAX_CONTEXT_LEN": 512,
                "VLLM_DT_MAX_BATCH_SIZE": 4,
                "VLLM_DT_CHUNK_LEN": 128,
                "VLLM_DT_MAX_BATCH_TKV_LIMIT": 512 * 4,
            },
        }
    ]
    # The manifest is written last, and serve's check passes on what precompile left.
    assert manifest.verify(art)["format"] == 1
    # Re-running is idempotent: same single entry.
    precompile_eager(tiny_model, art, "--artifact-key", "k-123")
    assert catalog.read_catalog(art) == entries
    manifest.verify(art)


def test_concurrent_precompiles_keep_every_entry(tiny_model: Path, tmp_path: Path) -> None:
    art = tmp_path / "art"
    procs = []
    for seqs in range(1, 9):
        args = ["precompile", "--model", str(tiny_model), "--artifact-dir", str(art)]
        args += ["--backend", "eager", "--max-model-len", "512", "--max-num-seqs", str(seqs)]
        args += ["--termination-log", str(tmp_path / f"term-{seqs}")]
        procs.append(
            subprocess.Popen(
                engine_command(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0] * 8
    entries = catalog.read_catalog(art)
    assert sorted(e["data"]["VLLM_DT_MAX_BATCH_SIZE"] for e in entries) == list(range(1, 9))
    assert not list(art.glob(".catalog-*.tmp"))


@pytest.mark.slow
def test_inductor_precompile_compiles_into_the_artifact(tiny_model: Path, tmp_path: Path) -> None:
    """The real compile path: vLLM starts with the shape and the plugin warms up into art."""
    art = tmp_path / "art"
    term = tmp_path / "term"
    proc = run_engine(
        "precompile",
        "--model",
        str(tiny_model),
        "--artifact-dir",
        str(art),
        "--backend",
        "inductor",
        "--termination-log",
        str(term),
        *SHAPE,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = parse_termination_message(term.read_text())
    assert isinstance(summary, PrecompileSummary)
    assert summary.compile_seconds > 1
    assert summary.size_bytes > 1_000_000  # inductor's graphs and generated code
    assert any((art / "inductor").rglob("*")), "no inductor cache in the artifact"
    assert len(catalog.read_catalog(art)) == 1
    # Everything the compile left is in the manifest (dead sockets removed first), and intact.
    doc = manifest.verify(art)
    assert any(f["path"].startswith("inductor/") for f in doc["files"])
    assert not manifest.compare(art, doc).unlisted
