"""The operator's /metrics text: the per-model gauges the chart's alerts read, in a format
Prometheus parses (checked by `promtool check metrics` and prometheus_client's parser)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.runtime.metrics import render

from .samples import GENERATE, model

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(
    not shutil.which(PROMTOOL), reason="promtool not installed: apt-get install prometheus"
)


def cond(type_: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "m"}


def controller(*models: dict[str, Any]) -> Controller:
    index = {(m["metadata"]["namespace"], m["metadata"]["name"]): [m] for m in models}
    return Controller(client=None, caches=Caches({"models": index}))  # type: ignore[arg-type]


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(name, labels) -> value, parsed by prometheus_client (which unescapes label values)."""
    parser = pytest.importorskip("prometheus_client.parser")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


SERVING = model("granite", {**GENERATE, "replicas": 2}, status={
    "readyReplicas": 1,
    "artifact": {"attempts": 1},
    "conditions": [cond("Ready", "True", "Serving"), cond("ArtifactReady", "True",
                   "ArtifactAvailable"), cond("Degraded", "False", "AsExpected"),
                   cond("Stalled", "False", "AsExpected")],
})
NEW = model("fresh", GENERATE, ns="team-b")  # no status yet, replicas defaulted by the CRD


def test_model_gauges() -> None:
    got = samples(render(controller(SERVING, NEW)))
    ids = {"namespace": "ns", "model": "granite"}
    for type_, status, reason in (("Ready", "True", "Serving"),
                                  ("ArtifactReady", "True", "ArtifactAvailable"),
                                  ("Degraded", "False", "AsExpected"),
                                  ("Stalled", "False", "AsExpected")):
        assert got[key("spyre_operator_model_condition", **ids, type=type_, status=status,
                       reason=reason)] == 1
    conds = [k for k in got if k[0] == "spyre_operator_model_condition"]
    assert len(conds) == 4  # one per model and type; the new model has none yet
    assert got[key("spyre_operator_model_desired_replicas", **ids)] == 2
    assert got[key("spyre_operator_model_ready_replicas", **ids)] == 1
    assert got[key("spyre_operator_model_artifact_attempts", **ids)] == 1
    fresh = {"namespace": "team-b", "model": "fresh"}
    assert got[key("spyre_operator_model_desired_replicas", **fresh)] == 1
    assert got[key("spyre_operator_model_ready_replicas", **fresh)] == 0
    assert key("spyre_operator_model_artifact_attempts", **fresh) not in got


def test_label_values_are_escaped() -> None:
    # A condition's reason is a free string to the API server (another client may write one).
    odd = 'Bad"Reason\\with\nnewline'
    m = model("odd", GENERATE, status={"conditions": [cond("Ready", "False", odd)]})
    text = render(controller(m))
    assert 'reason="Bad\\"Reason\\\\with\\nnewline"' in text
    got = samples(text)
    assert got[key("spyre_operator_model_condition", namespace="ns", model="odd",
                   type="Ready", status="False", reason=odd)] == 1


def test_a_deleted_model_loses_its_series() -> None:
    c = controller(SERVING, NEW)
    assert 'model="granite"' in render(c)
    del c.caches.indices["models"][("ns", "granite")]
    text = render(c)
    assert 'model="granite"' not in text
    assert 'model="fresh"' in text
    # with no model at all the families stay declared, with no series
    del c.caches.indices["models"][("team-b", "fresh")]
    text = render(c)
    assert "model=" not in text
    assert "# TYPE spyre_operator_model_condition gauge" in text


def test_existing_series_unchanged() -> None:
    """Tests, the benchmark and dashboards read these names and labels as they were."""
    c = controller(SERVING)
    c.stats.reconciles, c.stats.errors = 3, 1
    c.stats.namespace_reconciles["ns"] = 3
    c.applier.writes["patch Deployment"] = 2
    c.requests[("GET", "pods")] = 4
    got = samples(render(c))
    p = "spyre_operator_"
    for k, v in ((key(p + "reconciles_total"), 3), (key(p + "reconcile_errors_total"), 1),
                 (key(p + "namespace_reconciles_total", namespace="ns"), 3),
                 (key(p + "writes_total", verb="patch", kind="Deployment"), 2),
                 (key(p + "api_requests_total", verb="GET", resource="pods"), 4),
                 (key(p + "skipped_writes_total"), 0), (key(p + "queue_depth"), 0),
                 (key(p + "leader"), 1), (key(p + "conflicts_total"), 0),
                 (key(p + "conflicting_models"), 0)):
        assert got[k] == v, k
    assert got[key(p + "max_rss_bytes")] > 1e6


def test_standby_replica_reports_not_leader() -> None:
    c = controller(SERVING)
    c.active.clear()
    assert samples(render(c))[key("spyre_operator_leader")] == 0


@needs_promtool
def test_promtool_accepts_the_exposition() -> None:
    odd = model("odd", GENERATE, status={"conditions": [cond("Ready", "False", 'a"b\\c\nd')]})
    text = render(controller(SERVING, NEW, odd))
    res = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
