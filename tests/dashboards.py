"""The chart's Grafana dashboards: their PromQL queries and the metric names they read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD_DIR = ROOT / "charts" / "spyre-model-operator" / "dashboards"

#: The operator's own series (its /metrics, not the engine's): the replicas panel, the model
#: conditions and the operator row read them.
OPERATOR_PREFIX = "spyre_operator_"


def is_operator_metric(name: str) -> bool:
    return name.startswith(OPERATOR_PREFIX)

#: PromQL words that look like metric names but are not.
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"})


def dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard shipped in the chart, by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def queries(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression: panel targets and template-variable queries."""
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield str(target["expr"])
    for var in dashboard.get("templating", {}).get("list", []):
        q = var.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if var.get("type") == "query" and q:
            yield str(q)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana label_values() query) reads."""
    e = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)  # Grafana variables
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', e)  # label values
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\blabel_values\(\s*([^,()]+?)\s*(,[^)]*)?\)", r"\1", e)  # Grafana's
    names = set()
    for m in re.finditer(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?", e):
        if m.group(2) is None and m.group(1) not in _KEYWORDS:
            names.add(m.group(1))
    return names


def substitute(expr: str, variables: dict[str, str]) -> str:
    """``expr`` with Grafana's variables (``$namespace``, ``$__rate_interval``, ...) replaced
    as Grafana sends the query (longest name first: ``$model`` is not a prefix match)."""
    for k in sorted(variables, key=len, reverse=True):
        expr = expr.replace(k, variables[k])
    return expr


def dashboard_metrics() -> set[str]:
    """Every metric name any shipped dashboard reads."""
    return {n for d in dashboards().values() for q in queries(d) for n in metric_names(q)}


def exposed_names(metrics_text: str) -> set[str]:
    """Sample names in a Prometheus text exposition (histograms as _bucket/_sum/_count)."""
    out = set()
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            out.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return out
