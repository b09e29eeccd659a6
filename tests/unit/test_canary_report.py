"""Issue 44, "a verdict needs evidence": the operator reads each canary pod's own count
(``GET /health/canary``) before it promotes. The answer comes from a pod's port: parsed as
hostile (size, JSON, types), read with a timeout, and the engine's route and shape are the
operator's (compared here, not assumed)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from spyre_engine import canary
from spyre_operator.control.observe import read_report
from spyre_operator.decide.canary_report import (
    MAX_REPORT_BYTES,
    REPORT_PATH,
    SERVED_PATH,
    CanaryReport,
    ServedReport,
    parse_report,
    parse_served,
)


def test_the_engines_report_parses_as_the_operator_reads_it() -> None:
    b = canary.CanaryBounds(seconds=60, max_error_ratio=0.1, min_requests=3)
    t = canary.Tally()
    t.add(200, 0.2)
    t.add(500, 0.4)
    body = json.dumps(canary.report(b, t, 12.0)).encode()
    assert parse_report(body) == CanaryReport(judged=2, errors=1)


def test_the_route_is_the_engines() -> None:
    import inspect

    import spyre_contract as contract
    from spyre_engine import serve

    # one spelling for both (spyre_contract), and the engine routes it
    assert REPORT_PATH == contract.CANARY_REPORT_PATH
    routes = inspect.getsource(serve.EngineServer._start_http)
    assert "add_get(contract.CANARY_REPORT_PATH," in routes


@pytest.mark.parametrize("body", [
    b"", b"[]", b'"x"', b"{}", b'{"canary": false, "judged": 9, "errors": 0}',
    b'{"canary": true, "judged": "9", "errors": 0}', b'{"canary": true, "judged": 9.0, '
    b'"errors": 0}', b'{"canary": true, "judged": true, "errors": 0}',
    b'{"canary": true, "judged": -1, "errors": 0}', b'{"canary": true, "judged": 1}',
    b'{"canary": true, "judged": 1, "errors": 2}',
    b'{"canary": true, "judged": 10000000000000, "errors": 0}',
    b'{"canary": true, "judged": 1, "errors": 0, "pad": "' + b"x" * MAX_REPORT_BYTES + b'"}',
    b"\xff\xfe",
])  # fmt: skip
def test_anything_but_a_report_is_an_error_never_a_count(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_report(body)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=300),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                 lambda c: st.lists(c, max_size=4) | st.dictionaries(
                     st.sampled_from(["canary", "judged", "errors", "x"]), c, max_size=4),
                 max_leaves=10).map(lambda d: json.dumps(d).encode()),
))  # fmt: skip
def test_fuzzed_answers_give_a_valid_count_or_a_value_error(body: bytes) -> None:
    try:
        r = parse_report(body)
    except ValueError:
        return
    assert type(r.judged) is int and type(r.errors) is int and 0 <= r.errors <= r.judged


def _serve(handler: Any) -> Any:
    async def start() -> tuple[web.AppRunner, int]:
        app = web.Application()
        app.router.add_get(REPORT_PATH, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner, port

    return start


def _read(handler: Any) -> CanaryReport | str:
    import aiohttp

    async def run() -> CanaryReport | str:
        runner, port = await _serve(handler)()
        try:
            async with aiohttp.ClientSession() as s:
                return await read_report(s, "127.0.0.1", port)
        finally:
            await runner.cleanup()

    return asyncio.run(run())


def test_reading_a_pod_over_http() -> None:
    async def good(_: web.Request) -> web.Response:
        return web.json_response({"canary": True, "judged": 7, "errors": 1})

    async def huge(_: web.Request) -> web.Response:
        return web.Response(body=b'{"canary": true, "judged": 7, "errors": 0}' + b" " * 10**6)

    async def refused(_: web.Request) -> web.Response:
        return web.json_response({"canary": False}, status=404)

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPFound("http://169.254.169.254/")

    assert _read(good) == CanaryReport(judged=7, errors=1)
    assert "4096 bytes" in str(_read(huge))
    assert "HTTP 404" in str(_read(refused))
    assert "HTTP 302" in str(_read(redirect)), "a redirect is not followed"


def test_a_pod_that_does_not_answer_in_time_is_unread(monkeypatch: Any) -> None:
    import spyre_operator.control.observe as observe

    monkeypatch.setattr(observe, "REPORT_TIMEOUT_SECONDS", 0.2)

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    assert "TimeoutError" in str(_read(slow))


# ---- /health/served: every serving pod's figures, the baseline comparison's (issue 44, 5)

#: vLLM's /metrics as its v1 loggers write them (two model names: both added up), and series
#: the comparison does not read.
VLLM_METRICS = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="a"} 3.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="a"} 4.0
vllm:time_to_first_token_seconds_count{model_name="a"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="a"} 0.5
vllm:time_to_first_token_seconds_count{model_name="b"} 1.0
vllm:time_to_first_token_seconds_sum{model_name="b"} 0.25
# HELP vllm:request_time_per_output_token_seconds Histogram of time_per_output_token_seconds.
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_count{model_name="a"} 4.0
vllm:request_time_per_output_token_seconds_sum{model_name="a"} 0.08
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_count{model_name="a"} 60.0
vllm:inter_token_latency_seconds_sum{model_name="a"} 9.0
"""


def test_vllms_histograms_are_read_and_taken_since_ready() -> None:
    got = canary.vllm_latency(VLLM_METRICS)
    assert got == canary.Latency(ttft_sum=0.75, ttft_count=5, tpot_sum=0.08, tpot_count=4)
    assert got.since(canary.Latency(0.5, 4, 0.05, 3)) == canary.Latency(0.25, 1, 0.03, 1)
    # a counter that went down (vLLM restarted): all of it
    assert got.since(canary.Latency(9.0, 9, 0.0, 0)) == got
    assert canary.vllm_latency("") == canary.Latency()


def test_the_engines_served_report_parses_as_the_operator_reads_it() -> None:
    t = canary.Tally()
    t.add(200, 0.25)
    t.add(503, 0.5)
    got = canary.vllm_latency(VLLM_METRICS)
    body = json.dumps(canary.served_report(t, got)).encode()
    assert parse_served(body) == ServedReport(2, 1, 0.75, ttft=(0.75, 5), tpot=(0.08, 4))
    unread = json.dumps(canary.served_report(t, None)).encode()
    assert parse_served(unread) == ServedReport(2, 1, 0.75)


def test_the_served_route_is_the_engines() -> None:
    import inspect

    import spyre_contract as contract
    from spyre_engine import serve

    # one spelling for both (spyre_contract), and the engine routes it
    assert SERVED_PATH == contract.SERVED_REPORT_PATH
    routes = inspect.getsource(serve.EngineServer._start_http)
    assert "add_get(contract.SERVED_REPORT_PATH," in routes


@pytest.mark.parametrize("body", [
    b"", b"{}", b'{"served": false, "judged": 1, "errors": 0, "secondsSum": 1}',
    b'{"served": true, "judged": 1, "errors": 0}',
    b'{"served": true, "judged": 1, "errors": 0, "secondsSum": -1}',
    b'{"served": true, "judged": 1, "errors": 0, "secondsSum": NaN}',
    b'{"served": true, "judged": 1, "errors": 0, "secondsSum": true}',
    b'{"served": true, "judged": 1, "errors": 0, "secondsSum": 1, "latency": []}',
    b'{"served": true, "judged": 1, "errors": 0, "secondsSum": 1, "latency": {"ttftSum": 1}}',
    b'{"served": true, "judged": 1, "errors": 0, "secondsSum": 1, "latency": {"ttftSum": '
    b'Infinity, "ttftCount": 1, "tpotSum": 0, "tpotCount": 0}}',
    b'{"served": true, "judged": 1, "errors": 2, "secondsSum": 1}',
])  # fmt: skip
def test_anything_but_a_served_report_is_an_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_served(body)


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
        ["served", "judged", "errors", "secondsSum", "latency", "ttftSum", "ttftCount",
         "tpotSum", "tpotCount"]), c, max_size=6),
    max_leaves=14).map(lambda d: json.dumps(d).encode()))  # fmt: skip
def test_fuzzed_served_answers_give_valid_figures_or_a_value_error(body: bytes) -> None:
    try:
        r = parse_served(body)
    except ValueError:
        return
    assert 0 <= r.errors <= r.judged and 0 <= r.seconds
    for pair in (r.ttft, r.tpot):
        assert pair is None or (pair[0] >= 0 and type(pair[1]) is int and pair[1] >= 0)
