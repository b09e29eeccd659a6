"""``spyre-engine serve``: a thin asyncio front on the public port in front of ``vllm serve``.

vLLM runs in its own process group on a loopback port. The front answers the probes, proxies the
OpenAI API, appends ``spyre_engine_*`` to vLLM's ``/metrics`` and owns shutdown, because vLLM's
own SIGTERM handling either cuts in-flight streams (``--shutdown-timeout 0``) or waits for clients
that may never disconnect (larger timeouts, and always with tensor parallel 2). On SIGTERM:
readiness fails, new requests get 503, in-flight requests run until the drain deadline, the
remaining streams then get an error event and ``[DONE]``, and the vLLM group is terminated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import spyre_contract as contract
from aiohttp import web

from spyre_engine import answers, canary, guard
from spyre_engine.launch import (
    STOP_GRACE,
    Child,
    plugin_env,
    served_name,
    vllm_command,
)
from spyre_engine.metrics import EngineMetrics
from spyre_engine.ports import free_port
from spyre_engine.proxy import (
    ABORT_GRACE,
    BUSY_RETRY_AFTER_SECONDS,
    InFlight,
    Vllm,
    json_error,
    max_in_flight,
)
from spyre_engine.settings import ServeSettings
from spyre_engine.summary import (
    REASON_CANARY_FAILED,
    REASON_ENGINE_FAILED,
    REASON_OUTPUT_MISMATCH,
    FailureSummary,
    write_termination_log,
)

log = logging.getLogger(__name__)

# After the drain deadline: time for aborted streams to get their error event out (ABORT_GRACE,
# proxy.py), for vLLM to stop its engine core and workers after SIGTERM (its --shutdown-timeout,
# then SIGKILL to the group), and for the HTTP server to close connections. Their sum bounds
# the exit.
CHILD_STOP_GRACE = STOP_GRACE
HTTP_STOP_GRACE = 1.0
# Exit even if something above hangs (drain + 38 s); the operator allows drain timeout + 40 s
# (TERMINATION_MARGIN_SECONDS in operator/spyre_operator/desired/plan.py; a unit test compares).
HARD_EXIT_AFTER_DEADLINE = ABORT_GRACE + CHILD_STOP_GRACE + HTTP_STOP_GRACE + 2.0
#: While vLLM starts, how often the wrapper says what its /health answered (a slow start or a
#: hang is then visible in the log, not only as a probe that never succeeds).
STARTUP_REPORT_SECONDS = 30.0
#: A canary that broke its bounds fails readiness first and keeps answering this long before it
#: drains: the operator's readiness probe (every 5 s, 2 failures) and the endpoint update
#: (ENDPOINT_GRACE_SECONDS, 5 s) take it out of the Service first, so clients do not meet the
#: drain's 503s (tests/unit/test_canary.py compares them with the operator's).
CANARY_UNREADY_SECONDS = 15.0


class EngineServer:
    """The front: probes, metrics, the canary's judging and the shutdown state machine; which
    requests go through (the requests in flight and vLLM's own API: proxy.py)."""

    def __init__(
        self,
        settings: ServeSettings,
        model_path: str,
        metrics: EngineMetrics,
        process_started: float,
        references: list[answers.Answer] | None = None,
        tolerance: float = answers.DEFAULT_TOLERANCE,
    ) -> None:
        self.settings = settings
        self.model_path = model_path
        self.metrics = metrics
        self.process_started = process_started
        #: The artifact's reference answers, checked before Ready (None: no check).
        self.references = references if settings.output_check != "off" else None
        self.tolerance = settings.output_check_tolerance or tolerance
        #: Whether vLLM loads the plugin's GoldenTokenInjector for the check (not when the
        #: user names logits processors of their own: vLLM takes one --logits-processors).
        self.inject = self.references is not None and not any(
            a.split("=", 1)[0] == "--logits-processors" for a in settings.vllm_args)
        #: Why the engine stops with OutputMismatch (the check's summary), if it does.
        self.failure: FailureSummary | None = None
        #: --canary-seconds: the bounds the canary judges its own requests against.
        self.canary = (
            canary.CanaryBounds(
                settings.canary_seconds,
                settings.canary_max_error_ratio,
                settings.canary_min_requests,
                settings.canary_max_mean_latency,
            )
            if settings.canary_seconds > 0
            else None
        )
        self.tally = canary.Tally()
        #: Every pod's evidence since Ready, and vLLM's latency histograms then (the baseline
        #: comparison's figures: GET /health/served).
        self.served = canary.Tally()
        self.latency_at_ready = canary.Latency()
        #: monotonic end of the canary's window (set at Ready)
        self.canary_until: float | None = None
        self.faults = canary.FaultInjector(settings.fault_error_ratio)
        #: readiness fails (a canary that broke its bounds, before it drains)
        self.unready = False
        #: a failure that lets in-flight requests finish (the drain deadline) before exiting
        self.drain_on_failure = False
        #: serving.apiKey (the Secret's value, as vLLM reads it): the engine asks for it on
        #: every client route (guard.auth_refusal), not only where vLLM's middleware does.
        self.api_key = os.environ.get("VLLM_API_KEY") or None
        #: The largest request body read (guard.max_body_bytes of the model's context).
        #: Requests in flight at once (max_in_flight); past it 429 + Retry-After.
        self.max_in_flight = max_in_flight(settings)
        self.max_body = guard.max_body_bytes(
            max(w.prompt_len for w in settings.warmup_shapes)
            if settings.is_pooling and settings.warmup_shapes else settings.max_model_len)
        self.internal_port = settings.internal_port or free_port()
        self.upstream = f"http://127.0.0.1:{self.internal_port}"
        self.child: Child | None = None
        self.started = False
        self.draining = False
        self.engine_failed: str | None = None
        self.in_flight = InFlight(settings, metrics, self.upstream)
        self.vllm = Vllm(self.upstream)
        self._shutdown = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None

    # ----------------------------------------------------------------- lifecycle

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit 0) or until vLLM dies (exit 1)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=None),
            auto_decompress=False,
        )
        self.in_flight.session = self.vllm.session = self._session
        await self._start_http()
        env = plugin_env(self.settings, require_precompiled=True)
        cmd = vllm_command(
            self.settings,
            self.model_path,
            host="127.0.0.1",
            port=self.internal_port,
            prefix_caching=self.settings.prefix_caching,
            logits_processors=[answers.INJECTOR] if self.inject else None,
        )
        log.info("Starting vLLM on %s: %s", self.upstream, " ".join(cmd))
        spawned = time.monotonic()
        self.child = Child(cmd, env)
        watcher = asyncio.create_task(self._watch_child(spawned))
        await self._shutdown.wait()
        watcher.cancel()
        graceful = not self.engine_failed or self.drain_on_failure
        await self.in_flight.drain(self.settings.drain_timeout if graceful else 0.0)
        await loop.run_in_executor(None, self.child.stop, CHILD_STOP_GRACE)
        log.info("vLLM stopped (exit code %s)", self.child.proc.returncode)
        await self._stop_http()
        if self.engine_failed:
            write_termination_log(
                self.settings.termination_log,
                self.failure
                or FailureSummary(reason=REASON_ENGINE_FAILED, message=self.engine_failed),
            )
            return 1
        return 0

    def _on_signal(self, sig: int) -> None:
        if self.draining:
            log.info("Received %s again while draining", signal.Signals(sig).name)
            return
        log.info(
            "Received %s: draining for up to %.1fs",
            signal.Signals(sig).name,
            self.settings.drain_timeout,
        )
        self.draining = True
        self.metrics.draining.set(1)
        self.metrics.ready.set(0)
        arm_hard_exit(self.settings.drain_timeout + HARD_EXIT_AFTER_DEADLINE, lambda: self.child)
        self._shutdown.set()

    async def _watch_child(self, spawned: float) -> None:
        """Mark started when vLLM is healthy; trigger shutdown (exit 1) if vLLM dies."""
        assert self.child is not None and self._session is not None
        last_said, answer = spawned, "no answer"
        while not self.started:
            if not self.child.alive():
                self._fail(
                    f"vLLM exited with code {self.child.proc.returncode} during start-up: "
                    f"{self.child.last_error()}"
                )
                return
            if time.monotonic() - last_said >= STARTUP_REPORT_SECONDS:
                last_said = time.monotonic()
                log.info(
                    "vLLM not serving yet after %.0fs (its /health: %s)",
                    last_said - spawned,
                    answer,
                )
            try:
                async with self._session.get(
                    self.upstream + "/health", timeout=aiohttp.ClientTimeout(total=2)
                ) as resp:
                    answer = f"HTTP {resp.status}"
                    if resp.status == 200:
                        if not await self._answers_right():
                            return
                        now = time.monotonic()
                        self.metrics.startup_phase_seconds.labels("engine_start").set(now - spawned)
                        self.metrics.startup_phase_seconds.labels("total").set(
                            now - self.process_started
                        )
                        self.latency_at_ready = await self.vllm.latency() or canary.Latency()
                        self.started = True
                        self.metrics.ready.set(1)
                        if self.canary is not None:
                            self.canary_until = now + self.canary.seconds
                            log.info("Serving as a canary for %.0fs: %s", self.canary.seconds,
                                     self.canary)
                        log.info(
                            "vLLM is serving after %.1fs (%.1fs since process start)",
                            now - spawned,
                            now - self.process_started,
                        )
                        break
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                answer = f"{type(exc).__name__}: {exc}"[:200]
            await asyncio.sleep(0.25)
        while True:
            await asyncio.sleep(0.5)
            if not self.child.alive():
                self._fail(
                    f"vLLM exited with code {self.child.proc.returncode}: {self.child.last_error()}"
                )
                return

    async def _answers_right(self) -> bool:
        """Before Ready: the artifact's reference prompts answered and compared (answers.py).
        False once the engine is stopping with OutputMismatch (enforce)."""
        if self.references is None:
            return True
        t0 = time.monotonic()
        try:
            verdict = await answers.check(
                self.vllm.complete, served_name(self.settings, self.model_path), self.references,
                self.tolerance, inject=self.inject)
        except (ValueError, aiohttp.ClientError, OSError) as exc:
            self._fail(f"checking the answers against the artifact's reference failed: {exc}")
            return False
        self.metrics.startup_phase_seconds.labels("output_check").set(time.monotonic() - t0)
        if verdict.ok:
            log.info("Output check passed: %s", verdict.message())
            return True
        if self.settings.output_check == "warn":
            log.warning("Output check failed (output_check=warn, serving anyway): %s",
                        verdict.message())
            return True
        self.failure = FailureSummary(reason=REASON_OUTPUT_MISMATCH, message=verdict.message(),
                                      output_check=verdict.summary())
        self._fail(f"{REASON_OUTPUT_MISMATCH}: {verdict.message()}")
        return False

    def _fail(self, message: str) -> None:
        if self.draining:
            return
        log.error("%s", message)
        self.engine_failed = message
        self.draining = True
        self.metrics.ready.set(0)
        self._shutdown.set()

    # ------------------------------------------------------------------- HTTP

    async def _start_http(self) -> None:
        # A body larger than the model's context can hold is refused (413): unread when its
        # length is declared (proxy), and aiohttp stops reading a chunked one there.
        app = web.Application(client_max_size=self.max_body)
        app.router.add_get(contract.STARTUP_PATH, self.startup_probe)
        app.router.add_get(contract.READY_PATH, self.readiness_probe)
        app.router.add_get(contract.LIVE_PATH, self.liveness_probe)
        app.router.add_get(contract.CANARY_REPORT_PATH, self.canary_report)
        app.router.add_get(contract.SERVED_REPORT_PATH, self.served_report)
        metrics_port = self.settings.metrics_port
        app.router.add_get(
            "/metrics", self.metrics_endpoint if metrics_port is None else self.metrics_elsewhere
        )
        app.router.add_route("*", "/{tail:.*}", self.proxy)
        self._runner = await self._listen(app, self.settings.port)
        log.info("Listening on %s:%d", self.settings.host, self.settings.port)
        if metrics_port is not None:
            metrics_app = web.Application()
            metrics_app.router.add_get("/metrics", self.metrics_endpoint)
            self._metrics_runner = await self._listen(metrics_app, metrics_port)
            log.info("Metrics on %s:%d/metrics", self.settings.host, metrics_port)

    async def _listen(self, app: web.Application, port: int) -> web.AppRunner:
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=HTTP_STOP_GRACE
        )
        await runner.setup()
        await web.TCPSite(runner, self.settings.host, port, reuse_address=True).start()
        return runner

    async def _stop_http(self) -> None:
        for runner in (self._runner, self._metrics_runner):
            if runner is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(runner.cleanup(), HTTP_STOP_GRACE + 2)
        if self._session is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._session.close(), 1)

    async def startup_probe(self, request: web.Request) -> web.Response:
        """200 once vLLM has loaded the model and serves; 503 before."""
        if self.started:
            return web.json_response({"status": "started"})
        return web.json_response({"status": "starting"}, status=503)

    async def readiness_probe(self, request: web.Request) -> web.Response:
        """200 only when started and not draining."""
        if self.started and not self.draining and not self.unready:
            return web.json_response({"status": "ready"})
        status = "draining" if self.draining or self.unready else "starting"
        return web.json_response({"status": status}, status=503)

    async def canary_report(self, request: web.Request) -> web.Response:
        """A canary's counts for the operator (canary.report); 404 on a pod that is none."""
        if self.canary is None:
            return web.json_response({"canary": False}, status=404)
        left = None if self.canary_until is None else self.canary_until - time.monotonic()
        return web.json_response(canary.report(self.canary, self.tally, left))

    async def served_report(self, request: web.Request) -> web.Response:
        """What this pod served since Ready (canary.served_report); 503 before Ready."""
        if not self.started:
            return web.json_response({"served": False}, status=503)
        now = await self.vllm.latency()
        latency = None if now is None else now.since(self.latency_at_ready)
        return web.json_response(canary.served_report(self.served, latency))

    async def liveness_probe(self, request: web.Request) -> web.Response:
        """200 while healthy (also while loading and draining); 503 if vLLM died or hangs."""
        child = self.child
        if self.draining or child is None:
            return web.json_response({"status": "alive"})
        if not child.alive():
            return web.json_response({"status": "engine exited"}, status=503)
        if not self.started:
            return web.json_response({"status": "alive"})
        assert self._session is not None
        try:
            async with self._session.get(
                self.upstream + "/health", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                if resp.status == 200:
                    return web.json_response({"status": "alive"})
                return web.json_response({"status": f"engine health {resp.status}"}, status=503)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return web.json_response({"status": f"engine unreachable: {exc!r}"}, status=503)

    async def metrics_elsewhere(self, request: web.Request) -> web.Response:
        """The public port's /metrics when --metrics-port moved them (not proxied to vLLM's)."""
        return web.json_response(
            {"error": f"metrics are served on port {self.settings.metrics_port}"}, status=404
        )

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        """vLLM's series (when it is up) followed by ``spyre_engine_*``."""
        parts: list[bytes] = []
        if self.started and self.child is not None and self.child.alive():
            body = await self.vllm.metrics()
            if body is not None:
                parts.append(body if body.endswith(b"\n") else body + b"\n")
        parts.append(self.metrics.render())
        return web.Response(
            body=b"".join(parts),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        """Forward anything else to vLLM, tracking it as in flight; inference requests are
        counted (``spyre_engine_requests_total``) and judged by a canary."""
        if self.draining:
            self.metrics.rejected_draining.inc()
            return json_error(
                503, "The server is shutting down", "ServiceUnavailableError", close=True
            )
        # Client routes only (guard.py): vLLM's control routes never face clients.
        why = guard.route_refusal(request.method, request.raw_path) or guard.auth_refusal(
            request.raw_path, request.headers.get("Authorization"), self.api_key)
        if why is not None:
            return json_error(why.status, why.message, why.type)
        if (request.content_length or 0) > self.max_body:
            return json_error(
                413, f"the request body ({request.content_length} bytes) is larger than this "
                f"model's context could hold ({self.max_body} bytes at most)",
                "RequestEntityTooLarge", close=True)
        if not self.started:
            return json_error(503, "The model is still loading", "ServiceUnavailableError")
        if len(self.in_flight) >= self.max_in_flight:
            # At once, unread: a flood of clients cannot queue without bound in this pod.
            return json_error(
                429, f"this pod has {len(self.in_flight)} requests in flight, its limit "
                f"(serving.maxInFlight); retry in {BUSY_RETRY_AFTER_SECONDS}s",
                "TooManyRequests", retry_after=BUSY_RETRY_AFTER_SECONDS)
        if not canary.is_inference(request.method, request.path):
            return await self.in_flight.handle(request)
        t0 = time.monotonic()
        if self.faults.fails_next():
            resp: web.StreamResponse = json_error(
                500, "injected fault (--fault-error-ratio)", "InternalServerError"
            )
        else:
            resp = await self.in_flight.handle(request)
        self._answered(resp.status, time.monotonic() - t0)
        return resp

    def _answered(self, status: int, seconds: float) -> None:
        """Count an inference request; a canary in its window judges it, unless the client's
        request was at fault (4xx): that is no evidence about the artifact (canary.py)."""
        self.metrics.requests.labels(canary.status_class(status)).inc()
        self.metrics.request_seconds.observe(seconds)
        if self.started and canary.is_evidence(status):
            self.served.add(status, seconds)
        if self.canary is None or self.canary_until is None or self.unready or self.draining:
            return
        if not canary.is_evidence(status):
            return
        if not canary.judging(self.canary, self.tally, time.monotonic() > self.canary_until):
            return
        self.tally.add(status, seconds)
        why = canary.verdict(self.canary, self.tally)
        if why is not None:
            self._canary_failed(why)

    def _canary_failed(self, why: str) -> None:
        log.error("%s: %s; leaving the Service, then draining", REASON_CANARY_FAILED, why)
        self.unready = True
        self.metrics.ready.set(0)
        self.failure = FailureSummary(reason=REASON_CANARY_FAILED, message=why)
        self.drain_on_failure = True

        def stop() -> None:
            self._fail(f"{REASON_CANARY_FAILED}: {why}")

        asyncio.get_running_loop().call_later(CANARY_UNREADY_SECONDS, stop)

def arm_hard_exit(seconds: float, child: Callable[[], Child | None]) -> None:
    """Last resort: kill the vLLM group and exit 0 if the orderly path hangs ``seconds``."""

    def hard_exit() -> None:
        log.error("Shutdown did not finish in time; exiting hard")
        if (running := child()) is not None:
            running.signal_group(signal.SIGKILL)
        os._exit(0)

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()


def artifact_labels(settings: ServeSettings, model_path: str) -> dict[str, str]:
    """Labels of ``spyre_engine_artifact_info``."""
    return {
        "key": settings.artifact_key or "",
        "backend": settings.backend,
        "model": served_name(settings, model_path),
        "artifact_dir": str(Path(settings.artifact_dir)),
    }


def serve(
    settings: ServeSettings,
    model_path: str,
    metrics: EngineMetrics,
    started: float,
    references: list[answers.Answer] | None = None,
    tolerance: float = answers.DEFAULT_TOLERANCE,
) -> int:
    """Run the front until shutdown; the exit code of ``spyre-engine serve``."""
    metrics.artifact_info.labels(**artifact_labels(settings, model_path)).set(1)
    server = EngineServer(settings, model_path, metrics, started, references, tolerance)
    return asyncio.run(server.run())
