"""Shutdown on CPU: vLLM's engine core exits by itself; precompile obeys SIGTERM.

With ``--shutdown-timeout 0`` vLLM's ``shutdown(procs, timeout=0)`` (vllm/v1/utils.py) goes
straight to ``kill_process_tree``: the engine core (and on Spyre the TP workers holding the cards)
get SIGKILL and vLLM logs ``[shutdown] Process manager: force killing remaining process``. The
engine core handling SIGTERM itself logs ``[shutdown] EngineCore: ... starting resource teardown``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import psutil
import pytest
from spyre_engine import catalog
from spyre_engine.serve import HARD_EXIT_AFTER_DEADLINE
from spyre_engine.testing.process import EngineProcess

from tests.cluster.controlplane import wait_until

from .conftest import SHAPE, STARTUP_TIMEOUT, precompile_eager
from .sse import TIMEOUT

pytestmark = pytest.mark.engine

FORCE_KILL = "[shutdown] Process manager: force killing"
CORE_TEARDOWN = "[shutdown] EngineCore: request processing complete; starting resource teardown"
SELF_EXIT = "vLLM process group exited by itself"


@pytest.mark.parametrize("tp", [1, 2])
def test_sigterm_lets_the_engine_core_exit_by_itself(  # type: ignore[no-untyped-def]
    start_engine, tiny_model: Path, tmp_path: Path, tp: int
) -> None:
    art = tmp_path / "art"
    precompile_eager(tiny_model, art, "--tensor-parallel-size", str(tp))
    engine: EngineProcess = start_engine(
        "--tensor-parallel-size",
        str(tp),
        "--model",
        str(tiny_model),
        "--artifact-dir",
        str(art),
        "--backend",
        "eager",
        "--served-name",
        "tiny",
        "--drain-timeout",
        "2",
        "--termination-log",
        str(tmp_path / "term"),
        *SHAPE,
    )
    engine.wait_started(STARTUP_TIMEOUT)
    resp = httpx.post(
        engine.url + "/v1/completions",
        json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
        timeout=TIMEOUT,
    )
    assert resp.status_code == 200, resp.text
    children = engine.descendants_alive()
    assert len(children) >= 2 + (tp if tp > 1 else 0), children  # API server, core, workers
    signalled = engine.sigterm()
    code = engine.wait_exit(60)
    elapsed = time.monotonic() - signalled
    log = engine.log_path.read_text(errors="replace")
    assert code == 0, engine.log_tail(80)
    assert elapsed < 2 + HARD_EXIT_AFTER_DEADLINE, elapsed
    assert FORCE_KILL not in log, log[-4000:]
    assert CORE_TEARDOWN in log, log[-4000:]
    assert SELF_EXIT in log, log[-4000:]
    if tp > 1:
        # The TP workers (on Spyre: the processes holding the cards) stop in order too: by
        # themselves, or after the engine core's SIGTERM when slow, never by SIGKILL.
        assert "[shutdown] Executor: waiting for worker exit" in log, log[-4000:]
        assert "still running after SIGTERM; sending SIGKILL" not in log, log[-4000:]
    wait_until(lambda: not engine.still_running(children), 10, "the engine's children gone")


def test_precompile_exits_promptly_on_sigterm(tiny_model: Path, tmp_path: Path) -> None:
    art = tmp_path / "art"
    term = tmp_path / "term"
    proc = EngineProcess(
        [
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
        ],
        log_path=tmp_path / "precompile.log",
    )
    try:
        # Wait until vLLM runs under the precompile with its engine core (it is compiling or
        # still loading): the processes that must all be gone after the SIGTERM.
        def vllm_and_core() -> list[int]:
            assert proc.proc.poll() is None, proc.log_tail()
            alive = proc.descendants_alive()
            return alive if len(alive) >= 2 else []

        children = wait_until(vllm_and_core, 300, "vLLM and its engine core under the precompile")
        signalled = proc.sigterm()
        code = proc.wait_exit(40)
        elapsed = time.monotonic() - signalled
        assert code == 128 + 15, (code, proc.log_tail(60))
        # the contract: out before the kubelet's SIGKILL (the precompile pod's grace period is
        # Kubernetes' default, 30 s); vLLM's own shutdown bound is 18 s
        # (launch.PRECOMPILE_STOP_GRACE), the rest is margin
        assert elapsed < 30, elapsed
        result = json.loads(term.read_text())
        assert result["reason"] == "Terminated", result
        assert "SIGTERM" in result["message"]
        assert catalog.read_catalog(art) == []
        wait_until(lambda: not [p for p in EngineProcess.still_running(children)
                                if psutil.pid_exists(p)], 10, "vLLM's processes gone")
    finally:
        proc.kill()
