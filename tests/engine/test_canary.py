"""A canary judges its own requests (issue 30): real vLLM on CPU, faults injected by the engine's
own flag; the engine leaves the Service (readiness), keeps answering for its grace, drains and
stops with CanaryFailed in its termination log."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from spyre_engine.serve import CANARY_UNREADY_SECONDS, HARD_EXIT_AFTER_DEADLINE

from .test_drain import MODEL, _serve, precompile_eager

pytestmark = pytest.mark.engine

DRAIN = 5.0


def _complete(url: str) -> int:
    r = httpx.post(f"{url}/v1/completions", timeout=120,
                   json={"model": MODEL, "prompt": "hello", "max_tokens": 2})  # fmt: skip
    return r.status_code


def _counts(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {m[1]: float(m[2]) for m in
            re.finditer(r'^spyre_engine_requests_total\{code="(\w+)"\} (\S+)$', text, re.M)
            if m}  # fmt: skip


def test_a_canary_that_breaks_its_bounds_leaves_the_service_then_stops_with_canary_failed(
    start_engine, tiny_model: Path, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    art = tmp_path / "art"
    precompile_eager(tiny_model, art)
    engine = _serve(
        start_engine, tiny_model, art, DRAIN,
        "--canary-seconds", "600", "--canary-min-requests", "4",
        "--canary-max-error-ratio", "0.3", "--fault-error-ratio", "0.5",
    )  # fmt: skip
    assert engine.probe("/health/ready") == 200
    # GETs are not judged nor faulted
    assert httpx.get(f"{engine.url}/v1/models", timeout=30).status_code == 200
    # Every second request fails (the injector); 2 of 4 > 30% once 4 are answered.
    report = httpx.get(f"{engine.url}/health/canary", timeout=10).json()
    assert (report["judged"], report["minRequests"], report["judging"]) == (0, 4, True), report
    assert [_complete(engine.url) for _ in range(3)] == [200, 500, 200]
    assert engine.probe("/health/ready") == 200, "3 requests: not judged yet"
    report = httpx.get(f"{engine.url}/health/canary", timeout=10).json()
    assert (report["judged"], report["errors"]) == (3, 1), report
    assert _complete(engine.url) == 500
    failed_at = time.monotonic()
    assert engine.probe("/health/ready") == 503, "out of the Service at once"
    assert _counts(engine.url) == {"2xx": 2.0, "5xx": 2.0}
    # It still answers while the endpoint update reaches the clients (no drain 503s yet).
    assert _complete(engine.url) == 200
    code = engine.wait_exit(CANARY_UNREADY_SECONDS + DRAIN + HARD_EXIT_AFTER_DEADLINE)
    assert code == 1, engine.log_tail()
    assert time.monotonic() - failed_at >= CANARY_UNREADY_SECONDS - 1
    summary = json.loads((art.parent / f"{art.name}.termlog").read_text())
    assert summary["reason"] == "CanaryFailed"
    assert "2 of its 4 requests failed with a server error (50%" in summary["message"]


def test_a_canary_past_its_window_keeps_judging_until_min_requests(
    start_engine, tiny_model: Path, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    """Issue 44: a canary whose window saw no traffic judged nothing after it, so the requests
    that came later never made ``minRequests`` and the operator (which now waits for them)
    would wait for good. Past its window it judges until minRequests, then stops."""
    art = tmp_path / "art"
    precompile_eager(tiny_model, art)
    engine = _serve(start_engine, tiny_model, art, DRAIN, "--canary-seconds", "1",
                    "--canary-min-requests", "3")  # fmt: skip

    def report() -> dict[str, object]:
        out: dict[str, object] = httpx.get(f"{engine.url}/health/canary", timeout=10).json()
        return out

    deadline = time.monotonic() + 60
    while report()["windowLeftSeconds"] != 0.0:  # polled: the window's end, as it says
        assert time.monotonic() < deadline, report()
    assert [_complete(engine.url) for _ in range(2)] == [200, 200]
    r = report()
    assert (r["judged"], r["judging"]) == (2, True), r
    assert _complete(engine.url) == 200
    r = report()
    assert (r["judged"], r["judging"]) == (3, False), r
    assert _complete(engine.url) == 200
    assert report()["judged"] == 3, "settled: no more judging"
    # Every serving pod's figures since Ready (the baseline comparison's, issue 44, 5): the
    # requests the model answered, vLLM's own latency histograms over the same requests, and
    # a client's 400 counted in neither.
    bad = httpx.post(f"{engine.url}/v1/completions", timeout=60,
                     json={"model": MODEL, "prompt": "hello", "max_tokens": -1})  # fmt: skip
    assert bad.status_code == 400, bad.text
    served = httpx.get(f"{engine.url}/health/served", timeout=10).json()
    assert (served["judged"], served["errors"]) == (4, 0), served
    latency = served["latency"]
    assert latency["ttftCount"] == 4 and latency["tpotCount"] == 4, served
    assert 0 < latency["ttftSum"] < served["secondsSum"], served
