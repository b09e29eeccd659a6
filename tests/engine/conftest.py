"""Fixtures of the engine tests: one tiny model per session, engines that are always killed."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from spyre_engine.testing.process import EngineProcess, engine_command, free_port, http_status
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
    """Record the test shape for the eager backend; returns the summary. Without reference
    answers unless ``extra`` asks for them (recording starts a vLLM: test_precompile's)."""
    if "--reference-answers" not in extra:
        extra = ("--reference-answers", "off", *extra)
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


#: Starts of an engine whose port was taken between picking and binding it.
PORT_ATTEMPTS = 3


def _lost_a_port_race(engine: EngineProcess, ports: list[int]) -> bool:
    """Wait until the engine listens on its ports (it binds them before vLLM starts) or exits;
    True when it exited because one was taken."""
    from tests.cluster.controlplane import wait_until

    def bound_or_exited() -> bool:
        if engine.proc.poll() is not None:
            return True
        return all(http_status(f"http://127.0.0.1:{p}/", 3.0) != 0 for p in ports)

    wait_until(bound_or_exited, STARTUP_TIMEOUT, "the engine to listen on its ports (or exit)")
    return engine.proc.poll() is not None and "address already in use" in \
        engine.log_path.read_text(errors="replace").lower()


@pytest.fixture(scope="module")
def start_engine(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., EngineProcess]]:
    """Factory of ``spyre-engine serve`` processes, all killed (by group) at module end."""
    started: list[EngineProcess] = []
    logs = tmp_path_factory.mktemp("engine-logs")

    def start(*args: str, env: dict[str, str] | None = None,
              metrics_port: bool = False) -> EngineProcess:
        """``serve ARGS`` on a free port (and, with ``metrics_port``, its metrics on another:
        ``engine.metrics_port``). A port is free when picked, not when the engine binds it
        a few seconds later: an engine that lost that race (it exits saying the address is in
        use before it listens) is started again on other ports."""
        for _attempt in range(PORT_ATTEMPTS):
            ports = [free_port() for _ in range(2 if metrics_port else 1)]
            extra = ["--metrics-port", str(ports[1])] if metrics_port else []
            engine = EngineProcess(
                ["serve", "--port", str(ports[0]), "--host", "127.0.0.1", *extra, *args],
                log_path=logs / f"serve-{ports[0]}.log",
                env=env,
                port=ports[0],
            )
            engine.metrics_port = ports[1] if metrics_port else None
            started.append(engine)
            if not _lost_a_port_race(engine, ports):
                return engine
        raise AssertionError(f"the engine lost the race for a free port {PORT_ATTEMPTS} times")

    yield start
    for engine in started:
        engine.kill()
