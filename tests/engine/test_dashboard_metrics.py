"""The metrics the chart's dashboard and the Inference Extension read, on a real engine.

One real ``spyre-engine serve`` (vLLM + the Spyre plugin on CPU, eager) answers a few
completions, a stream among them, so that every histogram has samples; then its ``/metrics``
must carry every series the shipped Grafana dashboard queries (the operator's own series
excepted: tests/unit/test_dashboard.py checks them on the operator's exposition) and the series
of the Gateway API Inference Extension's model-server protocol
(docs/proposals/003-model-server-protocol in the extension's repository).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from spyre_engine.testing.process import EngineProcess

from tests.cluster.controlplane import wait_until
from tests.dashboards import (
    dashboard_metrics,
    dashboards,
    exposed_names,
    is_operator_metric,
    metric_names,
    queries,
    substitute,
)
from tests.prometheus import MODEL_LABEL, Prometheus, Target, available

from .conftest import SHAPE, STARTUP_TIMEOUT, precompile_eager
from .sse import TIMEOUT, stream_completion

pytestmark = pytest.mark.engine

MODEL = "tiny"

#: The extension's model-server protocol, as vLLM names it (the endpoint picker's defaults).
PROTOCOL_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running",
                   "vllm:kv_cache_usage_perc")


#: The engine below requires an API key (serving.apiKey sets it the same way, as VLLM_API_KEY).
API_KEY = "test-key-1"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


#: The engine's limits here (issue 45, 5): small, so a test can reach them.
MAX_IN_FLIGHT, BODY_TIMEOUT = 2, 10


@pytest.fixture(scope="module")
def engine(start_engine, tiny_model: Path,  # type: ignore[no-untyped-def]
           tmp_path_factory: pytest.TempPathFactory) -> EngineProcess:
    art = tmp_path_factory.mktemp("dash-art")
    precompile_eager(tiny_model, art, "--artifact-key", "key-dash")
    proc: EngineProcess = start_engine(
        "--model", str(tiny_model), "--artifact-dir", str(art), "--artifact-key", "key-dash",
        "--backend", "eager", "--served-name", MODEL,
        "--termination-log", str(art.parent / "serve.termlog"), *SHAPE,
        "--max-in-flight", str(MAX_IN_FLIGHT), "--body-timeout", str(BODY_TIMEOUT),
        env={"VLLM_API_KEY": API_KEY},
    )
    proc.wait_started(STARTUP_TIMEOUT)
    return proc


#: The labels the chart's PodMonitor gives the engine's series.
TARGET_LABELS = {"namespace": "demo", "pod": "tiny-0", MODEL_LABEL: MODEL}


@pytest.fixture(scope="module")
def prometheus(engine: EngineProcess,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus | None]:
    """A real Prometheus scraping the engine every second, from before the load on."""
    if not available():
        yield None
        return
    p = Prometheus(tmp_path_factory.mktemp("prometheus"),
                   [Target(engine.url.removeprefix("http://"), TARGET_LABELS)])
    yield p
    p.stop()


@pytest.fixture(scope="module")
def metrics_text(engine: EngineProcess, prometheus: Prometheus | None) -> str:
    def not_found() -> None:  # an error the HTTP panel shows: a model not served here (404)
        r = httpx.post(engine.url + "/v1/completions", timeout=TIMEOUT, headers=AUTH,
                       json={"model": "no-such-model", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 404, (r.status_code, r.text)

    # A counter's first sample is no increase to rate(): one 404 before the scrapes start
    # counting, one during the load.
    not_found()
    if prometheus is not None:  # a few scrapes before the load: the rates see it start
        wait_until(lambda: prometheus.query("up == 1"), 30, "Prometheus scraping the engine")
        wait_until(lambda: prometheus.query("count_over_time(up[5m]) >= 3"), 60,
                   "three scrapes of the engine")
    not_found()
    for prompt in ("hello world", "hello world again"):
        r = httpx.post(engine.url + "/v1/completions", timeout=TIMEOUT, headers=AUTH,
                       json={"model": MODEL, "prompt": prompt, "max_tokens": 4})
        assert r.status_code == 200, r.text
    result = stream_completion(engine.url, MODEL, "a streamed answer", max_tokens=8,
                               headers=AUTH)
    assert result.done.wait(120) and result.status == 200
    if prometheus is not None:  # scraped twice after the load (every second)
        after = time.time()
        wait_until(lambda: prometheus.query(f"timestamp(up) > {after + 2:.3f}"), 60,
                   "two scrapes after the load")
    return httpx.get(engine.url + "/metrics", timeout=TIMEOUT).text


def test_every_engine_panel_returns_data_from_a_real_prometheus(
    metrics_text: str, prometheus: Prometheus | None,
) -> None:
    """Each dashboard query over the engine's series, as Grafana would send it (variables
    substituted), returns data from Prometheus after the load; the request, error and token
    rates are above zero (the operator's panels: tests/integration/test_alerts_prometheus.py)."""
    if prometheus is None:
        pytest.skip("prometheus not installed: apt-get install prometheus")
    variables = {"$namespace": TARGET_LABELS["namespace"], "$model": MODEL,
                 "$__rate_interval": "60s"}
    results: dict[str, list[dict[str, Any]]] = {}
    for dash in dashboards().values():
        for query in queries(dash):
            if query.startswith("label_values") or any(map(is_operator_metric,
                                                           metric_names(query))):
                continue
            expr = substitute(query, variables)
            results[query] = prometheus.query(expr)
            assert results[query], f"no data: {expr}"
    assert len(results) >= 10, sorted(results)
    positive = {name: False for name in ("vllm:request_success_total", "http_requests_total",
                                         "vllm:generation_tokens_total")}
    for query, result in results.items():
        for name in positive:
            if name in metric_names(query) and any(float(r["value"][1]) > 0 for r in result):
                positive[name] = True
    assert all(positive.values()), positive


def test_the_api_key_guards_every_client_route_not_probes_or_metrics(engine: EngineProcess) -> None:
    """VLLM_API_KEY (serving.apiKey) through the engine's front: every client route without
    the key, or with another, is 401; the kubelet's probes and Prometheus' scrape need none."""
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(engine.url + "/v1/completions", json=body, headers=headers,
                       timeout=TIMEOUT)
        assert r.status_code == 401, (headers, r.status_code, r.text)
    assert httpx.get(engine.url + "/v1/models", timeout=TIMEOUT).status_code == 401
    assert httpx.get(engine.url + "/v1/models", headers=AUTH, timeout=TIMEOUT).status_code == 200
    # Issue 45, 4: vLLM's own check covers /v1 and /v2 only; the engine asks on every client
    # route (/tokenize answered without the key before)
    tok = {"model": MODEL, "prompt": "hello"}
    r = httpx.post(engine.url + "/tokenize", json=tok, timeout=TIMEOUT)
    assert r.status_code == 401, (r.status_code, r.text)
    r = httpx.post(engine.url + "/tokenize", json=tok, headers=AUTH, timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["tokens"], (r.status_code, r.text)
    # Issue 45, 5: a body larger than the model's context could hold is refused unread (it
    # was buffered up to 64 MiB): the answer comes before any byte of it is sent
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: engine\r\n"
                  + f"Authorization: {AUTH['Authorization']}\r\n".encode()
                  + b"Content-Type: application/json\r\nContent-Length: 2097152\r\n\r\n")
        head = s.recv(65536).split(b"\r\n", 1)[0]
    assert b" 413 " in head, head
    for path in ("/health/startup", "/health/ready", "/health/live", "/metrics", "/health"):
        assert httpx.get(engine.url + path, timeout=TIMEOUT).status_code == 200, path


def test_every_dashboard_metric_is_exposed(metrics_text: str) -> None:
    wanted = dashboard_metrics()
    assert len(wanted) >= 10, wanted  # the extraction found the queries
    engine = {n for n in wanted if not is_operator_metric(n)}  # the operator's: tests/unit
    missing = sorted(engine - exposed_names(metrics_text))
    assert not missing, f"the dashboard queries series the engine does not expose: {missing}"


def test_model_server_protocol_metrics(metrics_text: str) -> None:
    names = exposed_names(metrics_text)
    for gauge in PROTOCOL_GAUGES:
        assert gauge in names, gauge
        assert f"# TYPE {gauge} gauge" in metrics_text
    # optional in the protocol: block size and block count for the prefix-cache scorer
    info = [ln for ln in metrics_text.splitlines() if ln.startswith("vllm:cache_config_info{")]
    assert info and 'block_size="' in info[0] and 'num_gpu_blocks="' in info[0], info


def test_every_engine_series_the_alerts_read_is_exposed(metrics_text: str) -> None:
    """The chart's engine-fed alerts (queue, KV cache) read series a real engine exports (the
    operator-fed ones: tests/integration/test_alerts_prometheus.py)."""
    from tests.unit.test_alerts import ENABLED
    from tests.unit.test_chart_lint import HELM, by_kind, render

    if not HELM.exists():
        pytest.skip(f"helm not built at {HELM}: run `make binaries`")
    (rule,) = by_kind(render(*ENABLED), "PrometheusRule")
    wanted = {name for g in rule["spec"]["groups"] for r in g["rules"]
              for name in metric_names(r["expr"]) if not name.startswith("spyre_operator_")}
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} <= wanted, wanted
    missing = sorted(wanted - exposed_names(metrics_text))
    assert not missing, f"the alerts read series the engine does not expose: {missing}"


def test_slow_clients_fill_the_in_flight_cap_get_408_and_the_next_request_429(
    engine: EngineProcess,
) -> None:
    """Issue 45, 5: clients that send their headers and then nothing hold a request slot
    each, until the body timeout answers them 408; meanwhile a request past the cap is
    answered 429 with Retry-After at once, and once they are gone requests are answered."""
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: engine\r\n"
            + f"Authorization: {AUTH['Authorization']}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 64\r\n\r\n")
    slow = [socket.create_connection((host, int(port)), timeout=60) for _ in range(MAX_IN_FLIGHT)]
    try:
        for s in slow:
            s.sendall(head)
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
        deadline = time.monotonic() + BODY_TIMEOUT - 2
        while True:  # until the engine holds both slow requests (each a moment to arrive)
            r = httpx.post(engine.url + "/v1/completions", json=body, headers=AUTH,
                           timeout=TIMEOUT)
            if r.status_code == 429 or time.monotonic() > deadline:
                break
            assert r.status_code == 200, r.text
        assert r.status_code == 429, (r.status_code, r.text)
        assert r.headers["retry-after"] == "1" and "requests in flight" in r.text, r.text
        for s in slow:
            answer = s.recv(65536).split(b"\r\n", 1)[0]
            assert b" 408 " in answer, answer
    finally:
        for s in slow:
            s.close()
    r = httpx.post(engine.url + "/v1/completions", json=body, headers=AUTH, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
