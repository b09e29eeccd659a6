"""Graceful shutdown: SIGTERM with streams in flight, past the deadline, and with TP=2."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
from spyre_engine.serve import HARD_EXIT_AFTER_DEADLINE
from spyre_engine.testing.process import EngineProcess

from tests.cluster.controlplane import wait_until

from .conftest import STARTUP_TIMEOUT, run_engine
from .sse import TIMEOUT, stream_completion

pytestmark = pytest.mark.engine

MODEL = "tiny"
# Exit must come before drain timeout + this, the engine's watchdog (the operator's grace period is
# longer: tests/unit/test_shutdown_budget.py): abort grace, vLLM's own shutdown of its engine core
# and workers, HTTP close.
EXIT_SLACK = HARD_EXIT_AFTER_DEADLINE
# A long context so the "long" stream outlasts the drain even on a fast machine (~100 tok/s),
# while the short one fits it on a loaded one (~5 tok/s).
SHAPE = ["--max-model-len", "2048", "--max-num-seqs", "4", "--max-num-batched-tokens", "128"]
#: The short stream's length bounds (within them it is measured: the test below).
SHORT_MIN, SHORT_MAX, LONG = 4, 25, 1900


def precompile_eager(model: Path, art: Path, *extra: str) -> None:
    """The drain tests' long shape on eager, without reference answers: recording them starts
    a vLLM of the same shape (a second start; TP=2's pair of workers included) for a check
    these tests are not about (conftest's precompile_eager does the same)."""
    if "--reference-answers" not in extra:
        extra = ("--reference-answers", "off", *extra)
    proc = run_engine(
        "precompile",
        "--model",
        str(model),
        "--artifact-dir",
        str(art),
        "--backend",
        "eager",
        "--termination-log",
        str(art.parent / "precompile.termlog"),
        *SHAPE,
        *extra,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _serve(start_engine, tiny_model: Path, art: Path, drain: float, *extra: str) -> EngineProcess:  # type: ignore[no-untyped-def]
    proc: EngineProcess = start_engine(
        "--model",
        str(tiny_model),
        "--artifact-dir",
        str(art),
        "--backend",
        "eager",
        "--served-name",
        MODEL,
        "--drain-timeout",
        str(drain),
        "--termination-log",
        str(art.parent / f"{art.name}.termlog"),
        *SHAPE,
        *extra,
    )
    proc.wait_started(STARTUP_TIMEOUT)
    return proc


def test_sigterm_drains_in_flight_and_cuts_streams_past_the_deadline(
    start_engine,
    tiny_model: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    art = tmp_path / "art"
    precompile_eager(tiny_model, art)
    drain = 8.0
    engine = _serve(start_engine, tiny_model, art, drain)

    long = stream_completion(engine.url, MODEL, "the quick brown fox", max_tokens=LONG)
    assert long.first_chunk.wait(60)
    # The short stream must still be in flight at SIGTERM and fit the drain. Generation runs
    # from ~2 tok/s (a machine twice as slow, loaded) to well over 100 (quiet), and a pace
    # read over a few tokens runs ahead of what two streams get later (159 tok/s read, 425
    # tokens asked: cut at the deadline). So at most SHORT_MAX (always in time on the usual
    # machine), fewer where the pace measured on the long stream now says even that would
    # take more than an eighth of the drain (25 tokens outlasted it on the slow machine). One
    # that finished already is asked again, twice as long.
    t0, n0 = time.monotonic(), long.text_chunks
    wait_until(lambda: long.text_chunks >= n0 + 10 or long.done.is_set(), 60,
               "ten tokens of the long stream, to measure the pace")  # fmt: skip
    rate = (long.text_chunks - n0) / (time.monotonic() - t0)
    tokens = min(SHORT_MAX, max(SHORT_MIN, int(rate * drain / 8)))
    print(f"generation pace {rate:.1f} tokens/s: a short stream of {tokens}")
    for _attempt in range(4):
        short = stream_completion(engine.url, MODEL, "hello world", max_tokens=tokens)
        assert short.first_chunk.wait(60)
        if not short.done.is_set():
            break
        tokens *= 2
    assert not short.done.is_set(), (
        f"a short stream of {tokens} tokens finished before SIGTERM; the test needs it in flight")
    children = engine.descendants_alive()
    assert children, "no vLLM process under the engine"
    signalled = engine.sigterm()

    # Readiness fails (at once; the wait's bound is a margin for a loaded machine); liveness
    # holds; new requests get 503.
    wait_until(lambda: engine.probe("/health/ready") == 503, 10, "readiness to fail")
    assert engine.probe("/health/live") == 200
    assert engine.probe("/health/startup") == 200
    resp = httpx.post(
        engine.url + "/v1/completions",
        json={"model": MODEL, "prompt": "late", "max_tokens": 2},
        timeout=TIMEOUT,
    )
    assert resp.status_code == 503
    text = httpx.get(engine.url + "/metrics", timeout=TIMEOUT).text
    assert "spyre_engine_draining 1.0" in text
    assert "spyre_engine_requests_rejected_while_draining_total 1.0" in text

    # The in-flight stream that fits completes normally.
    assert short.done.wait(drain + 5)
    assert short.error is None and short.got_done and not short.error_events
    assert short.completion_tokens == tokens

    # The one that does not fit ends with an error event and [DONE] after the deadline.
    assert long.done.wait(drain + EXIT_SLACK)
    assert long.error is None, long.error
    assert long.got_done and long.error_events, long.events[-3:]
    assert long.text_chunks < LONG
    assert long.ended_at is not None and long.ended_at - signalled >= drain - 0.5

    code = engine.wait_exit(drain + EXIT_SLACK - (time.monotonic() - signalled))
    assert code == 0, engine.log_tail()
    assert time.monotonic() - signalled < drain + EXIT_SLACK
    wait_until(lambda: not engine.still_running(children), 10, "the engine's children gone")


def test_tensor_parallel_2_exits_in_time_with_a_client_that_never_disconnects(
    start_engine,
    tiny_model: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    art = tmp_path / "art"
    precompile_eager(tiny_model, art, "--tensor-parallel-size", "2")
    drain = 3.0
    engine = _serve(start_engine, tiny_model, art, drain, "--tensor-parallel-size", "2")
    assert engine.port is not None

    # A client that sends a streaming request and then never reads nor disconnects.
    stubborn = socket.create_connection(("127.0.0.1", engine.port), timeout=10)
    body = (
        b'{"model": "tiny", "prompt": "hello", "max_tokens": 1900, "ignore_eos": true, '
        b'"stream": true}'
    )
    stubborn.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    stubborn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader = stream_completion(engine.url, MODEL, "the quick brown fox", max_tokens=LONG)
    try:
        assert reader.first_chunk.wait(120)
        children = engine.descendants_alive()
        assert len(children) >= 3, children  # API server, engine core, 2 TP workers
        signalled = engine.sigterm()
        code = engine.wait_exit(drain + EXIT_SLACK)
        elapsed = time.monotonic() - signalled
        assert code == 0, engine.log_tail()
        assert elapsed < drain + EXIT_SLACK
        assert reader.done.wait(5)
        assert reader.got_done and reader.error_events
        wait_until(lambda: not engine.still_running(children), 10, "the engine's children gone")
    finally:
        stubborn.close()
