"""The operator's ``--log-format json`` (one JSON object per line, with kopf's object) and its
/metrics through prometheus_client: reconcile and queue histograms from the real workers, one
registry per controller, API requests counted through lightkube's public transport argument."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import urllib.request
from collections import Counter
from typing import Any

import httpx2
import pytest
from aiohttp import web
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Pod
from prometheus_client.parser import text_string_to_metric_families
from spyre_operator.cli import JsonFormatter, configure_logging, main
from spyre_operator.control.controller import Caches, Controller, WorkQueue
from spyre_operator.runtime import metrics


def test_json_log_lines() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("test.json")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        log.warning("reconcile %s/%s failed", "ns", "m")
        # kopf's per-object logger (kopf.ObjectLogger) passes the object's reference like this
        ref = {"apiVersion": "serving.spyre.dev/v1alpha1", "kind": "SpyreModel",
               "name": "m", "uid": "u1", "namespace": "ns"}
        log.info("Handler succeeded", extra={"k8s_ref": ref, "k8s_skip": False,
                                             "settings": object()})
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("oops")
    finally:
        log.removeHandler(handler)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 3
    first, second, third = lines
    assert first["level"] == "WARNING" and first["logger"] == "test.json"
    assert first["message"] == "reconcile ns/m failed"
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert set(first) == {"time", "level", "logger", "message"}
    assert second["object"] == ref and "settings" not in second and "k8s_skip" not in second
    assert "ValueError: bad" in third["exception"]


def test_log_format_option() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = []
    try:
        configure_logging("info", "json")
        (handler,) = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        root.handlers[:] = []
        configure_logging("debug", "text")
        assert not isinstance(root.handlers[0].formatter, JsonFormatter)
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    with pytest.raises(SystemExit):
        main(["run", "--all-namespaces", "--log-format", "xml"])


# ------------------------------------------------------------------ /metrics (metrics.py)

def samples_of(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition by (name, sorted labels), parsed by prometheus_client."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


DURATION = "spyre_operator_reconcile_duration_seconds"


def test_workers_observe_reconcile_durations_by_outcome_and_queue_waits() -> None:
    """The real workers: one reconcile returns after 30 ms, one raises, one passes the
    deadline; each outcome's histogram counts one, and each take from the queue one wait."""

    async def run() -> Controller:
        c = Controller(client=None, caches=Caches(), workers=1)  # type: ignore[arg-type]
        c.reconcile_deadline = 0.2

        async def reconcile_key(key: tuple[str, str]) -> None:
            if key[1] == "bad":
                raise RuntimeError("boom")
            await asyncio.sleep(0.03 if key[1] == "good" else 5)

        async def no_report(*_: Any) -> None:
            return None

        c.reconcile_key = reconcile_key  # type: ignore[method-assign]
        c.status.report_failure = no_report  # type: ignore[method-assign]
        c.start()
        for name in ("good", "bad", "hung"):
            c.enqueue([("ns", name)])
        while not (c.stats.errors == 2 and not c.queue._active):  # pytest-timeout bounds it
            await asyncio.sleep(0.05)
        await c.stop()
        return c

    c = asyncio.run(run())
    got = samples_of(metrics.render(c))
    for outcome in ("ok", "error", "timeout"):
        assert got[(DURATION + "_count", (("outcome", outcome),))] == 1, outcome
    ok = {float(dict(labels)["le"]): v for (name, labels), v in got.items()
          if name == DURATION + "_bucket" and dict(labels)["outcome"] == "ok"}
    assert sorted(ok) == [*metrics.RECONCILE_BUCKETS, float("inf")]
    # slept 30 ms: never under 25 ms; how far over depends on the machine's load
    assert ok[0.025] == 0 and ok[float("inf")] == 1, ok
    assert got[(DURATION + "_sum", (("outcome", "timeout"),))] >= 0.2
    assert got[("spyre_operator_queue_wait_seconds_count", ())] == 3
    assert got[("spyre_operator_reconcile_errors_total", ())] == 2


def test_queue_wait_counts_from_the_first_add() -> None:
    waits: list[float] = []

    async def run() -> None:
        q = WorkQueue(on_wait=waits.append)
        q.add(("ns", "m"))
        await asyncio.sleep(0.05)
        q.add(("ns", "m"), urgent=True)  # re-queued more urgently: still the first add's wait
        assert await q.get() == ("ns", "m")

    asyncio.run(run())
    assert len(waits) == 1 and waits[0] >= 0.05, waits


def test_each_controller_has_its_own_registry() -> None:
    a = Controller(client=None, caches=Caches())  # type: ignore[arg-type]
    b = Controller(client=None, caches=Caches())  # type: ignore[arg-type]
    a.instruments.reconcile_duration.labels("ok").observe(1.0)
    key = (DURATION + "_count", (("outcome", "ok"),))
    assert samples_of(metrics.render(a))[key] == 1
    assert samples_of(metrics.render(b))[key] == 0


def test_served_metrics_parse() -> None:
    c = Controller(client=None, caches=Caches())  # type: ignore[arg-type]
    c.stats.reconciles = 9

    async def scrape() -> tuple[str, str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        runner = await metrics.start_metrics_server(c, port)
        try:
            def get() -> tuple[str, str]:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.headers["Content-Type"], r.read().decode()

            return await asyncio.get_running_loop().run_in_executor(None, get)
        finally:
            await runner.cleanup()

    ctype, text = asyncio.run(scrape())
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    assert samples_of(text)[("spyre_operator_reconciles_total", ())] == 9


def kubeconfig(server: str) -> KubeConfig:
    return KubeConfig.from_dict({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}],
    })


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}


def test_counting_transport_counts_by_verb_and_resource() -> None:
    counter: Counter[tuple[str, str]] = Counter()
    seen: list[str] = []

    def respond(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("authorization", ""))
        return httpx2.Response(200, json=POD)

    transport = metrics.CountingTransport(httpx2.MockTransport(respond), counter)
    client = AsyncClient(config=kubeconfig("http://k8s.invalid"), transport=transport)

    async def calls() -> None:
        await client.get(Pod, "p", namespace="ns")
        await client.get(Pod, "p", namespace="ns")
        await client.patch(Pod, "p", {"metadata": {"labels": {"a": "b"}}}, namespace="ns")
        await client.close()

    asyncio.run(calls())
    assert counter == Counter({("GET", "pods"): 2, ("PATCH", "pods"): 1})
    assert seen == ["Bearer t"] * 3  # lightkube's auth still applies


def test_counting_client_talks_to_a_server() -> None:
    """counting_client builds the inner transport itself (TLS from the kubeconfig): a real
    request to a local HTTP server goes through, with lightkube's auth, and is counted."""
    counter: Counter[tuple[str, str]] = Counter()
    auth: list[str] = []

    async def run() -> None:
        async def pod(request: web.Request) -> web.Response:
            auth.append(request.headers.get("Authorization", ""))
            return web.json_response(POD)

        app = web.Application()
        app.router.add_get("/api/v1/namespaces/ns/pods/p", pod)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        try:
            client = metrics.counting_client(counter, config=kubeconfig(f"http://127.0.0.1:{port}"))
            got = await client.get(Pod, "p", namespace="ns")
            assert got.metadata is not None and got.metadata.name == "p"
            await client.close()
        finally:
            await runner.cleanup()

    asyncio.run(run())
    assert counter == Counter({("GET", "pods"): 1})
    assert auth == ["Bearer t"]
