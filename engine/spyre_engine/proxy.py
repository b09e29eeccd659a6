"""The engine front's proxy half: the requests in flight to vLLM, each forwarded (streams as
they come) and tracked, so the drain can wait for them and, past its deadline, end each one
properly (an error event and ``[DONE]`` for a stream, a 503 before any byte was sent).

serve.py's :class:`~spyre_engine.serve.EngineServer` decides whether a request goes through
(probes, draining, guard, in-flight cap, canary); :class:`InFlight` carries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from spyre_engine import canary, guard
from spyre_engine.metrics import EngineMetrics
from spyre_engine.settings import ServeSettings

log = logging.getLogger(__name__)

# Headers that describe one hop, not the message (RFC 9110 7.6.1), plus the ones we recompute.
HOP_HEADERS = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)

DRAIN_ERROR_EVENT = (
    b"data: "
    + json.dumps(
        {
            "error": {
                "message": "The server is shutting down and the drain deadline passed",
                "type": "ServiceUnavailableError",
                "code": 503,
            }
        }
    ).encode()
    + b"\n\ndata: [DONE]\n\n"
)

ENGINE_ERROR_EVENT = (
    b"data: "
    + json.dumps(
        {
            "error": {
                "message": "The engine ended the stream",
                "type": "InternalServerError",
                "code": 500,
            }
        }
    ).encode()
    + b"\n\ndata: [DONE]\n\n"
)

#: After the drain deadline: time for aborted streams to get their error event out.
ABORT_GRACE = 2.0


def json_error(
    status: int, message: str, kind: str, close: bool = False, retry_after: int | None = None
) -> web.Response:
    headers = {"Connection": "close"} if close else {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status, headers=headers or None)


#: A client past the in-flight cap is asked to try again this soon (a request takes seconds).
BUSY_RETRY_AFTER_SECONDS = 1


def max_in_flight(settings: ServeSettings) -> int:
    """The in-flight cap: --max-in-flight, else 8 batches' worth of --max-num-seqs (vLLM
    queues what does not fit a batch), at least 64."""
    if settings.max_in_flight is not None:
        return settings.max_in_flight
    return max(64, 8 * settings.max_num_seqs)


@dataclass(eq=False)
class Flight:
    """One proxied request, so the drain can wait for it or abort it."""

    pump: asyncio.Task[web.StreamResponse] | None = None
    response: web.StreamResponse | None = None
    streaming: bool = False
    at_event_boundary: bool = True
    aborted: bool = False
    started: float = field(default_factory=time.monotonic)


class InFlight:
    """The requests in flight to vLLM at ``upstream`` (``session`` is set before the first)."""

    def __init__(self, settings: ServeSettings, metrics: EngineMetrics, upstream: str) -> None:
        self.settings = settings
        self.metrics = metrics
        self.upstream = upstream
        self.session: aiohttp.ClientSession | None = None
        self.flights: set[Flight] = set()
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self.flights)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        flight = Flight()
        self.flights.add(flight)
        self.metrics.inflight.inc()
        try:
            try:
                body = await asyncio.wait_for(request.read(), self.settings.body_timeout)
            except TimeoutError:
                return json_error(
                    408, f"the request body was not sent within {self.settings.body_timeout:g}s",
                    "RequestTimeout", close=True)
            # Parsed, not byte-matched (guard.py): the output check's key in any spelling is
            # refused (the injector raises inside vLLM's worker on a malformed expectation, and
            # vLLM treats that as fatal), a prompt that mentions it is served.
            why = guard.body_refusal(body) if request.method == "POST" else None
            if why is not None:
                return json_error(why.status, why.message, why.type)
            flight.pump = asyncio.create_task(self._forward(request, body, flight))
            try:
                return await flight.pump
            except asyncio.CancelledError:
                if not flight.aborted:
                    flight.pump.cancel()
                    raise
                return await self._aborted(flight)
        finally:
            self.flights.discard(flight)
            self.metrics.inflight.dec()
            self._changed.set()

    async def _forward(
        self, request: web.Request, body: bytes, flight: Flight
    ) -> web.StreamResponse:
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        url = self.upstream + str(request.rel_url)
        try:
            upstream = await self.session.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            )
        except (aiohttp.ClientError, OSError) as exc:
            return json_error(502, f"vLLM is unreachable: {exc}", "BadGateway")
        async with upstream:
            out_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS
            }
            if "text/event-stream" not in upstream.headers.get("Content-Type", ""):
                data = await upstream.read()
                return web.Response(status=upstream.status, body=data, headers=out_headers)
            resp = web.StreamResponse(status=upstream.status, headers=out_headers)
            flight.response = resp
            flight.streaming = True
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    flight.at_event_boundary = False
                    await resp.write(chunk)
                    flight.at_event_boundary = chunk.endswith(b"\n\n")
                await resp.write_eof()
            except ConnectionResetError:
                # The client went away; closing the upstream response aborts it in vLLM.
                log.info("Client disconnected from a stream")
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
                # vLLM went away mid-stream: end the stream properly rather than truncate it.
                log.warning("vLLM ended a stream abruptly: %r", exc)
                with contextlib.suppress(Exception):
                    prefix = b"" if flight.at_event_boundary else b"\n\n"
                    await asyncio.wait_for(resp.write(prefix + ENGINE_ERROR_EVENT), 1.0)
                    await asyncio.wait_for(resp.write_eof(), 1.0)
            return resp

    async def _aborted(self, flight: Flight) -> web.StreamResponse:
        """Finish a request cut by the drain deadline: an error event + [DONE], or a 503."""
        resp = flight.response
        if resp is None or not resp.prepared:
            return json_error(
                503,
                "The server is shutting down and the drain deadline passed",
                "ServiceUnavailableError",
                close=True,
            )
        with contextlib.suppress(Exception):
            prefix = b"" if flight.at_event_boundary else b"\n\n"
            await asyncio.wait_for(resp.write(prefix + DRAIN_ERROR_EVENT), ABORT_GRACE / 2)
            await asyncio.wait_for(resp.write_eof(), ABORT_GRACE / 2)
        return resp

    async def drain(self, seconds: float) -> None:
        """Wait for the requests in flight up to ``seconds``, then abort the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self.flights and loop.time() < deadline:
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
        if not self.flights:
            log.info("Drained: no request in flight")
            return
        log.warning("Drain deadline passed; aborting %d request(s)", len(self.flights))
        for flight in list(self.flights):
            flight.aborted = True
            self.metrics.aborted_at_deadline.inc()
            if flight.pump is not None and not flight.pump.done():
                flight.pump.cancel()
        end = loop.time() + ABORT_GRACE
        while self.flights and loop.time() < end:
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), end - loop.time())


class Vllm:
    """vLLM's own HTTP API at ``url``, as the front reads it (``session`` set before use)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session: aiohttp.ClientSession | None = None

    async def metrics(self) -> bytes | None:
        """vLLM's /metrics text now, or None when it does not answer."""
        if self.session is None:
            return None
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
            async with self.session.get(
                self.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                if resp.status == 200:
                    return await resp.read()
        return None

    async def latency(self) -> canary.Latency | None:
        """vLLM's latency histograms now (its /metrics), or None when unread."""
        body = await self.metrics()
        if body is None:
            return None
        try:
            return canary.vllm_latency(body.decode(errors="replace"))
        except ValueError:
            return None

    async def complete(self, body: dict[str, object]) -> dict[str, object]:
        """POST /v1/completions (with the model's API key, as a client sends it); the answer,
        ValueError unless 200."""
        assert self.session is not None
        headers = {"Content-Type": "application/json"}
        if os.environ.get("VLLM_API_KEY"):
            headers["Authorization"] = f"Bearer {os.environ['VLLM_API_KEY']}"
        async with self.session.post(self.url + "/v1/completions", json=body,
                                     headers=headers) as resp:
            data = await resp.read()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {data[:300]!r}")
            out: dict[str, object] = json.loads(data)
            return out
