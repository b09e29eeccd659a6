"""The operator's own Prometheus metrics, through ``prometheus_client``.

Each controller has its own registry (:class:`Instruments`; tests run several controllers in one
process) with

- histograms the controller observes as it works: ``reconcile_duration_seconds`` by outcome
  (``ok``, ``error``: raised, ``timeout``: cut off at the reconcile deadline) and
  ``queue_wait_seconds`` (from a model entering the work queue to a worker taking it);
- a collector that reads, at scrape time, the counters the controller keeps for its own use
  (``Controller.stats``, the applier's writes, the API requests :func:`counting_client`
  counts), its queue and leader state, and the SpyreModels in its watch cache (per-model
  condition and replica gauges the chart's alerts read). A model deleted from the cache has no
  series at the next scrape.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import ssl
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
from aiohttp import web
from lightkube import AsyncClient, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from ..control.controller import Controller
    from .metrics_auth import MetricsAuth

log = logging.getLogger(__name__)

PREFIX = "spyre_operator_"
#: The classic text format, which generate_latest writes for these names and every Prometheus
#: reads (the installed prometheus_client labels it 1.0.0, newer than Prometheus 2 knows).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: A reconcile takes milliseconds (all from the watch cache) to the 120 s deadline.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
#: A model waits in the queue for nothing (idle workers) to minutes (a backlog of hundreds).
QUEUE_WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
OUTCOMES = ("ok", "error", "timeout")


class Instruments:
    """The histograms a controller observes, in the registry its /metrics serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.reconcile_duration = Histogram(
            PREFIX + "reconcile_duration_seconds",
            "Time one reconcile took, by outcome (ok; error: it raised; timeout: cut off at"
            " the reconcile deadline).",
            labelnames=("outcome",), buckets=RECONCILE_BUCKETS, registry=self.registry,
        )
        for outcome in OUTCOMES:
            self.reconcile_duration.labels(outcome)  # every series exists from the start
        self.queue_wait = Histogram(
            PREFIX + "queue_wait_seconds",
            "Time from a model entering the work queue to a worker taking it.",
            buckets=QUEUE_WAIT_BUCKETS, registry=self.registry,
        )

    def attach(self, controller: Controller) -> None:
        """Serve ``controller``'s counters and models from this registry too."""
        self.registry.register(ControllerCollector(controller))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def render(controller: Controller) -> str:
    """The controller's metrics in the Prometheus text format."""
    return controller.instruments.render().decode()


class ControllerCollector:
    """Reads one controller's counters, queue, leader state and models at scrape time."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def collect(self) -> Iterator[Metric]:
        c, s = self.controller, self.controller.stats
        yield _counter("reconciles", "Reconciles run.", s.reconciles)
        yield _counter("reconcile_errors", "Reconciles that raised.", s.errors)
        yield _counter("reconcile_seconds", "Time spent reconciling.", s.reconcile_seconds)
        yield _counter("namespace_reconciles", "Reconciles run, by model namespace.",
                       labels=("namespace",),
                       values=[((ns,), n) for ns, n in sorted(s.namespace_reconciles.items())])
        yield _counter("writes", "API writes by verb and kind.", labels=("verb", "kind"),
                       values=[(tuple(k.split(" ", 1)), n)
                               for k, n in sorted(c.applier.writes.items())])
        yield _counter("namespace_writes", "API writes by the namespace written to.",
                       labels=("namespace",),
                       values=[((ns,), n) for ns, n in sorted(c.applier.namespace_writes.items())])
        yield _counter("api_requests", "API requests the reconcile made (not kopf's watches), by"
                       " verb and resource.", labels=("verb", "resource"),
                       values=sorted(c.requests.items()))
        yield _counter("skipped_writes", "Writes skipped because nothing changed.",
                       c.applier.skipped)
        yield _gauge("queue_depth", "Models queued or being reconciled.", len(c.queue))
        yield _gauge("leader", "Whether this replica may write (1: leading).",
                     1 if c.active.is_set() else 0)
        yield _counter("conflicts", "Times another operator install was found writing a"
                       " SpyreModel this one watches (overlapping watch scopes; see the"
                       " OperatorConflict Events).", s.conflicts)
        yield _gauge("status_fields_pruned", "Status fields the API server dropped from the "
                     "operator's writes (an installed CRD older than the operator).",
                     len(getattr(c.applier, "pruned", ()) or ()))
        yield _gauge("conflicting_models", "SpyreModels this install leaves alone because"
                     " another install writes them.", len(c.status.yielded))
        yield _gauge("max_rss_bytes", "Peak resident set size.",
                     resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        yield from model_families({k: [v] for k, v in c.caches.values("models").items()})


def model_families(models: Mapping[Any, Any]) -> Iterator[Metric]:
    """Gauges of every SpyreModel in the ``models`` index (kopf's slim copies, with status).

    Read from the watch cache, so every replica reports them, the standby ones too (the alerts
    take the max per model).
    """
    ids = ("namespace", "model")
    conditions = GaugeMetricFamily(
        PREFIX + "model_condition", "A SpyreModel's condition: one series per model and type,"
        " with its current status and reason.", labels=(*ids, "type", "status", "reason"))
    desired = GaugeMetricFamily(PREFIX + "model_desired_replicas",
                                "A SpyreModel's spec.replicas.", labels=ids)
    ready = GaugeMetricFamily(PREFIX + "model_ready_replicas",
                              "A SpyreModel's status.readyReplicas.", labels=ids)
    attempts = GaugeMetricFamily(
        PREFIX + "model_artifact_attempts", "Precompile Jobs run for the model's current"
        " artifact key on its claim (status.artifact.attempts).", labels=ids)
    for key in sorted(list(models.keys())):  # a copy: the watch updates the index
        body = next(iter(models[key]), None)
        if body is None:
            continue
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        status = body.get("status") or {}
        model = [str(meta.get("namespace", key[0])), str(meta.get("name", key[1]))]
        for cond in status.get("conditions") or []:
            if cond.get("type"):
                conditions.add_metric([*model, str(cond["type"]), str(cond.get("status", "")),
                                       str(cond.get("reason", ""))], 1)
        desired.add_metric(model, _number(spec.get("replicas"), 1))
        ready.add_metric(model, _number(status.get("readyReplicas"), 0))
        artifact = status.get("artifact") or {}
        if artifact.get("attempts") is not None:
            attempts.add_metric(model, _number(artifact["attempts"], 0))
    yield from (conditions, desired, ready, attempts)


def _number(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _counter(name: str, doc: str, value: float | None = None, labels: tuple[str, ...] = (),
             values: Iterable[tuple[tuple[str, ...], float]] = ()) -> CounterMetricFamily:
    family = CounterMetricFamily(PREFIX + name, doc, value=value, labels=labels or None)
    for label_values, v in values:
        family.add_metric(list(label_values), v)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


# ------------------------------------------------------------------ API requests


def request_resource(path: str) -> str:
    """The resource (and subresource) of an API path: /api/v1/namespaces/ns/pods -> pods."""
    parts = [p for p in path.split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:]  # drop api/v1 or apis/group/v1
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    if len(parts) >= 3:
        return f"{parts[0]}/{parts[2]}"
    return parts[0] if parts else "namespaces"


class CountingTransport(httpx2.AsyncBaseTransport):
    """An httpx transport that counts each request by (verb, resource), then sends it with
    ``inner``. It sits where a request leaves the client: after auth, once per retry."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, counter: Counter[tuple[str, str]]):
        self.inner = inner
        self.counter = counter

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.counter[(request.method, request_resource(request.url.path))] += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def counting_client(counter: Counter[tuple[str, str]], *, http2: bool = False,
                    config: KubeConfig | None = None, **kwargs: Any) -> AsyncClient:
    """A lightkube ``AsyncClient`` (``kwargs`` as its own) whose requests are counted in
    ``counter`` by (verb, resource).

    The API server's ``apiserver_request_total`` has no user-agent label, so the operator
    counts its own requests (the benchmark and the fault tests read them). It uses lightkube's
    public ``transport`` argument. A transport given to httpx replaces the one httpx would build
    from the client's TLS settings, so the inner transport gets the TLS context lightkube would
    use (the kubeconfig's, in a pod the service account's CA and client certificate) from
    lightkube's own ``verify_cluster``.
    """
    single = (config or KubeConfig.from_env()).get()
    assert single is not None and single.user is not None, "no kubeconfig context with a user"
    inner = httpx2.AsyncHTTPTransport(
        verify=verify_cluster(single.cluster, single.user, single.abs_file), http2=http2
    )
    return AsyncClient(config=single, http2=http2, transport=CountingTransport(inner, counter),
                       **kwargs)


# ------------------------------------------------------------------ the /metrics endpoint


#: How often a TLS certificate on disk is checked for a new one (a Secret's rotation).
TLS_RELOAD_SECONDS = 60.0


def tls_context(cert_dir: str) -> ssl.SSLContext:
    """A server context from ``cert_dir``'s ``tls.crt`` and ``tls.key`` (a mounted
    ``kubernetes.io/tls`` Secret: cert-manager's, or OpenShift's service CA's); TLS 1.2 or
    newer. Raises ``OSError``/``ssl.SSLError`` when the files are missing or do not match."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert_dir)
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert_dir: str) -> None:
    d = Path(cert_dir)
    ctx.load_cert_chain(d / "tls.crt", d / "tls.key")


def _tls_stamp(cert_dir: str) -> tuple[float, ...]:
    d = Path(cert_dir)
    return tuple((d / f).stat().st_mtime for f in ("tls.crt", "tls.key"))


async def _reload_tls(ctx: ssl.SSLContext, cert_dir: str) -> None:
    """Load a renewed certificate into the serving context (new connections use it): a
    Secret's files change in place when cert-manager or the service CA rotates them."""
    stamp = _tls_stamp(cert_dir)
    while True:
        await asyncio.sleep(TLS_RELOAD_SECONDS)
        try:
            now = _tls_stamp(cert_dir)
            if now != stamp:
                _load_chain(ctx, cert_dir)
                stamp = now
                log.info("/metrics: loaded the renewed certificate from %s", cert_dir)
        except (OSError, ssl.SSLError) as e:  # mid-rotation: the next check reads it again
            log.warning("/metrics: the certificate in %s could not be loaded: %s", cert_dir, e)


class MetricsServer:
    """The running /metrics endpoint (``cleanup`` stops it)."""

    def __init__(self, runner: web.AppRunner, reload: asyncio.Task[None] | None) -> None:
        self.runner = runner
        self._reload = reload

    async def cleanup(self) -> None:
        if self._reload is not None:
            self._reload.cancel()
        await self.runner.cleanup()


async def start_metrics_server(controller: Controller, port: int, *,
                               auth: MetricsAuth | None = None,
                               tls_dir: str | None = None,
                               host: str = "0.0.0.0") -> MetricsServer:
    """Serve the controller's /metrics on ``port``: to anyone (``auth`` None), or to a bearer
    token whose user may get /metrics (metrics_auth.py); over HTTPS with ``tls_dir``'s
    certificate, else plain HTTP."""

    async def handle(request: web.Request) -> web.Response:
        if auth is not None:
            decision = await auth.decide(request.headers.get("Authorization"))
            if not decision.allowed:
                headers = {"WWW-Authenticate": 'Bearer realm="spyre-operator"'} \
                    if decision.status == 401 else {}
                return web.Response(status=decision.status, text=decision.reason + "\n",
                                    headers=headers)
        return web.Response(body=controller.instruments.render(),
                            headers={"Content-Type": CONTENT_TYPE})

    ctx = tls_context(tls_dir) if tls_dir else None
    if auth is not None and ctx is None:
        log.warning("/metrics asks for bearer tokens over plain HTTP: pass --metrics-tls-dir "
                    "(the chart's operator.metricsTLS.secretName) so they are not sent in the "
                    "clear")
    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ctx).start()
    reload = asyncio.create_task(_reload_tls(ctx, tls_dir)) if ctx and tls_dir else None
    return MetricsServer(runner, reload)
