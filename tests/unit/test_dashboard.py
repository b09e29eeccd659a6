"""The Grafana dashboard and the models' PodMonitor shipped in the chart, rendered offline.

Whether every series the dashboard reads exists on a real engine is checked in
tests/engine/test_dashboard_metrics.py; here: the panels asked for are there, the query
parser finds what it should, and the PodMonitor selects the pods the operator builds.
"""

from __future__ import annotations

import json
import re
from typing import Any

from spyre_operator.api import SpyreModelSpec
from spyre_operator.desired.deployment import build_deployment
from spyre_operator.desired.plan import plan_model

from tests.dashboards import (
    DASHBOARD_DIR,
    dashboards,
    exposed_names,
    is_operator_metric,
    metric_names,
    queries,
)

from .samples import GENERATE
from .test_chart_lint import MONITORING, by_kind, needs_helm, render

PANELS = {
    "KV-cache usage": {"vllm:kv_cache_usage_perc"},
    "Prefix-cache hit rate": {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"},
    "Queued and running requests": {"vllm:num_requests_waiting", "vllm:num_requests_running"},
    "Time to first token": {"vllm:time_to_first_token_seconds_bucket"},
    "Inter-token latency": {"vllm:inter_token_latency_seconds_bucket"},
    "Request rate and errors": {"vllm:request_success_total", "http_requests_total"},
    "Replicas: desired, ready, serving": {"spyre_operator_model_desired_replicas",
                                          "spyre_operator_model_ready_replicas"},
    "Artifact per pod": {"spyre_engine_artifact_info"},
    "Tokens per second": {"vllm:prompt_tokens_total", "vllm:generation_tokens_total"},
    "Operator: reconciles": {"spyre_operator_reconcile_duration_seconds_count",
                             "spyre_operator_queue_depth"},
    "Operator: reconcile time and queue wait (p95)": {
        "spyre_operator_reconcile_duration_seconds_bucket",
        "spyre_operator_queue_wait_seconds_bucket"},
    "Model conditions": {"spyre_operator_model_condition"},
}


def test_metric_names_of_promql() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, pod) (rate(vllm:x_bucket{a="b", c=~"$m"}'
            '[$__rate_interval]))) / clamp_min(sum without (pod) (y_total offset 5m), 1e-9)'
            ' and on (pod) count(z == 1)')
    assert metric_names(expr) == {"vllm:x_bucket", "y_total", "z"}
    assert metric_names('label_values(up{job="x"}, namespace)') == {"up"}


def test_dashboard_has_the_panels_and_reads_their_metrics() -> None:
    (dash,) = dashboards().values()
    by_title = {p["title"]: p for p in dash["panels"]}
    assert set(PANELS) <= set(by_title)
    for title, wanted in PANELS.items():
        read = {n for t in by_title[title].get("targets", []) for n in metric_names(t["expr"])}
        assert wanted <= read, (title, read)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    # every query of a model's series is scoped to the chosen namespace and model; the
    # operator row reads the operator's own series (its namespace is the operator's)
    for q in queries(dash):
        if q.startswith("label_values"):
            continue
        if all(is_operator_metric(n) and "_model_" not in n for n in metric_names(q)):
            continue
        assert 'namespace="$namespace"' in q, q
        assert '=~"$model"' in q, q


def test_every_operator_series_the_dashboard_reads_is_exposed() -> None:
    """The operator's series in the dashboard exist on its /metrics, with the labels the
    queries match (the engine's: tests/engine/test_dashboard_metrics.py)."""
    from spyre_operator.control.controller import Caches, Controller
    from spyre_operator.runtime.metrics import render

    from .test_metrics import SERVING

    models = {"models": {("ns", "granite"): [SERVING]}}
    c = Controller(client=None, caches=Caches(models))  # type: ignore[arg-type]
    text = render(c)
    exposed = exposed_names(text)
    wanted = {n for d in dashboards().values() for q in queries(d) for n in metric_names(q)
              if is_operator_metric(n)}
    assert len(wanted) >= 6, wanted
    assert not sorted(wanted - exposed), sorted(wanted - exposed)
    for label in ("model=", "namespace=", "type=", "status=", "reason=", "outcome="):
        assert label in text, label


@needs_helm
def test_dashboard_configmap_carries_the_sidecar_label() -> None:
    (cm,) = by_kind(render(), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((DASHBOARD_DIR / "spyre-models.json").read_text())
    assert json.loads(cm["data"]["spyre-models.json"]) == shipped
    (cm,) = by_kind(render("--set", "dashboards.annotations.grafana_folder=Spyre",
                           "--set", "dashboards.namespace=monitoring"), "ConfigMap")
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Spyre"}
    assert cm["metadata"]["namespace"] == "monitoring"
    assert not by_kind(render("--set", "dashboards.enabled=false"), "ConfigMap")


@needs_helm
def test_models_pod_monitor_selects_the_serving_pods_the_operator_builds() -> None:
    docs = render("--set", "monitoring.enabled=true", "--api-versions", MONITORING)
    (pm,) = [d for d in by_kind(docs, "PodMonitor") if d["metadata"]["name"].endswith("-models")]
    endpoints = pm["spec"]["podMetricsEndpoints"]
    # each serving pod is scraped once: on `http`, or on `metrics` when its /metrics have a
    # port of their own (serving.metricsPort; `http` answers 404 there)
    for serving, scraped in (({}, {"http"}), ({"metricsPort": 9100}, {"metrics"})):
        spec = SpyreModelSpec.model_validate({**GENERATE, "serving": serving})
        plan = plan_model("granite", "ns", "uid", spec)
        pod = build_deployment(plan, plan.key).to_dict()["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
        for label in pm["spec"]["podTargetLabels"]:
            assert label in labels, label
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports") or []}
        meta = {f"__meta_kubernetes_pod_annotation_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v
                for k, v in pod["metadata"].get("annotations", {}).items()}
        assert {e["port"] for e in endpoints
                if e["port"] in ports and not _dropped(e, meta)} == scraped, serving
    # without the Prometheus Operator's API nothing is rendered (and nothing fails)
    assert not by_kind(render("--set", "monitoring.enabled=true"), "PodMonitor")


def _dropped(endpoint: dict[str, Any], meta: dict[str, str]) -> bool:
    """Whether the endpoint's ``drop`` relabelings drop a target with these meta labels
    (Prometheus joins the source labels with ';' and anchors the regex)."""
    return any(
        r.get("action") == "drop" and re.fullmatch(
            r.get("regex", "(.*)"), ";".join(meta.get(n, "") for n in r["sourceLabels"]))
        for r in endpoint.get("relabelings", []))
