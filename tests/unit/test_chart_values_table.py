"""The chart README's values table names every value of values.yaml, and nothing else (issue
47, 6: the table had missed five keys; a value added without its row fails here).

A row's first cell names keys in backticks: a full path (``image.repository``), or ``.name``
for a sibling of the previous full path (``serviceAccount.create``, ``.name``), or a
``/ .x`` alternative. A value is documented when its path or one of its parents is named (a
row for ``resources`` covers ``resources.limits.memory``). A named key values.yaml does not
have is a stale row.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "spyre-model-operator"


def _leaves(doc: Any, prefix: str = "") -> set[str]:
    if isinstance(doc, dict) and doc:
        out: set[str] = set()
        for k, v in doc.items():
            out |= _leaves(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]}


def _all_paths(doc: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add(f"{prefix}{k}")
            out |= _all_paths(v, f"{prefix}{k}.")
    return out


def _named() -> set[str]:
    text = (CHART / "README.md").read_text()
    section = text.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        parent = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if name.startswith("."):
                name = parent + name[1:]
            else:
                parent = name.rsplit(".", 1)[0] + "." if "." in name else ""
            named.add(name)
    return named


def test_every_value_has_a_row() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    named = _named()
    missing = sorted(leaf for leaf in _leaves(values)
                     if not any(leaf == n or leaf.startswith(n + ".") for n in named))
    assert not missing, f"values.yaml keys with no row in the chart README's table: {missing}"


def test_every_row_names_a_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    stale = sorted(_named() - _all_paths(values))
    assert not stale, f"the chart README's values table names keys values.yaml lacks: {stale}"
