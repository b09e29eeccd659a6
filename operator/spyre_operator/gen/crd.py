"""Generate the SpyreModel CustomResourceDefinition from the pydantic API models.

The API server needs a *structural* schema: every node typed, no ``$ref``, no ``title``,
optional fields simply omitted (not ``anyOf [X, null]``), defaults in place so the API server
applies them. pydantic's JSON schema is close; this module closes the gap. The committed YAML
in ``crds/`` must equal :func:`render_crd` (a test enforces it; ``make crds`` regenerates).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema, to_jsonable_python

from .. import GROUP, KIND, PLURAL, VERSION
from ..api.v1alpha1 import MAX_MODEL_NAME, SpyreModelSpec, SpyreModelStatus, cel

CRD_NAME = f"{PLURAL}.{GROUP}"


class _KubeSchemaGenerator(GenerateJsonSchema):
    """pydantic schema generator that keeps ``default_factory`` defaults.

    A factory that builds a sub-model becomes ``default: {}`` so the API server fills the
    nested defaults itself; any other factory (e.g. a list) is rendered by value.
    """

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> dict[str, Any]:
        factory = schema.get("default_factory")
        if factory is None:
            return super().default_schema(schema)
        inner = self.generate_inner(schema["schema"])
        value = factory()  # type: ignore[call-arg]
        default = {} if isinstance(value, BaseModel) else to_jsonable_python(value, by_alias=True)
        return {**inner, "default": default}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref``s, collapse optional ``anyOf``, drop titles and ``default: null``."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        node = {**target, **node}  # the referring property's description wins
    any_of = node.get("anyOf")
    if isinstance(any_of, list) and any(a == {"type": "null"} for a in any_of):
        rest = [a for a in any_of if a != {"type": "null"}]
        node.pop("anyOf")
        if len(rest) == 1:
            node = {**rest[0], **node} if "$ref" not in rest[0] else {**node, **rest[0]}
            return _resolve(node, defs)
        node["anyOf"] = rest
    node.pop("title", None)
    if "default" in node and node["default"] is None:
        node.pop("default")
    # JSON Schema 2020-12 (pydantic) has numeric exclusive bounds; OpenAPI v3.0 (the CRD
    # schema) has a number in minimum/maximum and a boolean flag.
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(node.get(flag), int | float) and not isinstance(node[flag], bool):
            node[bound] = node[flag]
            node[flag] = True
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "$defs"):
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "anyOf", "allOf", "oneOf"):
            out[key] = _resolve(value, defs)
        else:
            out[key] = value
    if "properties" in out:
        out.setdefault("type", "object")
    return out


def _strip_defaults(node: Any) -> Any:
    """Status is written by the operator only: no defaults there."""
    if isinstance(node, list):
        return [_strip_defaults(n) for n in node]
    if isinstance(node, dict):
        return {k: _strip_defaults(v) for k, v in node.items() if k != "default"}
    return node


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one pydantic model."""
    raw = model.model_json_schema(by_alias=True, schema_generator=_KubeSchemaGenerator)
    defs = raw.pop("$defs", {})
    return _resolve(raw, defs)  # type: ignore[no-any-return]


def _condition_column(name: str, field: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="Ready")].{field}',
        "description": description,
    }


def build_crd() -> dict[str, Any]:
    """The SpyreModel CRD as a dict."""
    spec = model_schema(SpyreModelSpec)
    status = _strip_defaults(model_schema(SpyreModelStatus))
    schema = {
        "type": "object",
        "description": (
            "SpyreModel serves a model on IBM Spyre cards with vLLM: the operator compiles it "
            "once into a content-addressed artifact on a cache PVC, then runs inference pods "
            "that load that artifact and never compile."
        ),
        "required": ["spec"],
        # Only here can a rule see metadata.name (the API server allows name and generateName).
        "x-kubernetes-validations": [
            cel(
                f"size(self.metadata.name) <= {MAX_MODEL_NAME}",
                f"metadata.name may have at most {MAX_MODEL_NAME} characters: the operator "
                "names the SpyreModel's Events <name>.<16 hex digits>, and a name has at most 253",
            )
        ],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "spyre-model-operator"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["spym"],
                "categories": ["spyre"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        _condition_column("Ready", "status", "Ready condition status"),
                        _condition_column("Reason", "reason", "Ready condition reason"),
                        {
                            "name": "Artifact",
                            "type": "string",
                            "jsonPath": ".status.artifact.phase",
                            "description": "Phase of the artifact the spec needs",
                        },
                        {
                            "name": "Replicas",
                            "type": "integer",
                            "jsonPath": ".spec.replicas",
                            "description": "Desired serving replicas",
                        },
                        {
                            "name": "Available",
                            "type": "integer",
                            "jsonPath": ".status.readyReplicas",
                            "description": "Ready serving replicas",
                        },
                        {
                            "name": "Key",
                            "type": "string",
                            "jsonPath": ".status.artifact.key",
                            "priority": 1,
                            "description": "Artifact key",
                        },
                        {
                            "name": "Cache",
                            "type": "string",
                            "jsonPath": ".status.cache.usage",
                            "priority": 1,
                            "description": "Size of the artifacts this model keeps on its claim",
                        },
                        {
                            "name": "Endpoint",
                            "type": "string",
                            "jsonPath": ".status.endpoint",
                            "priority": 1,
                            "description": "In-cluster OpenAI base URL",
                        },
                        {
                            "name": "Age",
                            "type": "date",
                            "jsonPath": ".metadata.creationTimestamp",
                        },
                    ],
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD as YAML, byte-for-byte what ``crds/`` holds."""
    header = "# Generated from operator/spyre_operator/api by `spyre-operator crd`; do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
