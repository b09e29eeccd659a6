"""docs/reference.md's table of the operator's own metrics names every series /metrics serves,
and nothing else (issue 47, 6: a metric added without its row fails here).

The table's first cells name series in backticks, ``..._x`` for one that shares a prefix with
the full name before it (``spyre_operator_model_desired_replicas``, ``..._ready_replicas``).
What /metrics serves is read from the operator's own rendering, with a model in its cache so
the per-model gauges are there, and every family it declares (labelled counters with no
sample yet included)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.runtime import metrics

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def _served() -> set[str]:
    model = {"metadata": {"name": "m", "namespace": "ns", "uid": "u"}, "spec": {"replicas": 1},
             "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Serving"}],
                        "artifact": {"attempts": 1}}}  # fmt: skip
    c = Controller(client=None, caches=Caches({"models": {("ns", "m"): [model]}}))  # type: ignore[arg-type]
    text = metrics.render(c)
    out: set[str] = set()
    for fam in text_string_to_metric_families(text if isinstance(text, str) else text.decode()):
        if fam.name.endswith(_SUFFIXES):
            continue  # a histogram's creation time, which prometheus_client serves apart
        out.add(fam.name + ("_total" if fam.type == "counter" else ""))
        for s in fam.samples:
            if not s.name.endswith(_SUFFIXES):
                out.add(s.name)
    return out


def _documented(served: set[str]) -> tuple[set[str], list[str]]:
    """The table's names, expanded; and the ``...`` names no expansion resolves."""
    text = REFERENCE.read_text()
    table = text.split("**The operator's own metrics**", 1)[1].split("\n\n## ", 1)[0]
    named, unresolved = set(), []
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        full = ""
        for cell in re.findall(r"`([^`]+)`", line.split("|")[1]):
            name = cell.split("{", 1)[0]
            if not name.startswith("..."):
                full = name
                named.add(name)
                continue
            parts = full.split("_")
            candidates = ["_".join(parts[:i]) + name[3:] for i in range(len(parts) - 1, 1, -1)]
            found = [c for c in candidates if c in served]
            if found:
                named.add(found[0])
            else:
                unresolved.append(f"{name} (after {full})")
    return named, unresolved


def test_every_served_metric_has_a_row_and_every_row_is_served() -> None:
    served = _served()
    assert {"spyre_operator_model_condition", "spyre_operator_reconciles_total",
            "spyre_operator_writes_total"} <= served  # the reading sees every kind
    named, unresolved = _documented(served)
    assert not unresolved, f"docs/reference.md names metrics /metrics does not serve: {unresolved}"
    assert not served - named, (
        f"served by /metrics, missing from docs/reference.md's table: {sorted(served - named)}")
    assert not named - served, (
        f"in docs/reference.md's table, not served by /metrics: {sorted(named - served)}")
