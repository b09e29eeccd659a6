"""``spyre-engine serve`` on a real vLLM (CPU, eager): API, probes, metrics, prefix cache."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from spyre_engine.testing.process import EngineProcess

from .conftest import SHAPE, STARTUP_TIMEOUT, precompile_eager
from .sse import TIMEOUT, metric, metric_values, stream_completion

pytestmark = pytest.mark.engine

MODEL = "tiny"
WORDS = (
    "the quick brown fox jumps over a lazy dog while spyre accelerators serve large language "
    "models with vllm on kubernetes clusters operators reconcile custom resources"
).split()


def metrics_url(engine: EngineProcess) -> str:
    return f"http://127.0.0.1:{engine.metrics_port}"


def long_text(n_words: int, offset: int = 0) -> str:
    return " ".join(WORDS[(i + offset) % len(WORDS)] for i in range(n_words))


@pytest.fixture(scope="module")
def engine(start_engine, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    art = tmp_path_factory.mktemp("serve-art")
    precompile_eager(tiny_model, art, "--artifact-key", "key-abc")
    proc: EngineProcess = start_engine(
        "--model",
        str(tiny_model),
        "--artifact-dir",
        str(art),
        "--artifact-key",
        "key-abc",
        "--backend",
        "eager",
        "--served-name",
        MODEL,
        "--termination-log",
        str(art.parent / "serve.termlog"),
        *SHAPE,
        metrics_port=True,
    )
    assert proc.probe("/health/startup") in (0, 503)
    proc.wait_started(STARTUP_TIMEOUT)
    return proc


def test_probes_when_serving(engine: EngineProcess) -> None:
    assert engine.probe("/health/startup") == 200
    assert engine.probe("/health/ready") == 200
    assert engine.probe("/health/live") == 200


def test_models_and_completion(engine: EngineProcess) -> None:
    models = httpx.get(engine.url + "/v1/models", timeout=TIMEOUT).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    resp = httpx.post(
        engine.url + "/v1/completions",
        json={"model": MODEL, "prompt": "hello world", "max_tokens": 5, "ignore_eos": True},
        timeout=TIMEOUT,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["completion_tokens"] == 5
    assert isinstance(body["choices"][0]["text"], str)


def test_chat_completion(engine: EngineProcess) -> None:
    resp = httpx.post(
        engine.url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "what is the capital of france"}],
            "max_tokens": 5,
        },
        timeout=TIMEOUT,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["role"] == "assistant"


def test_streaming_completion(engine: EngineProcess) -> None:
    result = stream_completion(engine.url, MODEL, "hello world", max_tokens=12)
    assert result.done.wait(120)
    assert result.error is None and result.status == 200
    assert result.got_done and not result.error_events
    assert result.completion_tokens == 12
    assert result.text_chunks >= 2, "the completion did not arrive as a stream"


def test_metrics_on_their_own_port_only(engine: EngineProcess) -> None:
    """--metrics-port: /metrics there, not on the public port (nor vLLM's, through the proxy),
    so a NetworkPolicy can admit Prometheus to the metrics and nothing else."""
    public = httpx.get(engine.url + "/metrics", timeout=TIMEOUT)
    assert public.status_code == 404, public.text[:300]
    assert f"metrics are served on port {engine.metrics_port}" in public.text
    assert "vllm:" not in public.text
    assert httpx.get(metrics_url(engine) + "/v1/models", timeout=TIMEOUT).status_code == 404
    assert httpx.get(metrics_url(engine) + "/health/ready", timeout=TIMEOUT).status_code == 404


def test_metrics_present(engine: EngineProcess) -> None:
    text = httpx.get(metrics_url(engine) + "/metrics", timeout=TIMEOUT).text
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "spyre_engine_startup_phase_seconds",
        "spyre_engine_artifact_info",
        "spyre_engine_draining",
        "spyre_engine_inflight_requests",
        "spyre_engine_requests_rejected_while_draining_total",
        # the plugin's own series (sendnn_inference/v1/metrics/stats_logger.py), listed in
        # engine/README.md
        "sendnn:decode_batch",
        "sendnn:paused",
        "sendnn:pause_events_total",
        "sendnn:resume_events_total",
    ):
        assert metric_values(text, name), f"{name} missing"
    assert "spyre_engine_artifact_info{artifact_dir=" in text and 'key="key-abc"' in text
    assert metric_values(text, "spyre_engine_draining") == [0.0]
    phases = [ln for ln in text.splitlines() if ln.startswith("spyre_engine_startup_phase")]
    assert any('phase="total"' in ln for ln in phases)
    # The artifact was checked against its manifest before vLLM started (issue 14).
    assert any('phase="verify"' in ln for ln in phases)


def test_prefix_cache_counters_move_on_shared_prefix(engine: EngineProcess) -> None:
    prefix = long_text(300)
    queries0 = metric(metrics_url(engine), "vllm:prefix_cache_queries_total")
    hits0 = metric(metrics_url(engine), "vllm:prefix_cache_hits_total")
    for suffix in (" first question", " another question"):
        resp = httpx.post(
            engine.url + "/v1/completions",
            json={"model": MODEL, "prompt": prefix + suffix, "max_tokens": 2},
            timeout=TIMEOUT,
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["prompt_tokens"] > 256  # more than two 128-token chunks
    assert metric(metrics_url(engine), "vllm:prefix_cache_queries_total") > queries0
    assert metric(metrics_url(engine), "vllm:prefix_cache_hits_total") > hits0


def _gauge_samples_inside_a_stream(engine: EngineProcess) -> list[float]:
    """Poll the KV-cache gauge during one stream; keep the samples taken wholly while tokens were
    still arriving: after the first event came and before four fifths of them had. A sample's
    request started and ended inside that window, so the server read the gauge while the request
    held its blocks. On a loaded machine a stream can end before the poller gets a sample in (CI
    once saw two samples, both outside), so the caller tries again rather than reads them."""
    samples: list[tuple[float, float, float]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            start = time.monotonic()
            try:
                value = metric(metrics_url(engine), "vllm:kv_cache_usage_perc")
            except httpx.HTTPError:
                continue
            samples.append((start, time.monotonic(), value))
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    result = stream_completion(engine.url, MODEL, long_text(200, offset=5), max_tokens=250)
    assert result.done.wait(180)
    stop.set()
    poller.join(5)
    assert result.got_done, result.error
    times = result.event_times
    opened, cutoff = times[0], times[len(times) * 4 // 5]
    return [value for start, end, value in samples if opened < start and end < cutoff]


def test_kv_cache_gauge_rises_during_a_stream(engine: EngineProcess) -> None:
    inside: list[float] = []
    for _ in range(5):
        inside = _gauge_samples_inside_a_stream(engine)
        if inside:
            break
    assert inside, "no gauge sample fell inside any of 5 streams"
    assert max(inside) > 0.0, inside
    assert metric(metrics_url(engine), "spyre_engine_inflight_requests") == 0
