"""The chart's alerts (templates/prometheusrule.yaml), checked by Prometheus' own rule engine:
the rendered PrometheusRule's groups go to `promtool check rules` and `promtool test rules`
with tests/unit/alerts_test.yaml (each alert fires when it should, and not for a model that is
Ready, at zero, compiling for the first time, or gone).

Needs the pinned helm (`make binaries`) and promtool (Debian: apt-get install prometheus);
without them these tests skip with that hint.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .test_chart_lint import CHART, MONITORING, by_kind, helm, needs_helm, render

HERE = Path(__file__).resolve().parent
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(
    not shutil.which(PROMTOOL), reason="promtool not installed: apt-get install prometheus"
)
ENABLED = ["--set", "monitoring.prometheusRule.enabled=true", "--api-versions", MONITORING]
ALERTS = {
    "SpyreOperatorDown", "SpyreOperatorNotLeading", "SpyreOperatorReconcileErrors",
    "SpyreModelNotReady", "SpyreModelDegraded", "SpyrePrecompileFailing",
    "SpyreModelReplicasUnavailable", "SpyreModelCacheNearlyFull", "SpyreModelQueueHigh",
    "SpyreModelKVCacheNearlyFull",
}


def groups(*values: str) -> list[dict[str, Any]]:
    (rule,) = by_kind(render(*ENABLED, *values), "PrometheusRule")
    return rule["spec"]["groups"]  # type: ignore[no-any-return]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def write_rules(path: Path, rule_groups: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False))
    return path


def run_tests(tmp_path: Path, rules: Path, tests: dict[str, Any]) -> None:
    tests = {**tests, "rule_files": [str(rules)]}
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    res = promtool("test", "rules", str(test_file))
    assert res.returncode == 0, res.stdout + res.stderr


@needs_helm
def test_off_by_default_and_needs_the_api() -> None:
    assert not by_kind(render(), "PrometheusRule")
    assert not by_kind(render("--set", "monitoring.prometheusRule.enabled=true"),
                       "PrometheusRule")
    (rule,) = by_kind(render(*ENABLED, "--set", "monitoring.prometheusRule.namespace=mon",
                             "--set", "monitoring.prometheusRule.labels.release=kps",
                             "--set", "monitoring.prometheusRule.alertLabels.team=ml"),
                      "PrometheusRule")
    assert rule["metadata"]["namespace"] == "mon"
    assert rule["metadata"]["labels"]["release"] == "kps"
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for r in rules:
        assert r["labels"]["severity"] in {"critical", "warning"}, r
        assert r["labels"]["team"] == "ml"
        assert r["annotations"]["summary"] and r["annotations"]["description"], r


@needs_helm
def test_lint_and_schema() -> None:
    res = helm("lint", "--strict", str(CHART), "--set", "monitoring.prometheusRule.enabled=true")
    assert "0 chart(s) failed" in res.stdout, res.stdout
    for bad in ("kvCacheUsageThreshold=2", "queueWaitingThreshold=-1", "modelNotReadyFor=soon",
                "unknown=1"):
        res = helm("template", "spyre", str(CHART), *ENABLED,
                   "--set", f"monitoring.prometheusRule.{bad}", check=False)
        assert res.returncode != 0, bad


@needs_helm
def test_operator_monitors_keep_the_model_namespace_label() -> None:
    for kind in ("ServiceMonitor", "PodMonitor"):
        docs = render("--set", "monitoring.enabled=true", "--api-versions", MONITORING,
                      "--set", f"monitoring.operator.kind={kind}")
        (operator,) = [d for d in by_kind(docs, kind) if not d["metadata"]["name"].endswith(
            "-models")]
        spec = operator["spec"]
        (endpoint,) = spec.get("endpoints") or spec["podMetricsEndpoints"]
        assert endpoint["honorLabels"] is True


@needs_helm
@needs_promtool
def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    rules = write_rules(tmp_path / "rules.yaml", groups())
    res = promtool("check", "rules", str(rules))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in res.stdout, res.stdout


@needs_helm
@needs_promtool
def test_alerts_fire_when_they_should_and_only_then(tmp_path: Path) -> None:
    """Expressions, durations and labels; the annotations are left out here (promtool
    compares them whole) and checked on one alert below."""
    rule_groups = groups()
    for g in rule_groups:
        for r in g["rules"]:
            r.pop("annotations", None)
    tests = yaml.safe_load((HERE / "alerts_test.yaml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]}
    assert tested == ALERTS
    run_tests(tmp_path, write_rules(tmp_path / "rules.yaml", rule_groups), tests)


@needs_helm
@needs_promtool
def test_annotations_expand(tmp_path: Path) -> None:
    (degraded,) = [r for g in groups() for r in g["rules"] if r["alert"] == "SpyreModelDegraded"]
    rules = write_rules(tmp_path / "rules.yaml", [{"name": "g", "rules": [degraded]}])
    labels = {"severity": "warning", "namespace": "team-b", "model": "m",
              "reason": "ImagePullFailed"}
    run_tests(tmp_path, rules, {"evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{
            "series": 'spyre_operator_model_condition{namespace="team-b", model="m",'
                      ' type="Degraded", status="True", reason="ImagePullFailed"}',
            "values": "1x30"}],
        "alert_rule_test": [{"eval_time": "20m", "alertname": "SpyreModelDegraded",
                             "exp_alerts": [{"exp_labels": labels, "exp_annotations": {
            "summary": "SpyreModel team-b/m is Degraded (ImagePullFailed).",
            "description": (
                "A problem users must fix: ImagePullFailed. The Degraded condition's message"
                " says what to do: `kubectl -n team-b describe spyremodel m`. A model serving"
                " its previous artifact keeps serving meanwhile."),
        }}]}],
    }]})


@needs_helm
@needs_promtool
def test_thresholds_follow_the_values(tmp_path: Path) -> None:
    rule_groups = groups("--set", "monitoring.prometheusRule.queueWaitingThreshold=100",
                         "--set", "monitoring.prometheusRule.modelNotReadyFor=1h")
    by_name = {r["alert"]: r for g in rule_groups for r in g["rules"]}
    assert by_name["SpyreModelQueueHigh"]["expr"].rstrip().endswith("> 100")
    assert by_name["SpyreModelNotReady"]["for"] == "1h"
    rules = write_rules(tmp_path / "rules.yaml", rule_groups)
    assert promtool("check", "rules", str(rules)).returncode == 0
