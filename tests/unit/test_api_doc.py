"""docs/api.md is the field reference generated from the API models (issue 47, 6): a field
added, renamed or redescribed in operator/spyre_operator/api/ without ``make crds`` fails here."""

from __future__ import annotations

import re
from pathlib import Path

from spyre_operator.gen.apidoc import render_api_doc
from spyre_operator.gen.crd import build_crd

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_api_reference_is_generated_from_the_models() -> None:
    assert DOC.read_text() == render_api_doc(), "docs/api.md is stale: run `make crds`"


def _leaves(node: dict, path: str) -> set[str]:
    out = set()
    for name, child in (node.get("properties") or {}).items():
        out.add(f"{path}.{name}")
        for inner, suffix in ((child, ""), (child.get("items") or {}, "[]"),
                              (child.get("additionalProperties") or {}, "{}")):  # fmt: skip
            if isinstance(inner, dict) and inner.get("properties"):
                out |= _leaves(inner, f"{path}.{name}{suffix}")
    return out


def test_every_field_of_the_crd_has_a_row() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = (_leaves(schema["properties"]["spec"], "spec")
              | _leaves(schema["properties"]["status"], "status"))
    rows = set(re.findall(r"^\| `([^`]+)` \|", render_api_doc(), re.M))
    assert fields and fields == rows, (sorted(fields - rows), sorted(rows - fields))
