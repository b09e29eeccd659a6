"""The operator's own Prometheus metrics (reconciles, errors, writes by kind, queue depth) and
the state of the SpyreModels it watches (conditions, replicas, compile attempts)."""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Mapping
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
    lines += model_lines(controller.caches.indices.get("models") or {})
    return "\n".join(lines) + "\n"


def label_value(value: object) -> str:
    """A label value escaped for the text exposition format (backslash, quote, newline)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def model_lines(models: Mapping[Any, Any]) -> list[str]:
    """Gauges of every SpyreModel in the ``models`` index (kopf's slim copies, with status).

    Read from the watch cache, so every replica reports them, the standby ones too (alerts
    take the max per model); a model deleted from the cache has no series at the next scrape.
    """
    conditions, desired, ready, attempts = [], [], [], []
    for key in sorted(list(models.keys())):
        body = next(iter(models[key]), None)
        if body is None:
            continue
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        status = body.get("status") or {}
        ids = (f'namespace="{label_value(meta.get("namespace", key[0]))}",'
               f'model="{label_value(meta.get("name", key[1]))}"')
        for cond in status.get("conditions") or []:
            if not cond.get("type"):
                continue
            conditions.append(
                f'spyre_operator_model_condition{{{ids},type="{label_value(cond["type"])}",'
                f'status="{label_value(cond.get("status", ""))}",'
                f'reason="{label_value(cond.get("reason", ""))}"}} 1'
            )
        desired.append(f"spyre_operator_model_desired_replicas{{{ids}}} "
                       f"{_number(spec.get('replicas'), 1)}")
        ready.append(f"spyre_operator_model_ready_replicas{{{ids}}} "
                     f"{_number(status.get('readyReplicas'), 0)}")
        artifact = status.get("artifact") or {}
        if artifact.get("attempts") is not None:
            attempts.append(f"spyre_operator_model_artifact_attempts{{{ids}}} "
                            f"{_number(artifact['attempts'], 0)}")
    return [
        "# HELP spyre_operator_model_condition A SpyreModel's condition: one series per model"
        " and type, with its current status and reason.",
        "# TYPE spyre_operator_model_condition gauge",
        *conditions,
        "# HELP spyre_operator_model_desired_replicas A SpyreModel's spec.replicas.",
        "# TYPE spyre_operator_model_desired_replicas gauge",
        *desired,
        "# HELP spyre_operator_model_ready_replicas A SpyreModel's status.readyReplicas.",
        "# TYPE spyre_operator_model_ready_replicas gauge",
        *ready,
        "# HELP spyre_operator_model_artifact_attempts Precompile Jobs run for the model's"
        " current artifact key on its claim (status.artifact.attempts).",
        "# TYPE spyre_operator_model_artifact_attempts gauge",
        *attempts,
    ]


def _number(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


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
