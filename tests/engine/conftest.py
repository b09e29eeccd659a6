"""Fixtures of the engine tests: one tiny model per session, engines that are always killed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from spyre_engine.testing.process import EngineProcess, engine_command, free_port
from spyre_engine.testing.tiny_model import build_tiny_model

# The shape every engine test uses: small enough for 2 CPU cores, chunk a multiple of 64.
SHAPE = ["--max-model-len", "512", "--max-num-seqs", "4", "--max-num-batched-tokens", "128"]
# Generous: on a loaded 2-core machine one vLLM start-up took up to 310 s (TP 2: two workers).
# A timeout is a failure bound, never a performance assertion.
STARTUP_TIMEOUT = 600.0


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Granite-architecture tiny model with random weights, built offline once per session."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-granite", arch="granite")


def run_engine(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``spyre-engine ARGS`` to completion (precompile, or a serve that refuses)."""
    return subprocess.run(
        engine_command(*args), capture_output=True, text=True, timeout=timeout, check=False
    )


def precompile_eager(model: Path, artifact: Path, *extra: str) -> dict[str, object]:
    """Record the test shape for the eager backend; returns the summary."""
    log = artifact.parent / f"{artifact.name}.precompile.termlog"
    proc = run_engine(
        "precompile",
        "--model",
        str(model),
        "--artifact-dir",
        str(artifact),
        "--backend",
        "eager",
        "--termination-log",
        str(log),
        *SHAPE,
        *extra,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(log.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def start_engine(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., EngineProcess]]:
    """Factory of ``spyre-engine serve`` processes, all killed (by group) at module end."""
    started: list[EngineProcess] = []
    logs = tmp_path_factory.mktemp("engine-logs")

    def start(*args: str, env: dict[str, str] | None = None) -> EngineProcess:
        port = free_port()
        engine = EngineProcess(
            ["serve", "--port", str(port), "--host", "127.0.0.1", *args],
            log_path=logs / f"serve-{port}.log",
            env=env,
            port=port,
        )
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.kill()
