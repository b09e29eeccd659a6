"""The committed CRD is generated from the API models, structural and documented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from spyre_operator.gen.crd import build_crd, render_crd

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "serving.spyre.dev_spyremodels.yaml"
CHART_CRD = ROOT / "charts" / "spyre-model-operator" / "files" / "crd-spyremodels.yaml"


def test_committed_crd_matches_models() -> None:
    assert CRD_FILE.read_text() == render_crd(), "CRD drifted from the API models: run `make crds`"


def test_chart_crd_is_the_same_bytes() -> None:
    if not CHART_CRD.exists():
        pytest.skip("chart not present yet")
    assert CHART_CRD.read_text() == CRD_FILE.read_text(), "chart CRD differs: run `make crds`"


def _walk(node: dict[str, Any], path: str):  # type: ignore[no-untyped-def]
    yield path, node
    for k, v in (node.get("properties") or {}).items():
        yield from _walk(v, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_schema_is_structural() -> None:
    for path, node in _walk(_schema(), "$"):
        assert "$ref" not in node and "title" not in node, path
        typed = "type" in node or node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        assert typed, f"{path} has no type"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string"), f"{path}: anyOf only for int-or-string"


def test_exclusive_bounds_are_openapi_v3_0_booleans() -> None:
    """The API server rejects JSON Schema 2020-12's numeric exclusiveMinimum (it did, for
    spec.autoscaling's targets)."""
    seen = 0
    for path, node in _walk(_schema(), "$"):
        for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if flag in node:
                seen += 1
                assert node[flag] is True and bound in node, path
    assert seen, "no exclusive bound left to check"


def test_every_spec_and_status_field_is_described() -> None:
    root = _schema()
    for top in ("spec", "status"):
        for path, node in _walk(root["properties"][top], top):
            if path.endswith("[]") or path.endswith("{}"):
                continue  # list items and map values are not fields
            assert node.get("description"), f"{path} lacks a description"


def test_defaults_are_in_the_schema() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["replicas"]["default"] == 1
    assert spec["task"]["default"] == "generate"
    assert spec["compile"]["default"] == {}
    c = spec["compile"]["properties"]
    # the shape has no fixed default: omitted fields come from the plugin's supported list
    for field in ("tensorParallelSize", "maxModelLen", "maxNumSeqs", "warmupShapes"):
        assert "default" not in c[field], field
    assert c["maxNumBatchedTokens"]["default"] == 1024
    assert c["backend"]["default"] == "sendnn"
    assert spec["serving"]["properties"]["port"]["default"] == 8000
    assert spec["serving"]["properties"]["prefixCaching"]["default"] is True
    # the per-site fields have none: they follow the operator's defaults (test_site_defaults)
    acc = spec["accelerator"]["properties"]
    assert "default" not in acc["resourceName"] and "default" not in acc["schedulerName"]


def test_subresources_and_columns() -> None:
    version = build_crd()["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    for col in ("Ready", "Reason", "Artifact", "Replicas", "Age"):
        assert col in names


def test_yaml_round_trips() -> None:
    assert yaml.safe_load(CRD_FILE.read_text()) == build_crd()
