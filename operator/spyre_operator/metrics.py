"""The operator's own Prometheus metrics (reconciles, errors, writes by kind, queue depth)."""

from __future__ import annotations

import resource
from collections import Counter
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from .controller import Controller


def render(controller: Controller) -> str:
    """Prometheus text exposition of the controller's counters."""
    s = controller.stats
    lines = [
        "# HELP spyre_operator_reconciles_total Reconciles run.",
        "# TYPE spyre_operator_reconciles_total counter",
        f"spyre_operator_reconciles_total {s.reconciles}",
        "# HELP spyre_operator_reconcile_errors_total Reconciles that raised.",
        "# TYPE spyre_operator_reconcile_errors_total counter",
        f"spyre_operator_reconcile_errors_total {s.errors}",
        "# HELP spyre_operator_reconcile_seconds_total Time spent reconciling.",
        "# TYPE spyre_operator_reconcile_seconds_total counter",
        f"spyre_operator_reconcile_seconds_total {s.reconcile_seconds:.6f}",
        "# HELP spyre_operator_namespace_reconciles_total Reconciles run, by model namespace.",
        "# TYPE spyre_operator_namespace_reconciles_total counter",
        *(f'spyre_operator_namespace_reconciles_total{{namespace="{ns}"}} {n}'
          for ns, n in sorted(s.namespace_reconciles.items())),
        "# HELP spyre_operator_writes_total API writes by verb and kind.",
        "# TYPE spyre_operator_writes_total counter",
    ]
    for key, n in sorted(controller.applier.writes.items()):
        verb, kind = key.split(" ", 1)
        lines.append(f'spyre_operator_writes_total{{verb="{verb}",kind="{kind}"}} {n}')
    lines += [
        "# HELP spyre_operator_namespace_writes_total API writes by the namespace written to.",
        "# TYPE spyre_operator_namespace_writes_total counter",
    ]
    for ns, n in sorted(controller.applier.namespace_writes.items()):
        lines.append(f'spyre_operator_namespace_writes_total{{namespace="{ns}"}} {n}')
    lines += [
        "# HELP spyre_operator_api_requests_total API requests the reconcile made (not kopf's"
        " watches), by verb and resource.",
        "# TYPE spyre_operator_api_requests_total counter",
    ]
    for (verb, res), n in sorted(controller.requests.items()):
        lines.append(f'spyre_operator_api_requests_total{{verb="{verb}",resource="{res}"}} {n}')
    lines += [
        "# HELP spyre_operator_skipped_writes_total Writes skipped because nothing changed.",
        "# TYPE spyre_operator_skipped_writes_total counter",
        f"spyre_operator_skipped_writes_total {controller.applier.skipped}",
        "# HELP spyre_operator_queue_depth Models queued or being reconciled.",
        "# TYPE spyre_operator_queue_depth gauge",
        f"spyre_operator_queue_depth {len(controller.queue)}",
        "# HELP spyre_operator_leader Whether this replica may write.",
        "# TYPE spyre_operator_leader gauge",
        f"spyre_operator_leader {1 if controller.active.is_set() else 0}",
        "# HELP spyre_operator_conflicts_total Times another operator install was found writing"
        " a SpyreModel this one watches (overlapping watch scopes; see the OperatorConflict"
        " Events).",
        "# TYPE spyre_operator_conflicts_total counter",
        f"spyre_operator_conflicts_total {s.conflicts}",
        "# HELP spyre_operator_conflicting_models SpyreModels this install leaves alone because"
        " another install writes them.",
        "# TYPE spyre_operator_conflicting_models gauge",
        f"spyre_operator_conflicting_models {len(controller.yielded)}",
        "# HELP spyre_operator_max_rss_bytes Peak resident set size.",
        "# TYPE spyre_operator_max_rss_bytes gauge",
        f"spyre_operator_max_rss_bytes {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}",
    ]
    return "\n".join(lines) + "\n"


def request_resource(path: str) -> str:
    """The resource (and subresource) of an API path: /api/v1/namespaces/ns/pods -> pods."""
    parts = [p for p in path.split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:]  # drop api/v1 or apis/group/v1
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    if len(parts) >= 3:
        return f"{parts[0]}/{parts[2]}"
    return parts[0] if parts else "namespaces"


def count_requests(client: Any, counter: Counter[tuple[str, str]]) -> bool:
    """Count every request a lightkube client sends, by (verb, resource).

    The API server's ``apiserver_request_total`` carries no user agent, so the operator counts
    its own requests (the benchmark and the fault tests read them). Uses an httpx event hook on
    the client's transport; returns False if lightkube's internals have moved.
    """
    inner = getattr(getattr(client, "_client", None), "_client", None)
    hooks = getattr(inner, "event_hooks", None)
    if inner is None or hooks is None:
        return False

    async def hook(request: Any) -> None:
        counter[(request.method, request_resource(request.url.path))] += 1

    hooks.setdefault("request", []).append(hook)
    inner.event_hooks = hooks
    return True


async def start_metrics_server(controller: Controller, port: int) -> web.AppRunner:
    """Serve /metrics on ``port``."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=render(controller), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
