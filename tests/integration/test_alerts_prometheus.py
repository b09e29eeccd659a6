"""The chart's alerts, evaluated by a real Prometheus on the series it scraped from a real
operator (kwok plays the pods).

A Prometheus process (Debian's ``/usr/bin/prometheus``, on loopback) scrapes the operator's
``/metrics`` every second the way the chart's monitor does (``honorLabels: true``, the target's
``namespace`` and ``pod``) and loads the chart's rendered PrometheusRule groups, unchanged
except for ``for: 0s`` (the thresholds' waiting is promtool's part, tests/unit/test_alerts.py).
One model compiles and serves, one model's precompile fails. Prometheus' own rule engine must
then fire exactly the model alerts the models' status calls for, no operator alert, and every
operator series a rule reads must exist in what it scraped (a renamed series or label makes a
rule silently match nothing: the promtool tests cannot see that, their input is hand-written).
Every dashboard query over the operator's series must return data from the same Prometheus.

The engine-fed rules' series are checked against a real engine's ``/metrics`` by
tests/engine/test_dashboard_metrics.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane, wait_until
from tests.dashboards import dashboards, is_operator_metric, metric_names, queries, substitute
from tests.prometheus import Prometheus, Target, available

from ..unit.test_alerts import ENABLED, needs_promtool
from ..unit.test_chart_lint import by_kind, needs_helm, render
from .conftest import Kube, OperatorProcess
from .test_precompile_lifecycle import SHAPE_B, spec

pytestmark = [pytest.mark.integration, needs_helm, needs_promtool]

OPERATOR_POD = "spyre-model-operator-0"
#: The chart's release namespace: the operator alerts match its series on it.
RELEASE_NAMESPACE = "spyre-system"


def rule_groups() -> list[dict[str, Any]]:
    """The chart's rule groups, evaluated every second and with every ``for`` at 0s."""
    (rule,) = by_kind(render(*ENABLED, namespace=RELEASE_NAMESPACE), "PrometheusRule")
    groups = rule["spec"]["groups"]
    for g in groups:
        g["interval"] = "1s"
        for r in g["rules"]:
            if "for" in r:
                r["for"] = "0s"
    return groups  # type: ignore[no-any-return]


class AlertingPrometheus(Prometheus):
    def __init__(self, directory: Path, operator_port: int) -> None:
        super().__init__(directory, [Target(f"127.0.0.1:{operator_port}", {
            "namespace": RELEASE_NAMESPACE, "pod": OPERATOR_POD})], rule_groups=rule_groups())

    def firing(self, namespace: str) -> set[tuple[str, str]]:
        """(alert, model) of the alerts firing for ``namespace``'s models, and operator
        alerts as (alert, "")."""
        out = set()
        for a in self.alerts():
            labels = a["labels"]
            if a["state"] != "firing":
                continue
            if labels.get("model") is not None and labels.get("namespace") == namespace:
                out.add((labels["alertname"], labels["model"]))
            elif labels["alertname"].startswith("SpyreOperator"):
                out.add((labels["alertname"], ""))
        return out


@pytest.fixture
def prometheus(control_plane: ControlPlane, operator: OperatorProcess,
               tmp_path: Path) -> Iterator[AlertingPrometheus]:
    if not available():
        pytest.skip("prometheus not installed: apt-get install prometheus")
    p = AlertingPrometheus(tmp_path / "prometheus", operator.metrics_port)
    try:
        wait_until(lambda: p.query("up") and p.query("up")[0]["value"][1] == "1", 60,
                   "Prometheus scraping the operator")
        yield p
    finally:
        p.stop()


def condition(model: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (model.get("status") or {}).get("conditions") or []
                 if c["type"] == type_), {})


def expected_model_alerts(model: dict[str, Any]) -> set[str]:
    """The model alerts the status in the API calls for (the rules' intent, in Python)."""
    status = model.get("status") or {}
    ready, degraded, artifact = (condition(model, t) for t in ("Ready", "Degraded",
                                                                 "ArtifactReady"))
    want = set()
    if ready.get("status") != "True" and ready.get("reason") not in ("Compiling",
                                                                    "ScaledToZero"):
        want.add("SpyreModelNotReady")
    if degraded.get("status") == "True":
        want.add("SpyreModelDegraded")
    if artifact.get("status") == "False" and (
            artifact.get("reason") != "Compiling"
            or int((status.get("artifact") or {}).get("attempts") or 0) > 1):
        want.add("SpyrePrecompileFailing")
    if (model["spec"].get("replicas", 1)) > (status.get("readyReplicas") or 0):
        want.add("SpyreModelReplicasUnavailable")
    if condition(model, "CacheVolumeReady").get("reason") == "ClaimNearlyFull":
        want.add("SpyreModelCacheNearlyFull")
    return want


def test_alerts_and_dashboard_on_the_series_a_real_prometheus_scraped(
    kube: Kube, prometheus: AlertingPrometheus, namespace: str,
) -> None:
    kube.apply_model("serving", spec())
    # another shape: its own artifact key and Job (one key shares one Job)
    kube.apply_model("failing", spec(SHAPE_B, podAnnotations={"kwok.spyre.dev/fail": "true"}))
    kube.wait_condition("serving", "Ready", timeout=120)
    kube.wait(lambda: condition(kube.model("failing"), "ArtifactReady").get("reason")
              not in (None, "Compiling"), 120, "failing's precompile failed")

    # Prometheus' rule engine, on what it scraped, agrees with the API on every model alert.
    def agree() -> bool:
        models = {n: kube.model(n) for n in ("serving", "failing")}
        want = {(a, n) for n, m in models.items() for a in expected_model_alerts(m)}
        got = {(a, m) for a, m in prometheus.firing(namespace) if m}
        return want == got

    try:
        wait_until(agree, 60, "the model alerts Prometheus fires to match the models' status")
    except TimeoutError:
        models = {n: kube.model(n).get("status") for n in ("serving", "failing")}
        raise AssertionError(f"firing {prometheus.firing(namespace)}; status {models}") from None
    got = prometheus.firing(namespace)
    # The cases this test is for did happen: the failing model alerts, the serving one not.
    assert ("SpyrePrecompileFailing", "failing") in got, got
    assert ("SpyreModelNotReady", "failing") in got, got
    assert not {a for a, m in got if m == "serving"}, got
    # The operator is up and leading (reconcile errors of other tests' models may alert).
    assert not {a for a, m in got if a in ("SpyreOperatorDown", "SpyreOperatorNotLeading")}, got

    # Every operator series the rules read exists in what Prometheus scraped, with every label
    # the rules match it on.
    for group in rule_groups():
        for rule in group["rules"]:
            for name, matchers in SELECTOR.findall(rule["expr"]):
                if not name.startswith("spyre_operator_"):
                    continue
                series = prometheus.series(name)
                assert series, f"{rule['alert']}: no series {name} scraped"
                for label in MATCHER_LABEL.findall(matchers):
                    assert any(label in s for s in series), (
                        f"{rule['alert']}: {name} has no label {label}: {series[:3]}")


    # Every dashboard query that reads the operator's series (the operator row, the replicas
    # and the model conditions) returns data for the serving model.
    variables = {"$namespace": namespace, "$model": "serving", "$__rate_interval": "30s"}
    checked = 0
    for dash in dashboards().values():
        for expr in queries(dash):
            names = metric_names(expr)
            if expr.startswith("label_values") or not all(map(is_operator_metric, names)):
                continue
            expr = substitute(expr, variables)
            assert prometheus.query(expr), f"no data: {expr}"
            checked += 1
    assert checked >= 6, checked


#: A series selector in PromQL (name, its matchers) and a matcher's label name.
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{([^}]*)\})?")
MATCHER_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")


def test_operator_down_fires_when_no_scrape_answers(
    prometheus: AlertingPrometheus, operator: OperatorProcess,
) -> None:
    """absent(spyre_operator_leader{namespace=...}): true only once the series went stale."""
    assert not prometheus.query(f'spyre_operator_leader{{namespace='
                                f'"{RELEASE_NAMESPACE}"}} == 0')
    operator.stop()
    try:
        wait_until(lambda: ("SpyreOperatorDown", "") in prometheus.firing("-"), 90,
                   "SpyreOperatorDown firing (series stale ~5 min after the last scrape in "
                   "Prometheus 2.x; at once with staleness markers)")
    finally:
        operator.start()
